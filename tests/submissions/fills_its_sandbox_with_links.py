"""Hostile: fills its sandbox with 100,000 hard links to a few empty files (cheap to make, slow to
remove). A judge that removed the sandbox before its last result line held the report back for as long as
the removal took (13 s for a million links), past a runner's time limit if the submission kept at it; the
judge removes sandboxes after the last line."""
import os

from reference import ref_kernel

_done = []


def custom_kernel(data):
    if not _done:
        _done.append(1)
        os.makedirs("links")
        for i in range(100_000):
            if i % 50_000 == 0:  # a file system allows tens of thousands of links to one file
                source = os.path.join("links", f"f{i}")
                open(source, "w").close()
            os.link(source, os.path.join("links", str(i)))
    return ref_kernel(data)
