"""Hostile (CPU): reports a quarter of its calls' true time, and keeps two processes of its own spinning
whenever it is not being called (each tries a session of its own, where the scheduler would weigh it
apart from the worker's nice 19), so that the null submission's calls, on which the judge measures its
own overhead, take longer and the faked times hide in the larger baseline. Each call silences them
while it runs. The judge stops every process of the submission's for the null's calls."""
import mmap
import os
import signal
import sys
import time

from reference import ref_kernel

_path = os.path.abspath("spin-paused")
with open(_path, "wb") as f:
    f.write(bytes(8))
_paused = mmap.mmap(os.open(_path, os.O_RDWR), 8)


def _spinner():
    try:
        os.setsid()
    except OSError:
        pass
    while True:
        if _paused[0]:
            time.sleep(0.0001)


_spinners = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _spinner()
    _spinners.append(pid)

_session = sys.modules["__main__"].WorkerSession
_send = _session.send


def _send_a_quarter(self, **msg):
    if "device_ns" in msg and isinstance(msg["device_ns"], float):
        msg["device_ns"] *= 0.25
    _send(self, **msg)


_session.send = _send_a_quarter


def custom_kernel(data):
    _paused[0] = 1
    try:
        return ref_kernel(data)
    finally:
        _paused[0] = 0
