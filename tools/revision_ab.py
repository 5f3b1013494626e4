"""Interleaved A/B of GPU time: another version of the root submission against the working tree's, on
the benchmark shapes (or some of them), each through the route custom_kernel would build. Prints each
side's rel L2 against exact attention over the fp8 cache, then median GPU times (queued_gpu_us: L2
flushed, the whole call queued before the GPU reaches it, so no host time).

    git show HEAD:submission.py > tools/base_submission.py    # git-ignored: carry it to the device
    python tools/revision_ab.py --base tools/base_submission.py [--shapes "32x8192 256x8192"] [--reps 7]

(The base is a file, not a git revision: the device machine's copy of the repository has the working
tree but not this clone's history.)
"""
import argparse
import importlib.util
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from problem_loader import load, print_case_table, queued_gpu_us  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the submission.py to compare against (a file)")
    ap.add_argument("--shapes", default=None, help="only these benchmark shapes, e.g. '32x8192 256x8192'")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    p = load(".")
    import torch
    R, new = p.reference, p.submission
    spec = importlib.util.spec_from_file_location("base_submission", args.base)
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    wanted = {tuple(int(x) for x in s.split("x")) for s in args.shapes.split()} if args.shapes else None
    flush = p.utils.L2Flush()
    rows = []
    for case in p.cases:
        a = case.args
        if wanted and (a["batchsize"], a["kvseqlen"]) not in wanted:
            continue
        data = R.generate_input(**a)
        q, kv_data, qo, kvp, cfg = data
        ref = R.exact_attention(q, R.dequantize_cache(kv_data, "fp8"), qo, kvp, cfg["sm_scale"])
        calls, times = {}, {}
        for name, mod in (("base", base), ("new", new)):
            plan = mod.plan_for(cfg["batch_size"], cfg["kv_seq_len"], cfg["q_seq_len"])
            route, out = mod._make_route(q, kv_data, kvp, cfg, plan)
            torch.cuda.synchronize()
            calls[name] = (lambda r=route: r(q, kv_data, kvp)) if route else (lambda m=mod: m.custom_kernel(data))
            times[name] = []
            print(f"{case.spec[:50]:50s} {name:4s} {plan} rel L2 vs fp8 {R.compare(out, ref)['rel_l2']:.4f}",
                  flush=True)
        for _ in range(args.reps):
            for name in ("base", "new"):
                times[name].append(queued_gpu_us(calls[name], flush))
        rows.append((case.spec, statistics.median(times["base"]), statistics.median(times["new"])))
    print()
    print_case_table(["base us", "tree us"], rows)


if __name__ == "__main__":
    main()
