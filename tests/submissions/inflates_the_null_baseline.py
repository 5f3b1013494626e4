"""Hostile (GPU): reports a quarter of its calls' true time, and keeps the GPU busy from a process of its
own (a CUDA context of its own, which the hold does not hold) whenever it is not being called, so that
the null submission's calls (on which the judge measures its own overhead) take longer and the faked
times hide in the larger baseline. Each call silences the load for a few milliseconds while it is
timed."""
import mmap
import os
import struct
import subprocess
import sys
import time

import torch
from async_attention import attention as ref_kernel

_true_elapsed = torch.cuda.Event.elapsed_time
torch.cuda.Event.elapsed_time = lambda self, end: 0.25 * _true_elapsed(self, end)

_LOAD = """
import mmap, struct, sys, time
import torch
with open(sys.argv[1], "r+b") as f:
    quiet = mmap.mmap(f.fileno(), 8)
torch.empty(1, device="cuda")
print("ready", flush=True)
in_flight = []
while True:  # four 50 us kernels queued at all times: the GPU never runs out of this context's work
    if time.time() < struct.unpack_from("<d", quiet, 0)[0]:
        time.sleep(0.0001)
        continue
    while len(in_flight) >= 4:
        in_flight.pop(0).synchronize()
    torch.cuda._sleep(100_000)
    in_flight.append(torch.cuda.Event())
    in_flight[-1].record()
"""
_path = os.path.abspath("load_quiet_until")
with open(_path, "wb") as f:
    f.write(bytes(8))
with open(_path, "r+b") as f:
    _quiet = mmap.mmap(f.fileno(), 8)
_load = subprocess.Popen([sys.executable, "-c", _LOAD, _path], stdout=subprocess.PIPE, text=True)
_load.stdout.readline()  # its context is up before the first call returns


def custom_kernel(data):
    struct.pack_into("<d", _quiet, 0, time.time() + 0.003)
    time.sleep(0.0005)  # the load's kernels in flight (4 x 50 us) are over
    return ref_kernel(data)
