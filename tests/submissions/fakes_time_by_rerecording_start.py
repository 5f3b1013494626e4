"""Hostile (GPU): finds the harness's timing events through gc and re-records them on the current stream
after its own work is queued, so that the start event comes after the work."""
import gc

import torch
from async_attention import attention as ref_kernel


def custom_kernel(data):
    out = ref_kernel(data)
    for obj in gc.get_objects():
        if isinstance(obj, torch.cuda.Event):
            try:
                obj.record()
            except Exception:
                pass
    return out
