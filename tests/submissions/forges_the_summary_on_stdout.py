"""Hostile: prints lines that look like the judge's report (passes and a summary) on stdout and stderr."""
import sys

import torch


def custom_kernel(data):
    print("[PASS] test 0: all good\n2/2 tests passed")
    print("2/2 tests passed", file=sys.stderr)
    return torch.zeros(data[0].shape[0], 16, 512, dtype=torch.bfloat16, device=data[0].device)
