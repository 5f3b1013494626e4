"""A/B of the submissions' output allocation on a GPU machine: allocated during the previous call,
after its launch (A, `_OutputsAhead`, what the submissions do) against allocated before the launch
(B, what they did before). Timed as eval.py times (sync, L2 flush, start event, call, end event), in
interleaved blocks of 50 calls so that drift on the VM hits both alike; also custom_kernel's wall time.

    python tools/outputs_ahead_ab.py PROBLEM [calls]      e.g. problems/paged_mqa_logits 400
"""
import math
import statistics
import sys
import time

from problem_loader import load

p = load(sys.argv[1])
calls = int(sys.argv[2]) if len(sys.argv) > 2 else 400
import torch
sub = p.submission
flush = p.utils.L2Flush()


class Inline:
    def __init__(self, shape):
        self.shape = shape

    def take(self, like, stream):
        return like.new_empty(self.shape)

    def allocate_next(self, like, stream):
        pass


def entries():
    d = getattr(sub, "_FAST", None) or getattr(sub, "_routes")
    return [e for e in d.values() if hasattr(e, "outputs")]


rows = []
for case in p.cases:
    data = p.utils.clone_data(p.reference.generate_input(**case.args))
    for _ in range(10):
        sub.custom_kernel(data)
    es = entries()
    ahead = {id(e): e.outputs for e in es}
    inline = {id(e): Inline(e.outputs.shape) for e in es}
    t = {"A": [], "B": []}
    host = {"A": [], "B": []}
    for block in range(calls // 50):
        mode = "AB"[block % 2]
        for e in es:
            e.outputs = (ahead if mode == "A" else inline)[id(e)]
        sub.custom_kernel(data)
        for _ in range(50):
            s, e_ = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            flush()
            s.record()
            h0 = time.perf_counter_ns()
            out = sub.custom_kernel(data)
            host[mode].append((time.perf_counter_ns() - h0) / 1e3)
            e_.record()
            torch.cuda.synchronize()
            t[mode].append(s.elapsed_time(e_) * 1e3)
            del out
    for e in es:
        e.outputs = ahead[id(e)]
    m = statistics.mean
    rows.append((case.spec[:60], m(t["A"]), m(t["B"]), m(host["A"]), m(host["B"])))
print(f"{'case':60s} {'ahead us':>9s} {'inline us':>9s} {'hostA':>7s} {'hostB':>7s}")
for r in rows:
    print(f"{r[0]:60s} {r[1]:9.1f} {r[2]:9.1f} {r[3]:7.1f} {r[4]:7.1f}")
g = lambda i: math.exp(sum(math.log(r[i]) for r in rows) / len(rows))
print(f"{'geomean':60s} {g(1):9.1f} {g(2):9.1f} {g(3):7.1f} {g(4):7.1f}")
