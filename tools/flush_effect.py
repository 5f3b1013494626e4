"""GPU time of custom_kernel after eval.py's L2 flush (a write: it leaves the L2 full of dirty lines,
which the timed kernel then writes back) against a read-only flush (same buffer summed: the L2 is
evicted too, but clean), per benchmark case. GPU machine.

    python tools/flush_effect.py [--problem problems/paged_mqa_logits] [--calls 30]
"""
import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--problem", default=".")
    ap.add_argument("--calls", type=int, default=30)
    args = ap.parse_args()
    problem = (ROOT / args.problem).resolve()
    sys.path[:0] = [str(problem), str(ROOT)]
    import importlib.util

    import torch

    import eval as harness
    import reference
    import utils

    spec = importlib.util.spec_from_file_location("submission", problem / "submission.py")
    sub = importlib.util.module_from_spec(spec)
    sys.modules["submission"] = sub
    spec.loader.exec_module(sub)
    write_flush = utils.L2Flush()

    def read_flush():
        write_flush.buffer.sum(dtype=torch.int64)

    sleep = int(200e-6 * torch.cuda.get_device_properties(0).clock_rate * 1e3)
    print(f"{'case':62s} {'write-flush us':>14s} {'read-flush us':>14s}")
    for case in harness.make_cases(harness.load_task(problem)["benchmarks"], None):
        data = utils.clone_data(reference.generate_input(**case.args))
        for _ in range(3):
            sub.custom_kernel(data)
        res = {}
        for name, flush in (("write", write_flush), ("read", read_flush)):
            ts = []
            for _ in range(args.calls):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                flush()
                torch.cuda._sleep(sleep)  # the host queues the whole call before the GPU gets to it
                start.record()
                sub.custom_kernel(data)
                end.record()
                torch.cuda.synchronize()
                ts.append(start.elapsed_time(end) * 1e3)
            res[name] = statistics.median(ts)
        print(f"{case.spec[:62]:62s} {res['write']:14.1f} {res['read']:14.1f}", flush=True)


if __name__ == "__main__":
    main()
