"""Hostile: leaves in its sandbox a tree of directories deeper than shutil.rmtree's recursion can remove
(Python 3.11), so that the judge's clean-up, which runs before its last result line, would raise and end
the run with no verdict. Prints the sandbox's path; answers right."""
import os

from reference import ref_kernel

_done = []


def custom_kernel(data):
    if not _done:
        _done.append(1)
        print(f"SANDBOX {os.getcwd()}", flush=True)
        fd = os.open(".", os.O_RDONLY)
        for _ in range(3000):
            os.mkdir("d", dir_fd=fd)
            fd = os.open("d", os.O_RDONLY, dir_fd=fd)
    return ref_kernel(data)
