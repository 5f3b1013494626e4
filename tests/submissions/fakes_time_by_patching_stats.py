"""Hostile: rebinds calculate_stats, trimmed_mean and verify_times wherever it can reach them (a
function's __globals__ included). None of them runs in the submission's process: the run reports the
honest times."""
import inspect
import sys

from reference import ref_kernel

for module in list(sys.modules.values()):
    for name in ("calculate_stats", "trimmed_mean", "verify_times"):
        try:
            fn = getattr(module, name, None)
        except Exception:
            continue
        if inspect.isfunction(fn):
            fn.__globals__["calculate_stats"] = lambda durations: None
            fn.__globals__["trimmed_mean"] = lambda values, trim=0: 0.0
            fn.__globals__["verify_times"] = lambda calls, nulls, margin=0: ""


def custom_kernel(data):
    return ref_kernel(data)
