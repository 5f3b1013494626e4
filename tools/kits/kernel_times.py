"""GPU time per kernel of custom_kernel, per benchmark case (torch.profiler, L2 flushed before each call).

    python tools/kits/kernel_times.py [--problem problems/paged_mqa_logits] [--calls 5]
"""
import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from problem_loader import load  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--problem", default=".")
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    p = load(args.problem)
    import torch
    from torch.profiler import ProfilerActivity, profile

    sub = p.submission
    flush = p.utils.L2Flush()
    for case in p.cases:
        data = p.utils.clone_data(p.reference.generate_input(**case.args))
        for _ in range(3):
            sub.custom_kernel(data)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.calls):
                flush()
                sub.custom_kernel(data)
            torch.cuda.synchronize()
        per = collections.defaultdict(float)
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA and "fill" not in ev.name and "elementwise" not in ev.name:
                per[ev.name] += ev.device_time / args.calls
        print(f"{case.spec[:60]:60s} " + "  ".join(f"{k[:28]} {v:.1f}us" for k, v in per.items()), flush=True)


if __name__ == "__main__":
    main()
