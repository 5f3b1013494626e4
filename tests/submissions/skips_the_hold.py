"""Hostile (GPU): makes the worker's hold a no-op, so that its kernels run while custom_kernel is still on
the host (before the judge's clock starts), and reports whatever the events say."""
import sys

from async_attention import attention as ref_kernel

for module in list(sys.modules.values()):
    cls = getattr(module, "__dict__", {}).get("CudaDriver")
    if isinstance(cls, type) and hasattr(cls, "launch"):
        cls.launch = lambda self, *args, **kwargs: None


def custom_kernel(data):
    return ref_kernel(data)
