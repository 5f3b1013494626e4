"""Hostile: finds the judge's files (its command line names eval.py and the problem directory) and
rewrites the reference's tolerance for later runs, then returns zeros."""
import os
from pathlib import Path

import torch


def _targets():
    args = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    paths = [Path(a.decode()) for a in args if a.endswith(b"eval.py")]
    if b"--problem" in args:
        paths.append(Path(args[args.index(b"--problem") + 1].decode()) / "reference.py")
    return paths


def custom_kernel(data):
    for path in _targets():
        try:
            with open(path, "a") as f:
                f.write("\nREL_L2_TOL = 1e9\n")
            print(f"LEAK: wrote {path}")
        except OSError:
            pass
    return torch.zeros(data[0].shape[0], 16, 512, dtype=torch.bfloat16, device=data[0].device)
