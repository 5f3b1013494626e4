"""Hostile: rebinds every check, checker and timing function it can reach through sys.modules (the
worker's own module included) to pass, then returns zeros."""
import sys

import torch


def _passes(*args, **kwargs):
    return True, "patched"


for module in list(sys.modules.values()):
    for name in ("check_implementation", "verify_times", "calculate_stats", "compare"):
        if hasattr(module, name):
            try:
                setattr(module, name, _passes)
            except Exception:
                pass
    if hasattr(module, "make_checker"):
        try:
            module.make_checker = lambda data: _passes
        except Exception:
            pass
    for cls_name in ("Judge", "WorkerSession", "_Job"):
        cls = getattr(module, cls_name, None)
        if isinstance(cls, type) and hasattr(cls, "check"):
            cls.check = lambda self, *a, **k: (True, "patched")


def custom_kernel(data):
    return torch.zeros(data[0].shape[0], 16, 512, dtype=torch.bfloat16, device=data[0].device)
