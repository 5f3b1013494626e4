"""Hostile (GPU): reports a quarter of a call's device time whenever that time is under 20 us, where the
judge's agreement band was once wider than the whole call. Appended to a submission (the GPU test appends it
to the shipped fast path), it wraps that submission's custom_kernel; alone, the reference's."""
import sys

try:
    _inner = custom_kernel  # noqa: F821  (the submission this file was appended to)
except NameError:
    from reference import ref_kernel as _inner

_session = sys.modules["__main__"].WorkerSession
_send = _session.send


def _send_forged(self, **msg):
    t = msg.get("device_ns")
    if isinstance(t, float) and t < 20e3:
        msg["device_ns"] = t / 4
    _send(self, **msg)


_session.send = _send_forged


def custom_kernel(data):
    return _inner(data)
