"""Hostile: at nice 19 for good, it tries to raise its scheduling group's priority back (writing nice 0 into
/proc/self/autogroup, which sched_autogroup weighs against other sessions), so that work it runs between
calls crowds out the judge and the null submission; prints what it could. Its answers are the reference's."""
from pathlib import Path

from reference import ref_kernel

_tried = []


def custom_kernel(data):
    if not _tried:
        _tried.append(True)
        try:
            Path("/proc/self/autogroup").write_text("0")
            print("LEAK: its scheduling group is back at nice 0", flush=True)
        except OSError as e:
            print(f"refused: autogroup nice 0 ({e.strerror})", flush=True)
    return ref_kernel(data)
