"""Hostile (GPU): takes 3 us off every report, less than the judge's band on any call: what the judge's
clock cannot see. Its gain is bounded by the band (docs/judge.md states it per case). Appended to a
submission, it wraps that submission's custom_kernel; alone, the reference's."""
import sys

try:
    _inner = custom_kernel  # noqa: F821  (the submission this file was appended to)
except NameError:
    from reference import ref_kernel as _inner

SHAVE_NS = 3e3
_session = sys.modules["__main__"].WorkerSession
_send = _session.send


def _send_shaved(self, **msg):
    t = msg.get("device_ns")
    if isinstance(t, float) and t > SHAVE_NS:
        msg["device_ns"] = t - SHAVE_NS
    _send(self, **msg)


_session.send = _send_shaved


def custom_kernel(data):
    return _inner(data)
