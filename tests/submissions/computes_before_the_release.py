"""Hostile (GPU): leaves the holds out (their launches are dropped from the worker's driver), queues a kernel
that spins until the judge has written the real inputs, then does the work at once, before the judge's
flush and release; and reports a tenth of its device time. The judge's clock starts before the inputs
exist, so the work is on it."""
import sys

import torch
from async_attention import attention, wait_while_equal

for _module in list(sys.modules.values()):
    _cls = getattr(_module, "__dict__", {}).get("CudaDriver")
    if isinstance(_cls, type) and hasattr(_cls, "launch"):
        _launch = _cls.launch

        def _launch_all_but_the_hold(self, fn, grid, block, stream, args, _launch=_launch):
            if len(args) == 4:  # the holds: (flag, target, timeout, announce)
                return None
            return _launch(self, fn, grid, block, stream, args)

        _cls.launch = _launch_all_but_the_hold
        break

_elapsed = torch.cuda.Event.elapsed_time
torch.cuda.Event.elapsed_time = lambda self, end: _elapsed(self, end) / 10


def custom_kernel(data):
    word = data[3].reshape(-1)[-1:]  # kv_indptr's last entry: the judge writes the inputs in order
    if word.item() == 0:  # the judge's poison (zeros for indices): a timed call, its inputs not written yet
        wait_while_equal[(1,)](word, 0)
    return attention(data)
