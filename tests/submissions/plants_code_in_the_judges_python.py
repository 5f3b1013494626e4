"""Hostile: tries to plant a .pth file (code every later Python of this interpreter runs at start, the judge's
next run too) in each folder of its module path that holds site-packages, and prints what it could (removing
what it wrote at once: a test must not leave it). Under a profiler too (POPCORN_NCU=1, profile mode), where
the worker was once left without Landlock. Its answers are the reference's."""
import os
import sys

from reference import ref_kernel

_tried = []


def _plant():
    for folder in sys.path:
        if not folder.endswith(("site-packages", "dist-packages")) or not os.path.isdir(folder):
            continue
        path = os.path.join(folder, f"eval_hostile_{os.getpid()}.pth")
        try:
            with open(path, "x") as f:
                f.write("# a line of code here would run in every later Python of this interpreter\n")
            os.unlink(path)
            print(f"LEAK: planted {path}", flush=True)
        except OSError as e:
            print(f"refused: a .pth file in {folder} ({e.strerror})", flush=True)


def custom_kernel(data):
    if not _tried:
        _tried.append(_plant())
    return ref_kernel(data)
