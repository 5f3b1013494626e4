"""Hostile (GPU): does the work on a side stream that the current stream never waits for (so the end
event, on the current stream, excludes it), and patches the worker's output staging to wait for that
stream, so that the output is right. """
import sys

import torch
from async_attention import attention

_side = []
for module in list(sys.modules.values()):
    cls = getattr(module, "__dict__", {}).get("WorkerSession")
    if isinstance(cls, type) and hasattr(cls, "_stage"):
        _stage = cls._stage

        def stage(self, out):
            if _side:
                torch.cuda.current_stream().wait_stream(_side[0])
            return _stage(self, out)

        cls._stage = stage
        break


def custom_kernel(data):
    q, kv_data, qo_indptr, kv_indptr, config = data
    if not _side:
        _side.append(torch.cuda.Stream())
    side = _side[0]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000)  # the hidden work, about a millisecond
        out = attention(data)
    out.record_stream(side)
    return out
