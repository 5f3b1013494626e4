"""Offline tuning of submission.PLANS on the GPU (H200): for every benchmark shape, time
candidate plans (L2 flushed, as in bench_mla.py), reject any whose output is off (relative
L2 error > 0.02 against exact fp32 attention over the format read), and print the fastest as
a PLANS table to paste into submission.py. Writes every measurement to --log.

    python tools/mla/tune_mla.py [--log results/tune_mla_log.md] [--write]

--write replaces the PLANS table in submission.py with the result (review the diff).
"""
import argparse
import os
import sys

import torch

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib")]
from bench_mla import ROOT, SHAPES, rel_err, time_call  # noqa: E402
from problem_loader import results_stamp  # noqa: E402

sys.path.insert(0, ROOT)
import reference as R  # noqa: E402
import submission as S  # noqa: E402

# (block_n, num_warps, kernel): the Triton kernel's HMMA orientation with 8 or 4 warps, its wgmma
# orientation with 4, and the Gluon kernel (fp8 only, in its one configuration).
# Configurations that do not fit (shared memory) fail to compile and are skipped.
KERNELS = [(64, 8, 0), (32, 4, 0), (64, 4, 1), (128, 8, 0), (64, 4, 0), (S.GLUON_BN, S.GLUON_WARPS, S.KERNEL_GLUON)]
STAGES = (2, 3)


def candidates(batch, kv, qlen):
    programs = batch * qlen
    want = max(1, -(-2 * S.NUM_SMS // programs))
    splits = sorted({max(1, min(s, S.MAX_SPLITS, kv // 64)) for s in (want // 2, want, want * 2, 1)})
    for fmt in ("mxfp4", "fp8", "bf16"):
        for bn, warps, kernel in KERNELS:
            if kernel == S.KERNEL_GLUON:
                if fmt == "fp8":
                    for sp in sorted(set(splits) | {max(1, 2 * S.NUM_SMS // programs)}):
                        yield (fmt, bn, sp, warps, S.GLUON_STAGES, kernel)
                continue
            for stages in STAGES:
                for sp in splits:
                    yield (fmt, bn, sp, warps, stages, kernel)


def around_plan(batch, kv, qlen):
    """The plan's kernel and the rule's other kernels, at 1/2, 1, 2 and 4 times the plan's splits."""
    plan = S.plan_for(batch, kv, qlen)
    splits = plan[2]
    counts = sorted({max(1, min(int(splits * f), S.MAX_SPLITS, kv // 64)) for f in (0.5, 1, 2, 4)})
    kernels = {(plan[0], plan[1], *plan[3:])} | set(S.RULE_KERNEL.values())  # (fmt, bn, warps, stages, kernel)
    for sp in counts:
        for fmt, bn, warps, stages, kernel in sorted(kernels):
            yield (fmt, bn, sp, warps, stages, kernel)


def write_plans(table):
    """Replace submission.py's PLANS = {...} block (up to its closing brace) with `table`."""
    path = os.path.join(ROOT, "submission.py")
    lines = open(path).read().split("\n")
    start = lines.index("PLANS = {")
    end = lines.index("}", start)
    lines[start:end + 1] = table
    with open(path, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {len(table) - 3} plans into {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", default=os.path.join(ROOT, "results", "tune_mla_log.md"))
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--write", action="store_true", help="write the table into submission.py")
    ap.add_argument("--kernels", default=None,
                    help="only these (block_n,warps,kernel) kernels, e.g. '64,4,0 128,8,0 64,4,2'")
    ap.add_argument("--around-plans", action="store_true",
                    help="only the current plan's kernel and the rule's kernels, at 1/2, 1, 2 and 4 times "
                         "the plan's splits (a quick re-tune after a kernel change)")
    ap.add_argument("--shapes", default=None, help="only these shapes, e.g. '4x1024 4x8192'")
    args = ap.parse_args()
    if args.shapes:
        wanted = {tuple(int(x) for x in sh.split("x")) for sh in args.shapes.split()}
        SHAPES[:] = [sh for sh in SHAPES if sh[:2] in wanted]
    if args.kernels:
        KERNELS[:] = [tuple(int(x) for x in k.split(",")) for k in args.kernels.split()]
    best = {}
    log = ["# MLA plan tuning", "", results_stamp("python tools/mla/tune_mla.py " + " ".join(sys.argv[1:])) +
           f". ms: median GPU time of {args.reps} calls (bench_mla.time_call: the judge's L2 flush before each, the "
           "call queued behind a hold); plan: Plan(fmt, block_n, splits, warps, stages, kernel), kernel 0 HMMA, "
           "1 wgmma, 2 Gluon", "", "| batch | kv | plan | rel L2 | ms |", "|---|---|---|---|---|"]
    for batch, kv, qlen in SHAPES:
        data = R.generate_input(batch, qlen, kv, 99)
        q, kv_data, qo, kvp, cfg = data
        for plan in (around_plan(batch, kv, qlen) if args.around_plans else candidates(batch, kv, qlen)):
            try:  # time the route custom_kernel would run (direct launches)
                route, _ = S._make_route(q, kv_data, kvp, cfg, plan)  # compiles, checks bitwise
                if not route:
                    raise RuntimeError("no direct route (see the log)")
                out = route(q, kv_data, kvp)
                torch.cuda.synchronize()
                err = rel_err(data, out, plan[0])
                ms = time_call(lambda: route(q, kv_data, kvp), args.reps) \
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
    kernel_names = {S.KERNEL_HMMA: "KERNEL_HMMA", S.KERNEL_WGMMA: "KERNEL_WGMMA", S.KERNEL_GLUON: "KERNEL_GLUON"}
    table = ["PLANS = {", "    # (batch, kv_seq_len, q_seq_len): Plan"]
    for key, (ms, plan) in best.items():
        plan = S.Plan(*plan)
        fields = ", ".join(f"{name}={value!r}" for name, value in plan._asdict().items() if name != "kernel")
        table.append(f"    {key}: Plan({fields}, kernel={kernel_names[plan.kernel]}),")
    table.append("}")
    print("\n" + "\n".join(table))
    if args.write:
        write_plans(table)
    try:  # which variants got TMA / wgmma, and their register use
        from bench_mla import sass_counts
        for name, c in sass_counts().items():
            print(name, c)
    except Exception as e:
        print("SASS count failed:", type(e).__name__, e)


if __name__ == "__main__":
    main()
