"""GPU time per kernel of custom_kernel, per benchmark case (torch.profiler, L2 flushed before each call).

    python tools/kernel_times.py [--problem problems/paged_mqa_logits] [--calls 5]
"""
import argparse
import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--problem", default=".")
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    problem = (ROOT / args.problem).resolve()
    sys.path[:0] = [str(problem), str(ROOT)]
    import importlib.util

    import torch
    from torch.profiler import ProfilerActivity, profile

    import eval as harness
    import reference
    import utils

    spec = importlib.util.spec_from_file_location("submission", problem / "submission.py")
    sub = importlib.util.module_from_spec(spec)
    sys.modules["submission"] = sub
    spec.loader.exec_module(sub)
    flush = utils.L2Flush()
    for case in harness.make_cases(harness.load_task(problem)["benchmarks"], None):
        data = utils.clone_data(reference.generate_input(**case.args))
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
