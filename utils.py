"""Helpers shared by eval.py and the problems: seeding, cloning inputs, the L2 flush."""
import random

import torch


def set_seed(seed: int = 42) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def clone_data(data):
    """Deep copy of nested tuples, lists and dicts with every tensor cloned."""
    if isinstance(data, tuple):
        return tuple(clone_data(x) for x in data)
    if isinstance(data, list):
        return [clone_data(x) for x in data]
    if isinstance(data, dict):
        return {k: clone_data(v) for k, v in data.items()}
    if isinstance(data, torch.Tensor):
        return data.clone()
    return data


class L2Flush:
    """Evicts the device's L2 and leaves it clean: a read of a buffer twice the L2's size (allocated
    once). A read rather than a write, so that what the flush leaves behind are clean lines of its own
    buffer: the next call's misses evict them without writing anything back, and any dirty lines from
    before (inputs just written, say) are written back during the flush, not during the next call."""

    def __init__(self, device=None):
        self.device = torch.device(device or "cuda")
        l2_bytes = getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 0) or (64 << 20)
        self.buffer = torch.full((2 * l2_bytes // 4,), 0x5A5A5A5A, dtype=torch.int32, device=self.device)
        self._sink = torch.empty((), dtype=torch.int64, device=self.device)

    def __call__(self) -> None:
        torch.sum(self.buffer, 0, dtype=torch.int64, out=self._sink)
