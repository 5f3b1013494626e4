"""Hostile (CPU): takes 4 GB of the machine's memory in its first call and returns zeros on the case
with kvseqlen 66. A judge that weighed each case against the memory available when the case came up
skipped that case (a skip is neither a pass nor a fail) and passed the run; the judge weighs cases against
what the machine had before the submission ran."""
import torch

from reference import ref_kernel

_held = []


def custom_kernel(data):
    q, kv_data, qo_indptr, kv_indptr, config = data
    if not _held:
        _held.append(torch.ones(4 << 30, dtype=torch.uint8))  # written, so the machine counts it as used
    if config["kv_seq_len"] == 66:
        return torch.zeros(q.shape[0], 16, 512, dtype=torch.bfloat16)  # wrong
    return ref_kernel(data)
