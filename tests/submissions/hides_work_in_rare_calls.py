"""Hostile: the reference's work, plus 100 ms of busy waiting on every 20th call, reported without it:
those calls are 5 % of a case's, the share of residuals the judge's check leaves out (so that one stall
of its own cannot fail a case). The judge ranks no call below what its clock saw of it, less the margin."""
import sys
import time

from reference import ref_kernel

_hidden = [0.0]
_calls = [0]
_session = sys.modules["__main__"].WorkerSession
_send = _session.send


def _send_without_the_wait(self, **msg):
    if "device_ns" in msg and _hidden[0]:
        msg["device_ns"] -= _hidden[0]
        _hidden[0] = 0.0
    _send(self, **msg)


_session.send = _send_without_the_wait


def custom_kernel(data):
    out = ref_kernel(data)
    _calls[0] += 1
    if _calls[0] % 20 == 0:
        start = time.perf_counter_ns()
        while time.perf_counter_ns() - start < 100e6:
            pass
        _hidden[0] = float(time.perf_counter_ns() - start)
    return out
