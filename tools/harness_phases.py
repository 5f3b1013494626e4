"""Host time of each phase of eval.py's timed call (events made before the sync, as eval.py does) (GPU machine): how much of the L2 flush's GPU time
is left to hide the submission's host time.   python tools/harness_phases.py [--calls 300]"""
import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    sys.path[:0] = [str(ROOT)]
    import torch
    import utils

    flush = utils.L2Flush()
    x = torch.empty(1 << 20, device="cuda")
    phases = {k: [] for k in ("flush() call", "2 x Event()", "start.record()", "tiny kernel launch",
                              "end.record()", "flush GPU us", "start->end GPU us")}
    for i in range(args.calls):
        e0 = time.perf_counter_ns()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e1 = time.perf_counter_ns()
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        flush()
        t1 = t2 = time.perf_counter_ns()
        start.record()
        t3 = time.perf_counter_ns()
        x.add_(1.0)
        t4 = time.perf_counter_ns()
        end.record()
        t5 = time.perf_counter_ns()
        torch.cuda.synchronize()
        for k, a, b in (("flush() call", t0, t1), ("2 x Event()", e0, e1), ("start.record()", t2, t3),
                        ("tiny kernel launch", t3, t4), ("end.record()", t4, t5)):
            phases[k].append((b - a) / 1e3)
        phases["start->end GPU us"].append(start.elapsed_time(end) * 1e3)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        flush()
        b.record()
        torch.cuda.synchronize()
        phases["flush GPU us"].append(a.elapsed_time(b) * 1e3)
    for k, v in phases.items():
        print(f"{k:22s} median {statistics.median(v):8.2f}  mean {statistics.mean(v):8.2f}  p90 {sorted(v)[int(0.9 * len(v))]:8.2f}")


if __name__ == "__main__":
    main()
