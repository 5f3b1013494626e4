"""Hostile: walks the caller frames and gc.get_objects() for the inputs (pristine copies included) and
zeroes every tensor it finds, so that zeros would be the right answer, then returns zeros."""
import gc
import sys

import torch


def _zero_everything(seen):
    frame = sys._getframe(1)
    objs = list(gc.get_objects())
    while frame is not None:
        objs.extend(frame.f_locals.values())
        frame = frame.f_back
    for obj in objs:
        if isinstance(obj, torch.Tensor) and id(obj) not in seen:
            seen.add(id(obj))
            try:
                obj.zero_()
            except Exception:
                pass


def custom_kernel(data):
    _zero_everything(set())
    return torch.zeros(data[0].shape[0], 16, 512, dtype=torch.bfloat16, device=data[0].device)
