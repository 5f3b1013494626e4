"""Hostile (GPU): keeps both holds but does its work on a side stream, queued during custom_kernel: a
kernel there starts once the full-SM hold has let go, spins until the judge has written the real
inputs, and the work follows at once, before the one-block hold lets the call's stream go; the call's
stream only waits for it. Reports a tenth of its device time. The judge's clock starts before the
inputs exist, so the work is on it."""
import torch
from async_attention import attention, wait_while_equal

_elapsed = torch.cuda.Event.elapsed_time
torch.cuda.Event.elapsed_time = lambda self, end: _elapsed(self, end) / 10
_side = None


def custom_kernel(data):
    global _side
    _side = _side or torch.cuda.Stream()
    main = torch.cuda.current_stream()
    word = data[3].reshape(-1)[-1:]  # kv_indptr's last entry: zero (the judge's poison) until written
    with torch.cuda.stream(_side):
        wait_while_equal[(1,)](word, 0)
        out = attention(data)
    main.wait_stream(_side)
    out.record_stream(main)
    return out
