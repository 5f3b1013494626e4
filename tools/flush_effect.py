"""GPU time of custom_kernel after eval.py's L2 flush (a write: it leaves the L2 full of dirty lines,
which the timed kernel then writes back) against a read-only flush (same buffer summed: the L2 is
evicted too, but clean), per benchmark case. GPU machine.

    python tools/flush_effect.py [--problem problems/paged_mqa_logits] [--calls 30]
"""
import argparse
import statistics

from problem_loader import load, queued_gpu_us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--problem", default=".")
    ap.add_argument("--calls", type=int, default=30)
    args = ap.parse_args()
    p = load(args.problem)
    import torch

    sub = p.submission
    write_flush = p.utils.L2Flush()

    def read_flush():
        write_flush.buffer.sum(dtype=torch.int64)

    print(f"{'case':62s} {'write-flush us':>14s} {'read-flush us':>14s}")
    for case in p.cases:
        data = p.utils.clone_data(p.reference.generate_input(**case.args))
        for _ in range(3):
            sub.custom_kernel(data)
        res = {name: statistics.median(queued_gpu_us(lambda: sub.custom_kernel(data), flush)
                                       for _ in range(args.calls))
               for name, flush in (("write", write_flush), ("read", read_flush))}
        print(f"{case.spec[:62]:62s} {res['write']:14.1f} {res['read']:14.1f}", flush=True)


if __name__ == "__main__":
    main()
