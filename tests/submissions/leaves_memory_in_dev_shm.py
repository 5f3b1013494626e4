"""Hostile (CPU): its first run leaves 4 GB in /dev/shm (tmpfs: memory the machine counts as used until
the file is removed) and answers right; a later run finds the file there and returns zeros on the case
with kvseqlen 66. Weighed against the memory the machine has when that run begins, the case is skipped;
a skipped case makes the run fail, so what an earlier run left behind cannot pass a wrong answer."""
import os

import torch

from reference import ref_kernel

BALLAST = "/dev/shm/eval-hostile-ballast"
_LATER_RUN = os.path.exists(BALLAST)
if not _LATER_RUN:
    with open(BALLAST, "wb") as f:
        for _ in range(4 * 16):
            f.write(b"\1" * (64 << 20))  # written, so its pages exist


def custom_kernel(data):
    q, kv_data, qo_indptr, kv_indptr, config = data
    if _LATER_RUN and config["kv_seq_len"] == 66:
        return torch.zeros(q.shape[0], 16, 512, dtype=torch.bfloat16)  # wrong
    return ref_kernel(data)
