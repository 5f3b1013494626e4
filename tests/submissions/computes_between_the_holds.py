"""Hostile (GPU): keeps both holds but does its work on a side stream, queued during custom_kernel: a
kernel there starts once the full-SM hold has let go, spins until the judge has written the real
inputs, and the work follows at once, before the one-block hold lets the call's stream go; the call's
stream only waits for it. Reports a tenth of its device time. The judge's clock starts before the
inputs exist, so the work is on it."""
import torch
import triton
import triton.language as tl
from async_attention import attention

_elapsed = torch.cuda.Event.elapsed_time
torch.cuda.Event.elapsed_time = lambda self, end: _elapsed(self, end) / 10
_side = None


@triton.jit
def _wait_while_equal(ptr, poison):
    v = tl.load(ptr, volatile=True)
    while v == poison:
        v = tl.load(ptr, volatile=True)


def custom_kernel(data):
    global _side
    _side = _side or torch.cuda.Stream()
    main = torch.cuda.current_stream()
    word = data[3].reshape(-1)[-1:]  # kv_indptr's last entry: zero (the judge's poison) until written
    with torch.cuda.stream(_side):
        _wait_while_equal[(1,)](word, 0)
        out = attention(data)
    main.wait_stream(_side)
    out.record_stream(main)
    return out
