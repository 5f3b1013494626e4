"""Why are leaderboard-mode times higher than benchmark-mode times? (GPU machine)

    python tools/diag_leaderboard.py [--calls 40] [--shapes 4x1024,32x8192]

Times custom_kernel as eval.py does (sync, L2 flush, start event, call, end event) under three input
patterns and prints medians of the event time, the call's host time and the host time of the route's
pieces (timed by wrappers around them, ~0.3 us each):
  same    one input reused (benchmark mode)
  fresh   new inputs (generate + clone) before every call
  check   as fresh, plus the check of each output afterwards (leaderboard mode)
  queued  as fresh, but the GPU sleeps ~0.5 ms after the flush, so the whole call is queued before the
          GPU reaches it: the event time is then GPU time alone (fresh inputs' GPU time, no host time)
Nothing touches a fresh input before the timed call.
"""
import argparse
import statistics
import time

from problem_loader import hold_gpu, load

PIECES = ("signature", "descriptors", "take", "launch", "allocate_next")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--shapes", default="4x1024,32x8192,256x8192")
    args = ap.parse_args()
    p = load(".")
    import torch

    reference, sub, utils = p.reference, p.submission, p.utils

    spent = {k: 0.0 for k in PIECES}

    def timed_piece(name, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter_ns()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += (time.perf_counter_ns() - t0) / 1e3
        return wrapper

    sub._signature = timed_piece("signature", sub._signature)
    sub._Route._descriptors = timed_piece("descriptors", sub._Route._descriptors)
    sub._OutputsAhead.take = timed_piece("take", sub._OutputsAhead.take)
    sub._OutputsAhead.allocate_next = timed_piece("allocate_next", sub._OutputsAhead.allocate_next)
    wrapped_launches = set()
    flush = utils.L2Flush()

    def timed_call(x, queued=False):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for k in spent:
            spent[k] = 0.0
        torch.cuda.synchronize()
        flush()
        if queued:
            hold_gpu(500e-6)
        start.record()
        t0 = time.perf_counter_ns()
        out = sub.custom_kernel(x)
        host = (time.perf_counter_ns() - t0) / 1e3
        end.record()
        torch.cuda.synchronize()
        return out, [start.elapsed_time(end) * 1e3, host] + [spent[k] for k in PIECES]

    print(f"{'shape':9s} {'pattern':7s} {'event us':>8s} {'host us':>8s} " + " ".join(f"{k:>13s}" for k in PIECES))
    for shape in args.shapes.split(","):
        batch, kv = (int(v) for v in shape.split("x"))
        spec = dict(batchsize=batch, qseqlen=1, kvseqlen=kv, seed=11)
        data = reference.generate_input(**spec)
        x = utils.clone_data(data)
        for _ in range(3):
            sub.custom_kernel(x)
        for route in sub._routes.values():  # the launches, once the route exists
            if isinstance(route, sub._Route) and id(route.split) not in wrapped_launches:
                wrapped_launches.add(id(route.split))
                route.split.launch = timed_piece("launch", route.split.launch)
        for pattern in ("same", "fresh", "check", "queued"):
            rows = []
            for i in range(args.calls):
                if pattern != "same":
                    data = reference.generate_input(**{**spec, "seed": spec["seed"] + 13 * (i + 1)})
                    x = utils.clone_data(data)
                out, row = timed_call(x, queued=pattern == "queued")
                if pattern == "check":
                    assert reference.check_implementation(data, out)[0]
                rows.append(row)
                del out
            med = [statistics.median(c) for c in zip(*rows)]
            print(f"{shape:9s} {pattern:7s} {med[0]:8.1f} {med[1]:8.1f} " + " ".join(f"{v:13.2f}" for v in med[2:]),
                  flush=True)


if __name__ == "__main__":
    main()
