"""Where a short MLA call's GPU time goes: kernel code fetched cold versus the work itself.

The harness's flush evicts the kernels' code from L2 as well as the data, so the first pass through
a large kernel fetches its instructions from HBM. For each (shape, plan) this prints the GPU time
with everything cold (as eval.py times it) and with the code warm (the same kernels run once on a
tiny input right after the flush; the timed call's data stays cold). On the H200 the two agree
(tools/device_logs/mla_fixed_cost_8a.log): the fixed cost is the kernels' own. Then a tile-count
sweep of one plan (splits = 1) gives its per-tile slope and fixed cost.

    python tools/fixed_cost.py [--reps 9]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from problem_loader import load, queued_gpu_us  # noqa: E402

CASES = [  # (batch, kv, plan)
    (4, 1024, ("bf16", 64, 16, 4, 2, 0)), (4, 1024, ("fp8", 64, 8, 4, 2, 2)),
    (4, 1024, ("fp8", 128, 8, 8, 3, 0)),
    (4, 8192, ("fp8", 128, 33, 8, 3, 0)), (4, 8192, ("fp8", 64, 33, 4, 2, 2)),
    (32, 1024, ("fp8", 128, 4, 8, 3, 0)), (32, 1024, ("fp8", 64, 4, 4, 2, 2)),
    (64, 1024, ("fp8", 128, 2, 8, 3, 0)), (64, 1024, ("fp8", 64, 4, 4, 2, 2)),
    (256, 1024, ("fp8", 64, 1, 4, 2, 2)),
]
SWEEP = [(b, kv, ("fp8", 64, 1, 4, 2, 2)) for b in (132, 264) for kv in (64, 128, 256, 512, 1024, 2048)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    p = load(".")
    import torch
    R, S = p.reference, p.submission
    flush = p.utils.L2Flush()
    rows = []
    for batch, kv, plan in CASES + SWEEP:
        data = R.generate_input(batch, 1, kv, 7)
        q, kv_data, qo, kvp, cfg = data
        tiny = R.generate_input(1, 1, 64, 8)
        route, _ = S._make_route(q, kv_data, kvp, cfg, plan)
        troute, _ = S._make_route(tiny[0], tiny[1], tiny[3], tiny[4], plan)
        torch.cuda.synchronize()
        call = lambda: route(q, kv_data, kvp)  # noqa: E731
        warm = lambda: troute(tiny[0], tiny[1], tiny[3])  # noqa: E731
        cold, hot = [], []
        for _ in range(args.reps):
            cold.append(queued_gpu_us(call, flush))
            hot.append(queued_gpu_us(call, flush, warm))
        rows.append((batch, kv, plan, statistics.median(cold), statistics.median(hot)))
        print(f"{batch:4d} x {kv:5d} {str(plan):32s} cold {rows[-1][3]:7.1f} us  code warm {rows[-1][4]:7.1f} us",
              flush=True)
        del data, route, troute
    print("\n| batch | kv | plan | cold us | code warm us |\n|---|---|---|---|---|")
    for b, kv, plan, c, h in rows:
        print(f"| {b} | {kv} | {plan} | {c:.1f} | {h:.1f} |")


if __name__ == "__main__":
    main()
