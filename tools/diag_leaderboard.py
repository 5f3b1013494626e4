"""Why are leaderboard-mode times higher than benchmark-mode times? Times custom_kernel the way
eval.py does (L2 flush, CUDA events) under several input patterns and reports the median
GPU-event time, the host wall time of the call, and the host time of its pieces:
  same    - one input reused (benchmark mode)
  fresh   - new inputs before every call (generate + clone), no check
  check   - as fresh, plus the check of each output (leaderboard mode)
  gc_off  - as check, with gc.collect() before and the garbage collector off during the call
  prewarm - as check, plus one untimed custom_kernel call on the fresh input first
Run on the GPU: python tools/diag_leaderboard.py"""
import gc
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import reference  # noqa: E402
import submission as sub  # noqa: E402
import utils  # noqa: E402

flush = utils.L2Flush()


def pieces(x):
    """Host microseconds of the parts of the fast path, on input x."""
    q, kv, qo, kvp, cfg = x
    plan = sub.plan_for(cfg["batch_size"], cfg["kv_seq_len"], cfg["q_seq_len"])
    t = [time.perf_counter_ns()]
    sub._fast_path_problem(q, kv, qo, kvp, cfg, plan[0])
    t.append(time.perf_counter_ns())
    torch.empty((q.shape[0], 16, 512), dtype=torch.bfloat16, device=q.device)
    t.append(time.perf_counter_ns())
    base = kv[plan[0]][0] if plan[0] != "bf16" else kv["bf16"]
    sub.TensorDescriptor(base, [base.shape[0], base.shape[-1]], [base.shape[-1], 1], [plan[1], 64])
    t.append(time.perf_counter_ns())
    return [(b - a) / 1e3 for a, b in zip(t, t[1:])]


def timed(x, gc_off=False):
    torch.cuda.synchronize()
    if gc_off:
        gc.collect()
        gc.disable()
    flush()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    t0 = time.perf_counter_ns()
    out = sub.custom_kernel(x)
    host = time.perf_counter_ns() - t0
    e.record()
    if gc_off:
        gc.enable()
    torch.cuda.synchronize()
    return out, s.elapsed_time(e) * 1e3, host / 1e3


def run(spec, pattern, n=30):
    data = reference.generate_input(**spec)
    x = utils.clone_data(data)
    for _ in range(3):
        sub.custom_kernel(x)
    rows = []
    for i in range(n):
        if pattern != "same":
            data = reference.generate_input(**{**spec, "seed": spec["seed"] + 13 * (i + 1)})
            x = utils.clone_data(data)
        if pattern == "prewarm":
            sub.custom_kernel(x)
        parts = pieces(x)
        out, g, h = timed(x, gc_off=pattern == "gc_off")
        if pattern != "same" and pattern != "fresh":
            assert reference.check_implementation(data, out)[0]
        rows.append([g, h] + parts)
    return [statistics.median(c) for c in zip(*rows)]


if __name__ == "__main__":
    print(f"{'shape':10s} {'pattern':8s} {'gpu us':>8s} {'host us':>8s} {'checks':>7s} {'empty':>7s} {'desc':>7s}")
    for spec in (dict(batchsize=4, qseqlen=1, kvseqlen=1024, seed=1), dict(batchsize=256, qseqlen=1, kvseqlen=8192, seed=2)):
        for pattern in ("same", "fresh", "check", "gc_off", "prewarm"):
            r = run(spec, pattern)
            shape = f"{spec['batchsize']}x{spec['kvseqlen']}"
            print(f"{shape:10s} {pattern:8s} " + " ".join(f"{v:8.1f}" for v in r), flush=True)
