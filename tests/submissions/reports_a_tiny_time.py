"""Hostile: the reference's work, every timed call reported as taking 1 ns. Where a case's calls take less
than the judge's margin (2 ms on the CPU), the judge's clock cannot tell such a report from the truth;
on the CPU the judge ranks its own clock, so the report takes nothing off."""
import sys

from reference import ref_kernel

_session = sys.modules["__main__"].WorkerSession
_send = _session.send


def _send_tiny(self, **msg):
    if "device_ns" in msg:
        msg["device_ns"] = 1.0
    _send(self, **msg)


_session.send = _send_tiny


def custom_kernel(data):
    return ref_kernel(data)
