"""Offline tuning of submission.PLANS on the GPU (H200): for every benchmark shape, time
candidate plans (L2 flushed, as in bench_mla.py), reject any whose output is off (relative
L2 error > 0.02 against exact fp32 attention over the format read), and print the fastest as
a PLANS table to paste into submission.py. Writes every measurement to --log.

    python tools/tune_mla.py [--log tools/tune_mla_log.md]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mla import ROOT, SHAPES, rel_err, time_call  # noqa: E402

sys.path.insert(0, ROOT)
import reference as R  # noqa: E402
import submission as S  # noqa: E402

# (block_n, num_warps, trans): HMMA orientation with 8 warps, wgmma orientation with 4.
KERNELS = [(64, 8, 0), (32, 4, 0), (64, 4, 1)]
STAGES = (2, 3)


def candidates(batch, kv, qlen):
    programs = batch * qlen
    want = max(1, -(-2 * S.NUM_SMS // programs))
    splits = sorted({max(1, min(s, S.MAX_SPLITS, kv // 64)) for s in (want // 2, want, want * 2, 1)})
    for bn, warps, trans in KERNELS:
        for stages in STAGES:
            for sp in splits:
                yield ("mxfp4", bn, sp, warps, stages, trans)
    for fmt in ("fp8", "bf16"):  # other formats at one kernel config, for the record
        yield (fmt, 64, splits[len(splits) // 2], 8, 3, 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", default=os.path.join(ROOT, "tools", "tune_mla_log.md"))
    ap.add_argument("--reps", type=int, default=25)
    args = ap.parse_args()
    best = {}
    log = ["| batch | kv | plan | rel L2 | ms |", "|---|---|---|---|---|"]
    for batch, kv, qlen in SHAPES:
        data = R.generate_input(batch, qlen, kv, 99)
        q, kv_data, qo, kvp, cfg = data
        for plan in candidates(batch, kv, qlen):
            try:
                S._launch(q, kv_data, kvp, cfg, plan)  # compile (JIT path)
                out = S._launch(q, kv_data, kvp, cfg, plan)  # direct launch path
                torch.cuda.synchronize()
                err = rel_err(data, out, plan[0])
                ms = time_call(lambda: S._launch(q, kv_data, kvp, cfg, plan), args.reps) \
                    if err < 0.02 else float("inf")
            except Exception as e:  # a config that fails to compile is just skipped
                err, ms = float("nan"), float("inf")
                print("failed", plan, type(e).__name__, str(e)[:200], flush=True)
            log.append(f"| {batch} | {kv} | {plan} | {err:.4f} | {ms:.4f} |")
            print(log[-1], flush=True)
            if ms < best.get((batch, kv, qlen), (float("inf"),))[0]:
                best[(batch, kv, qlen)] = (ms, plan)
        del data
    with open(args.log, "w") as f:
        f.write("\n".join(log) + "\n")
    print("\nPLANS = {")
    print("    # (batch, kv_seq_len, q_seq_len): (fmt, block_n, splits, warps, stages, trans)  # ms")
    for key, (ms, plan) in best.items():
        print(f"    {key}: {plan},  # {ms:.4f}")
    print("}")
    try:  # which variants got TMA / wgmma, and their register use
        from bench_mla import sass_counts
        for name, c in sass_counts().items():
            print(name, c)
    except Exception as e:
        print("SASS count failed:", type(e).__name__, e)


if __name__ == "__main__":
    main()
