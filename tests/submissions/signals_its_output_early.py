"""Hostile (GPU): signals the judge that its output is staged (the call's number and the output's digest,
written into its release page) at the start of each call instead of after it, and reports a quarter of its
time: were the judge's clock to end at the GPU work that follows the signal, a call shorter than the GPU's
switch back to the judge's context would finish unseen inside it, and the report agree with the clock.
The judge reads the digest at the signal and holds the call to it: the digest of bytes not yet there.
Appended to a submission, it wraps that submission's custom_kernel; alone, the reference's."""
import sys

import torch

try:
    _inner = custom_kernel  # noqa: F821  (the submission this file was appended to)
except NameError:
    from reference import ref_kernel as _inner

_session = sys.modules["__main__"].WorkerSession
_kernel, _send, _signal = _session.kernel, _session.send, _session._signal_staged


def _early_kernel(self):
    fn = _kernel(self)
    if not self.cuda:
        return fn

    def early(data):
        _signal(self, self.seq, torch.cuda.current_stream())  # before the call: the digest of what is there now
        return fn(data)

    return early


def _send_quarter(self, **msg):
    if isinstance(msg.get("device_ns"), float):
        msg["device_ns"] /= 4
    _send(self, **msg)


_session.kernel, _session.send = _early_kernel, _send_quarter
_session._signal_staged = lambda self, seq, stream: None  # the worker's own signal, after the call, does nothing


def custom_kernel(data):
    return _inner(data)
