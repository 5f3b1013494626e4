"""Hostile: raises the reference's tolerance constants (read at call time), then returns zeros."""
import reference
import torch

reference.REL_L2_TOL = 1e9
reference.ATOL_RMS = 1e9
reference.RTOL = 1e9


def custom_kernel(data):
    return torch.zeros(data[0].shape[0], 16, 512, dtype=torch.bfloat16, device=data[0].device)
