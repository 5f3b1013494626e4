"""Hostile (CPU): a thread notices that its process was stopped (a gap in its own clock: the judge stops
it for each call of the null submission) and, once resumed, fills its stdout pipe (raised to 1 MiB) with
empty lines, which the judge's relay thread, in the judge's process, drains one by one: work of the
judge's own that would compete with the next null calls and inflate the baseline that CPU times are
ranked against. Answers right. The judge pauses relaying while the null is timed."""
import fcntl
import os
import threading
import time

from reference import ref_kernel

F_SETPIPE_SZ, F_GETPIPE_SZ = 1031, 1032
_calls = [0]


def _watch():
    last = time.monotonic()
    while True:
        time.sleep(0.0005)
        now = time.monotonic()
        if now - last > 0.003 and _calls[0] >= 4:  # resumed after a null call
            try:
                fcntl.fcntl(1, F_SETPIPE_SZ, 1 << 20)
            except OSError:
                pass
            os.write(1, b"\n" * fcntl.fcntl(1, F_GETPIPE_SZ))
            return
        last = now


threading.Thread(target=_watch, daemon=True).start()


def custom_kernel(data):
    _calls[0] += 1
    return ref_kernel(data)
