"""How much of eval.py's benchmark time is host time, per benchmark case of a problem.

    python tools/host_exposure.py [--problem problems/paged_mqa_logits] [--calls 100]

For each benchmark case in task.yml (same input generation and seeds as eval.py benchmark) it
times `calls` calls three ways and prints the means:
  eval   as eval.py does: events made, sync, L2 flush, start event, custom_kernel, end event
         (plus an event pair around the flush)
  gpu    the same, but the GPU sleeps ~200 us before the start event, so the host has queued the
         whole call before the GPU reaches it: the GPU time alone (the flush's dirty L2 included)
  host   wall time of custom_kernel itself in the eval loop (perf_counter)
  flush  GPU time of the flush (how much host time it can hide)
eval - gpu is the host time the flush did not hide.
"""
import argparse
import statistics
import time

from problem_loader import load, print_case_table, queued_gpu_us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--problem", default=".")
    ap.add_argument("--calls", type=int, default=100)
    args = ap.parse_args()
    p = load(args.problem)
    import torch

    kernel = p.submission.custom_kernel
    flush = p.utils.L2Flush()

    def events():
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    rows = []
    for case in p.cases:
        data = p.utils.clone_data(p.reference.generate_input(**case.args))
        for _ in range(10):
            kernel(data)
        t_eval, t_gpu, t_host, t_flush = [], [], [], []
        for _ in range(args.calls):
            a, b = events()
            start, end = events()
            torch.cuda.synchronize()
            a.record()
            flush()
            b.record()
            start.record()
            h0 = time.perf_counter_ns()
            out = kernel(data)
            t_host.append((time.perf_counter_ns() - h0) / 1e3)
            end.record()
            torch.cuda.synchronize()
            t_eval.append(start.elapsed_time(end) * 1e3)
            t_flush.append(a.elapsed_time(b) * 1e3)
            del out
            t_gpu.append(queued_gpu_us(lambda: kernel(data), flush))
        m = statistics.mean
        rows.append((case.spec, m(t_eval), m(t_gpu), m(t_host), m(t_flush)))
    print_case_table(("eval us", "gpu us", "host us", "flush us"), rows)


if __name__ == "__main__":
    main()
