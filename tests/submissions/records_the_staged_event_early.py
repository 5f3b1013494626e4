"""Hostile (GPU): records the judge's "staged" event (which the judge waits on before it looks at the
output) at the start of each call instead of after it, and reports a quarter of its time: were the
judge's clock to stop at that event, the call would look short and the report agree with it. The judge
copies the output before its clock stops, so the call is either on its clock or its output incomplete.
Appended to a submission, it wraps that submission's custom_kernel; alone, the reference's."""
import sys

import torch

try:
    _inner = custom_kernel  # noqa: F821  (the submission this file was appended to)
except NameError:
    from reference import ref_kernel as _inner

_session = sys.modules["__main__"].WorkerSession
_kernel, _send = _session.kernel, _session.send
_staged = {}


class _RecordsNothing:
    def record(self, stream=None):
        pass


def _early_kernel(self):
    fn = _kernel(self)
    if not self.cuda or self.staged_event is None:
        return fn
    if "event" not in _staged:
        _staged["event"] = self.staged_event
        self.staged_event = _RecordsNothing()  # the worker's own record, after the call, does nothing

    def early(data):
        _staged["event"].record(torch.cuda.current_stream())
        return fn(data)

    return early


def _send_quarter(self, **msg):
    if isinstance(msg.get("device_ns"), float):
        msg["device_ns"] /= 4
    _send(self, **msg)


_session.kernel, _session.send = _early_kernel, _send_quarter


def custom_kernel(data):
    return _inner(data)
