"""Hostile (GPU): patches torch.cuda.Event.record so that every event is recorded on an idle stream of
its own: the harness's start and end events then measure nothing."""
import torch
from async_attention import attention as ref_kernel

_record = torch.cuda.Event.record
_idle = []


def record(self, stream=None):
    if not _idle:
        _idle.append(torch.cuda.Stream())
    return _record(self, _idle[0])


torch.cuda.Event.record = record


def custom_kernel(data):
    return ref_kernel(data)
