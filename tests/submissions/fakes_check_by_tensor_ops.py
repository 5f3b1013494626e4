"""Hostile: patches the torch operations a check uses (out - ref, abs, norm, isnan, comparisons) so that
any output looks exact, then returns zeros."""
import torch

_zero = lambda *a, **k: torch.zeros((), device="cuda" if torch.cuda.is_available() else "cpu")
torch.Tensor.__sub__ = lambda a, b: torch.zeros_like(a, dtype=torch.float32)
torch.Tensor.__rsub__ = lambda a, b: torch.zeros_like(a, dtype=torch.float32)
torch.Tensor.norm = _zero
torch.Tensor.__gt__ = lambda a, b: torch.zeros_like(a, dtype=torch.bool)
torch.sub = lambda a, b, **k: torch.zeros_like(a, dtype=torch.float32)
torch.isnan = lambda t: torch.zeros_like(t, dtype=torch.bool)
torch.isinf = lambda t: torch.zeros_like(t, dtype=torch.bool)


def custom_kernel(data):
    return torch.zeros(data[0].shape[0], 16, 512, dtype=torch.bfloat16, device=data[0].device)
