"""Hostile (GPU): takes all but 64 MiB of the GPU's free memory when it is imported and keeps it, so that
the judge's own allocations for later cases (their inputs, its checks) fail. Its answers are honest: the
run must end with its report, the cases the judge could not run failed saying why."""
import torch
from async_attention import attention as ref_kernel

_free, _ = torch.cuda.mem_get_info()
_hoard = torch.empty(max(_free - (64 << 20), 0), dtype=torch.uint8, device="cuda")


def custom_kernel(data):
    return ref_kernel(data)
