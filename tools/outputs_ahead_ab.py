"""A/B of the submissions' output allocation on a GPU machine: allocated during the previous call,
after its launch (A, `_OutputsAhead`, what the submissions do) against allocated before the launch
(B, what they did before). Timed as eval.py times (sync, L2 flush, start event, call, end event), in
interleaved blocks of 50 calls so that drift on the VM hits both alike; also custom_kernel's wall time.

    python tools/outputs_ahead_ab.py PROBLEM [calls]      e.g. problems/paged_mqa_logits 400
"""
import statistics
import sys
import time

from problem_loader import load, print_case_table


class Inline:
    """What the submissions did before: the output allocated right before the launch."""

    def __init__(self, shape):
        self.shape = shape

    def take(self, like, stream):
        return like.new_empty(self.shape)

    def allocate_next(self, like, stream):
        pass


def main():
    p = load(sys.argv[1])
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    import torch

    sub, flush = p.submission, p.utils.L2Flush()
    launch_cache = sub._FAST if hasattr(sub, "_FAST") else sub._routes  # paged kit / MLA
    rows = []
    for case in p.cases:
        data = p.utils.clone_data(p.reference.generate_input(**case.args))
        for _ in range(10):
            sub.custom_kernel(data)
        entries = [e for e in launch_cache.values() if hasattr(e, "outputs")]
        ahead = {id(e): e.outputs for e in entries}
        inline = {id(e): Inline(e.outputs.shape) for e in entries}
        t, host = {"A": [], "B": []}, {"A": [], "B": []}
        for block in range(calls // 50):
            mode = "AB"[block % 2]
            for e in entries:
                e.outputs = (ahead if mode == "A" else inline)[id(e)]
            sub.custom_kernel(data)
            for _ in range(50):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                flush()
                start.record()
                h0 = time.perf_counter_ns()
                out = sub.custom_kernel(data)
                host[mode].append((time.perf_counter_ns() - h0) / 1e3)
                end.record()
                torch.cuda.synchronize()
                t[mode].append(start.elapsed_time(end) * 1e3)
                del out
        for e in entries:
            e.outputs = ahead[id(e)]
        m = statistics.mean
        rows.append((case.spec, m(t["A"]), m(t["B"]), m(host["A"]), m(host["B"])))
    print_case_table(("ahead us", "inline us", "host A us", "host B us"), rows)


if __name__ == "__main__":
    main()
