"""A stall both clocks see: the 50th call waits 3 ms on the GPU before its work (as a call does when another
context takes the GPU in its middle), and reports it honestly. The judge leaves the slowest 1 % of a
case's calls out of its statistics, so the case's mean moves by under 1 %. Appended to a submission, it
wraps that submission's custom_kernel; alone, the reference's (on the CPU, a 0.3 s wait on the host, some
hundred times a call there)."""
import time

import torch

try:
    _inner = custom_kernel  # noqa: F821  (the submission this file was appended to)
except NameError:
    from reference import ref_kernel as _inner

_calls = [0]


def custom_kernel(data):
    _calls[0] += 1
    if _calls[0] == 50:
        if torch.cuda.is_available():
            torch.cuda._sleep(6_000_000)  # ~3 ms at the H200's ~1.98 GHz
        else:
            time.sleep(0.3)
    return _inner(data)
