"""Hostile: after each call, truncates every shared-memory region it can reach (its open memfds, files
named like the regions in its sandbox), so that the judge's next write to the inputs or read of the
output would fault (SIGBUS) and take the judge down with no report. Its answers are the reference's."""
import os

from reference import ref_kernel


def _truncate_everything():
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:"):
                os.ftruncate(int(fd), 0)
        except OSError:
            pass
    for name in os.listdir("."):
        if name.startswith(("arena", "result")):
            try:
                os.truncate(name, 0)
            except OSError:
                pass


def custom_kernel(data):
    out = ref_kernel(data).clone()
    _truncate_everything()
    return out
