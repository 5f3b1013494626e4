"""Whether an fp4 kernel can outrun the fp8 one, from executed instructions rather than bytes.

ncu counts, for each shipped fp8 kernel on the benchmark shapes, the warp instructions it executes, its
cycles and its clock; the paged kit's fp4 kernel (fp4ws) is counted beside the fp8 plan each shape ships with. An
MXFP4 MLA kernel does the fp8 kernel's work plus two table decodes of every cache element (K and V are
different wgmma operand layouts: 576 + 512 elements a token), at the table decode's SASS count per element
(tools/kits/fp4_decode_probe.py). Table builds, scale loads and the exact path's checks are left out, so its
count is a lower bound. From it: the time at the fp8 kernel's own issue rate, the time at the SM's peak
(4 warp instructions a cycle) at the measured clock, and the issue rate it needs to tie fp8.

    python tools/kits/fp4_issue_bound.py       # GPU with ncu: writes results/fp4_bound.md
    python tools/kits/fp4_issue_bound.py --case mla 256 8192          # what ncu runs (one shape, three calls)
    python tools/kits/fp4_issue_bound.py --case paged fp4ws 256 1 8192
"""
import argparse
import csv
import io
import os
import subprocess
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib")]
from problem_loader import PEAK_BW, ROOT, geomean, results_stamp  # noqa: E402

PEAK_ISSUE = 4          # warp instructions an SM can issue per cycle (4 schedulers, one each)
MLA_DECODED = 576 + 512  # elements of a cache row decoded per token: K (all 576) and V (the 512 nope)
MLA_KERNEL = "_mla_fp8_wgmma_kernel"
# "shipped": the plan the kit routes the shape to (an fp8 kernel, Triton's or Gluon's); fp4ws at chunk 16,
# 4 stages, its best measured plan on these shapes
PAGED_KERNELS = {"shipped": "_paged_mqa_logits_kernel|_fp8_wgmma_kernel", "fp4ws": "_fp4_wgmma_kernel"}
PAGED_PLAN_FP4WS = ("fp4ws", 16, 4, 4, 0, 1, 1, 0)
# ncu's units of time and clock -> ns and Hz
UNITS = {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6,
         "hz": 1, "khz": 1e3, "mhz": 1e6, "ghz": 1e9, "cycle/second": 1, "cycle/usecond": 1e6, "cycle/nsecond": 1e9}
PAGED_SHAPES = [(256, 1, 1024), (256, 1, 8192), (32, 1, 65536)]
METRICS = {"inst": "sm__inst_executed.sum", "cycles": "sm__cycles_elapsed.avg",
           "clock": "sm__cycles_elapsed.avg.per_second", "ns": "gpu__time_duration.sum",
           "sms": "device__attribute_multiprocessor_count", "regs": "launch__registers_per_thread"}


def run_case(argv):
    """One shape's kernel called three times (ncu profiles the third): `mla B KV` (custom_kernel, the
    fp8 route) or `paged shipped|fp4ws B NEXT_N CONTEXT` (that plan through the kit's launch)."""
    import torch
    from problem_loader import load
    if argv[0] == "mla":
        kit = load(".")
        b, kv = int(argv[1]), int(argv[2])
        data = kit.reference.generate_input(batchsize=b, qseqlen=1, kvseqlen=kv, seed=7)
        call = lambda: kit.submission.custom_kernel(data)  # noqa: E731
    else:
        kit = load("problems/paged_mqa_logits")
        fmt, b, n, ctx = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
        data = kit.reference.generate_input(batch=b, next_n=n, context=ctx, seed=7)
        plan = kit.submission.plan_for(b, n, data[-1]) if fmt == "shipped" else PAGED_PLAN_FP4WS
        print(f"paged {b} x {n} x {ctx}: plan {tuple(plan)}", file=sys.stderr)
        call = lambda: kit.submission.launch(data, plan)  # noqa: E731
    for _ in range(3):
        call()
    torch.cuda.synchronize()


def profile(kernel, case):
    """ncu's METRICS for the third launch of `kernel` in `--case case` (clocks left alone)."""
    cmd = ["ncu", "--clock-control", "none", "--csv", "--page", "raw", "-k", f"regex:{kernel}",
           "--launch-skip", "2", "--launch-count", "1", "--metrics", ",".join(METRICS.values()),
           sys.executable, os.path.abspath(__file__), "--case", *map(str, case)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    try:
        if run.returncode != 0:
            raise ValueError(f"rc {run.returncode}")
        return parse_raw_csv(run.stdout)
    except ValueError as exc:
        raise RuntimeError(f"ncu {' '.join(map(str, case))}: {exc}\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")


def parse_raw_csv(text):
    """METRICS (ns and Hz where timed) from `ncu --csv --page raw`: a header row of metric names, a row of
    units, then one row per kernel launch (the last is taken); numbers may carry thousands separators."""
    rows = [r for r in csv.reader(io.StringIO(text)) if r]
    header = next((i for i, r in enumerate(rows) if METRICS["inst"] in r), None)
    if header is None or len(rows) < header + 3:
        raise ValueError("no profiled launch in ncu's output")
    names, units, values = rows[header], rows[header + 1], rows[-1]
    got = {}
    for key, metric in METRICS.items():
        if metric not in names:
            raise ValueError(f"ncu's output has no {metric}")
        value = float(values[names.index(metric)].replace(",", ""))
        unit = units[names.index(metric)].lower()
        if key in ("ns", "clock"):
            if unit not in UNITS:
                raise ValueError(f"ncu gave {metric} in {unit!r}, which this tool does not convert")
            value *= UNITS[unit]
        got[key] = value
    return got


def mla_rows(d):
    """The MLA table: per benchmark shape the fp8 kernel as measured and the MXFP4 kernel's lower bound."""
    from problem_loader import load
    kit = load(".")
    head = ["| batch | kv | fp8 us | fp8 warp inst | clock GHz | fp8 issue / SM-cycle | MXFP4 warp inst >= "
            "| MXFP4 us at fp8's issue rate | MXFP4 us at peak issue (or floor) | MXFP4 memory floor us "
            "| issue rate to tie fp8 |", "|" + "---|" * 11]
    rows, at_rate, bound = [], [], []
    for case in kit.cases:
        b, kv = case.args["batchsize"], case.args["kvseqlen"]
        m = profile(MLA_KERNEL, ("mla", b, kv))
        data = kit.reference.generate_input(**case.args)
        floor_us = kit.reference.min_bytes(data) / PEAK_BW * 1e6
        fp4_inst = m["inst"] + b * kv * MLA_DECODED * d / 32
        sm_cycles = m["sms"] * m["cycles"]
        us = m["ns"] / 1e3
        at_rate.append(us * fp4_inst / m["inst"])
        bound.append(max(fp4_inst / (m["sms"] * PEAK_ISSUE * m["clock"]) * 1e6, floor_us))
        rows.append(f"| {b} | {kv} | {us:.1f} | {m['inst'] / 1e6:.1f} M | {m['clock'] / 1e9:.2f} "
                    f"| {m['inst'] / sm_cycles:.2f} | {fp4_inst / 1e6:.1f} M | {at_rate[-1]:.1f} | {bound[-1]:.1f} "
                    f"| {floor_us:.1f} | {fp4_inst / sm_cycles:.2f} |")
    return head + rows, geomean(at_rate), geomean(bound)


def paged_rows():
    """The paged table: per shape the shipped fp8 plan and fp4ws, measured; for fp4ws, its time at peak issue
    and the issue rate it needs to tie the shipped plan."""
    head = ["| batch | next_n | context | plan | us | warp inst | clock GHz | issue / SM-cycle | registers "
            "| us at peak issue | issue rate to tie the shipped plan |", "|" + "---|" * 11]
    rows = []
    for b, n, ctx in PAGED_SHAPES:
        counted = {fmt: profile(kernel, ("paged", fmt, b, n, ctx)) for fmt, kernel in PAGED_KERNELS.items()}
        shipped = counted["shipped"]
        for fmt, m in counted.items():
            peak_us = m["inst"] / (m["sms"] * PEAK_ISSUE * m["clock"]) * 1e6
            tie = "-" if fmt == "shipped" else f"{m['inst'] / (shipped['sms'] * shipped['cycles']):.2f}"
            rows.append(f"| {b} | {n} | {ctx} | {fmt} | {m['ns'] / 1e3:.1f} | {m['inst'] / 1e6:.1f} M "
                        f"| {m['clock'] / 1e9:.2f} | {m['inst'] / (m['sms'] * m['cycles']):.2f} | {m['regs']:.0f} "
                        f"| {peak_us:.1f} | {tie} |")
    return head + rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "fp4_bound.md"))
    args = ap.parse_args()
    if args.case:
        return run_case(args.case)
    import fp4_decode_probe as probe
    d = probe.decode_per_element(*probe.decode_counts())  # the table decode's SASS per element, sm_90
    mla, at_rate, bound = mla_rows(d)
    lines = ["# fp4 against fp8: executed instructions", "",
             results_stamp("python tools/kits/fp4_issue_bound.py") + ". ncu (`--clock-control none`), one call after "
             "two warm-ups, its caches flushed, inputs of seed 7; issue rates are warp instructions per SM per "
             "elapsed cycle.", "",
             "## MLA: the fp8 kernel measured, an MXFP4 kernel bounded", "",
             f"MXFP4 warp instructions >= the fp8 kernel's + batch x kv x {MLA_DECODED} decoded elements x "
             f"{d:.2f} SASS per element (the table decode alone) / 32. Peak issue: {PEAK_ISSUE} a cycle at the "
             "clock measured; no less than the MXFP4 memory floor (q, the packed cache and its scales, the "
             "output, at 4.2 TB/s).", ""]
    lines += mla
    lines += ["", f"geometric mean: MXFP4 at the fp8 kernel's issue rate {at_rate / 1e3:.4f} ms; the lower bound "
              f"(peak issue or floor, per shape) {bound / 1e3:.4f} ms", "",
              "## Paged MQA logits: fp4ws beside the shipped fp8 plan", ""]
    lines += paged_rows()
    lines += ["", "shipped: the shape's plan, an fp8 kernel (Triton's or Gluon's); fp4ws at chunk 16, 4 stages. "
              "registers: as launched (fp4ws's warpgroup takes more through setmaxnreg)."]
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
