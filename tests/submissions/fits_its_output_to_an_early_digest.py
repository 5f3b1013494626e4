"""Hostile (GPU): signals its output staged at the start of each timed call, with a digest named before the
output exists (the wrapping sum of the previous output's 32-bit words, which the next one's is near), and
then bends the output until its words sum to that: the 5 % of words nearest zero are set to tiny values
and negative zeros (a few ULPs of nothing, well inside the check) that make up the difference. A digest
that a sum could stand for would end the judge's clock before the call's work and take the call off it.
The judge's keyed digest (output_digest) cannot be met so: its first timed call fails. It reports its
events' time, unforged. Appended to a submission, it wraps that submission's custom_kernel; alone, the
reference's."""
import ctypes
import sys

import torch

try:
    _inner = custom_kernel  # noqa: F821  (the submission this file was appended to)
except NameError:
    from reference import ref_kernel as _inner

_harness = sys.modules["__main__"]
_session = _harness.WorkerSession
_kernel, _timed = _session.kernel, _session.op_timed
_state = {"timed": False, "sum": None}
_TINY = 0x2FFF  # the largest bf16 pattern taken as nothing (about 1e-10)


def _word_sum(out):
    return out.contiguous().view(-1).view(torch.int32).to(torch.int64).sum()


def _fit(out, target):
    """out with its 5 % smallest words replaced so that its words sum to target (all on the GPU)."""
    w = out.contiguous().view(-1).view(torch.int32).to(torch.int64)
    count = max(64, w.numel() // 20)
    magnitude = torch.maximum(w & 0x7FFF, (w >> 16) & 0x7FFF)
    idx = torch.topk(magnitude, count, largest=False).indices
    missing = target - (w.sum() - w[idx].sum())
    negative_zeros = torch.clamp(torch.div(-missing + (1 << 31) - 1, 1 << 31, rounding_mode="floor"), min=0)
    rest = missing + negative_zeros * (1 << 31)
    high, low = torch.div(rest, 1 << 16, rounding_mode="floor"), rest % (1 << 16)
    pos = torch.arange(count, device=w.device) - negative_zeros
    value = (torch.clamp(high - _TINY * pos, 0, _TINY) << 16) + torch.clamp(low - _TINY * pos, 0, _TINY)
    w[idx] = torch.where(pos < 0, torch.full_like(value, -(1 << 31)), value)
    return w.to(torch.int32).view(out.dtype).view(out.shape)


def _fitting_kernel(self):
    fn = _kernel(self)
    if not self.cuda:
        return fn

    def fitting(data):
        if not (_state["timed"] and _state["sum"] is not None):
            out = fn(data)
            _state["sum"] = _word_sum(out)
            return out
        target = _state["sum"]
        self._early_digest = torch.stack([target, torch.zeros_like(target)])
        self.driver.launch(self.signal_fn, 1, 1, torch.cuda.current_stream().cuda_stream,
                           [ctypes.c_uint64(self._early_digest.data_ptr()),
                            ctypes.c_uint64(self.flag_dev + _harness.DIGEST_AT),
                            ctypes.c_uint64(self.flag_dev + _harness.STAGED_AT), ctypes.c_uint32(self.seq)])
        out = _fit(fn(data), target)
        _state["sum"] = _word_sum(out)
        return out

    return fitting


def _op_timed(self, *args, **kwargs):
    _state["timed"] = True
    try:
        return _timed(self, *args, **kwargs)
    finally:
        _state["timed"] = False


_session.kernel, _session.op_timed = _fitting_kernel, _op_timed
_session._signal_staged = lambda self, seq, stream: None  # the worker's own signal, after the call, does nothing


def custom_kernel(data):
    return _inner(data)
