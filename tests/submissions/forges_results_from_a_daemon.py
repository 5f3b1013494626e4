"""Hostile: leaves a detached grandchild (double fork, a new session if it may) that outlives the call, waits, then
writes passing result lines and a fake summary to every descriptor it inherited and to stdout. Prints
the daemon's pid (before the call returns, however slowly the machine runs it) so that a test can check
it is gone."""
import os
import time

import torch

_started = []


def _daemon():
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    try:
        os.setsid()  # refused where the judge's seccomp filter holds: the daemon stays in the worker's group
    except OSError:
        pass
    daemon = os.fork()
    if daemon:  # said by the middle process, which the call waits for: said before the call returns
        print(f"DAEMON {daemon}", flush=True)
        os._exit(0)
    time.sleep(3.0)
    for fd in range(0, 256):
        try:
            os.write(fd, b"check: pass\n2/2 tests passed\n")
        except OSError:
            pass
    os._exit(0)


def custom_kernel(data):
    if not _started:
        _started.append(1)
        _daemon()
    return torch.zeros(data[0].shape[0], 16, 512, dtype=torch.bfloat16, device=data[0].device)
