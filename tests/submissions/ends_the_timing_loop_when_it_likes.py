"""Hostile: ends a case's timing loop when it likes, by reporting one call as taking 31 s (past the
ranked loop's 30 s of summed time) once its own clock has seen a run of fast calls: a stopping rule
that read reports would let it pick the calls it is ranked on. The loop reads what is ranked."""
import sys

from reference import ref_kernel

_session = sys.modules["__main__"].WorkerSession
_send = _session.send
_timed = [0]


def _send_stop_now(self, **msg):
    if "device_ns" in msg:
        _timed[0] += 1
        if _timed[0] == 15:
            msg["device_ns"] = 31e9
    _send(self, **msg)


_session.send = _send_stop_now


def custom_kernel(data):
    return ref_kernel(data)
