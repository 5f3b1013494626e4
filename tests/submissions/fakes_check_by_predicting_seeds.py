"""Hostile: looks for the case's seed in the caller frames and gc, then, in its first (untimed) call,
precomputes the answers for the seeds an older harness used for ranked calls (seed + 13 k), and returns
them in order."""
import gc
import sys

import reference
import torch

_answers = []


def _find_seeds():
    seeds = set()
    frame = sys._getframe(2)
    dicts = [o for o in gc.get_objects() if isinstance(o, dict)]
    while frame is not None:
        dicts.append(frame.f_locals)
        frame = frame.f_back
    for d in dicts:
        try:
            seed = d.get("seed")
        except Exception:
            continue
        if isinstance(seed, int) and not isinstance(seed, bool):
            seeds.add(seed)
    return seeds


def custom_kernel(data):
    q, _, qo, kv, config = data
    if not _answers:
        shape = dict(batchsize=config["batch_size"], qseqlen=config["q_seq_len"], kvseqlen=config["kv_seq_len"])
        for seed in sorted(_find_seeds()) or [0]:
            for k in range(1, 40):
                _answers.append(reference.ref_kernel(reference.generate_input(seed=seed + 13 * k, **shape)))
        return reference.ref_kernel(data)
    return _answers.pop(0) if _answers else torch.zeros(q.shape[0], 16, 512, dtype=torch.bfloat16, device=q.device)
