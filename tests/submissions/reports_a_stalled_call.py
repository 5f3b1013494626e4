"""A stall the judge's clock does not see: every 37th call's report is 2.3 ms longer than the call (as one
call of kernelbot's did on the H200, its events inflated by something outside the GPU work). Honest
otherwise. The judge ranks such a call on its own clock, and the case's mean moves by under 1 %.
Appended to a submission, it wraps that submission's custom_kernel; alone, the reference's."""
import sys

try:
    _inner = custom_kernel  # noqa: F821  (the submission this file was appended to)
except NameError:
    from reference import ref_kernel as _inner

_session = sys.modules["__main__"].WorkerSession
_send = _session.send
_reports = [0]


def _send_stalled(self, **msg):
    if isinstance(msg.get("device_ns"), float):
        _reports[0] += 1
        if _reports[0] % 37 == 0:
            msg["device_ns"] += 2.3e6
    _send(self, **msg)


_session.send = _send_stalled


def custom_kernel(data):
    return _inner(data)
