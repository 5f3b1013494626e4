"""Hostile (GPU): leaves, in a process of its own, a stream waiting on a value that never comes (with a
kernel queued behind it). On the H200 such a stream kept every other context's work off the GPU: the
judge must neither hang nor let it pass for anything but what it is."""
import subprocess
import sys

from async_attention import attention as ref_kernel

_BLOCK = """
import ctypes, time
import torch
cuda = ctypes.CDLL("libcuda.so.1")
wait = getattr(cuda, "cuStreamWaitValue32_v2", None) or cuda.cuStreamWaitValue32
wait.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
never = torch.zeros(16, dtype=torch.int32, device="cuda")
stream = torch.cuda.Stream()
torch.cuda.synchronize()
wait(ctypes.c_void_p(stream.cuda_stream), never.data_ptr(), 1, 0x2)  # until (*never & 1) != 0
with torch.cuda.stream(stream):
    torch.cuda._sleep(1000)
print("blocked", flush=True)
time.sleep(3600)
"""
_child = None


def custom_kernel(data):
    global _child
    out = ref_kernel(data)
    if _child is None:
        _child = subprocess.Popen([sys.executable, "-c", _BLOCK], stdout=subprocess.PIPE, text=True)
        _child.stdout.readline()
    return out
