"""Hostile: tries to stop or kill the judge (its parent) and to ptrace it, then returns zeros."""
import ctypes
import os
import signal

import torch


def custom_kernel(data):
    ppid = os.getppid()
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        try:
            os.kill(ppid, sig)
            print(f"LEAK: sent {sig.name} to the judge")
        except OSError:
            pass
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(16, ppid, None, None) == 0:  # PTRACE_ATTACH
        print("LEAK: attached to the judge")
    return torch.zeros(data[0].shape[0], 16, 512, dtype=torch.bfloat16, device=data[0].device)
