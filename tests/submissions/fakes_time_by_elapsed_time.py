"""Hostile (GPU): rebinds torch.cuda.Event.elapsed_time so that every call reports 0.5 us."""
import torch
from async_attention import attention as ref_kernel

torch.cuda.Event.elapsed_time = lambda self, end: 0.0005


def custom_kernel(data):
    return ref_kernel(data)
