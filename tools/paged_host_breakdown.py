"""Host time of the paged submission's custom_kernel, piece by piece (GPU machine).

    python tools/paged_host_breakdown.py [--calls 200]

Each piece is timed in a loop shaped like eval.py's (sync, L2 flush, then the piece), median in us.
"""
import argparse
import statistics
import time

from problem_loader import load


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    p = load("problems/paged_mqa_logits")
    import torch

    sub, utils = p.submission, p.utils
    flush = utils.L2Flush()
    data = utils.clone_data(p.reference.generate_input(batch=256, next_n=1, context=8192, random=1, seed=5003))
    for _ in range(5):
        sub.custom_kernel(data)
    torch.cuda.synchronize()
    entry = sub._FAST[sub._signature(data)]
    weights = data[2]
    shape, dev = entry.out_shape, entry.device
    kv = data[1]["fp8"]
    k = entry.kernel
    d = entry.descs[1]

    out0 = torch.empty(shape, dtype=torch.float32, device=dev)
    kvd = entry.fill_tma(kv.data_ptr(), *d[1], [kv.shape[0] * 66, 128], [128, 1], 0)
    qp = data[0]["fp8"].data_ptr()
    launch_args = (*entry.grid, entry.stream_of(dev.index), *k.head, None, kvd, kv.shape[0] * 66, 128, 128, 1, None,
                   qp, qp, kv.data_ptr(), kv.data_ptr(), weights.data_ptr(), data[3].data_ptr(), data[4].data_ptr(),
                   out0.data_ptr(), *entry.scalars, *entry.tail)
    k.launch(*launch_args)
    torch.cuda.synchronize()
    pieces = {
        "custom_kernel": lambda: sub.custom_kernel(data),
        "entry(data)": lambda: entry(data),
        "_signature": lambda: sub._signature(data),
        "plan_for(_shape_of)": lambda: sub.plan_for(*sub._shape_of(data)),
        "_launch_hooked": sub._launch_hooked,
        "_format_tensors": lambda: sub._format_tensors(data, "fp8"),
        "torch.empty(shape, dtype, device)": lambda: torch.empty(shape, dtype=torch.float32, device=dev),
        "weights.new_empty(shape)": lambda: weights.new_empty(shape),
        "torch.empty(shape, dtype, device=int)": lambda: torch.empty(shape, dtype=torch.float32, device=dev.index),
        "fill_tma": lambda: entry.fill_tma(kv.data_ptr(), *d[1], [kv.shape[0] * 66, 128], [128, 1], 0),
        "stream_of": lambda: entry.stream_of(dev.index),
        "7 x data_ptr": lambda: [t.data_ptr() for t in (kv, kv, kv, kv, kv, kv, kv)],
        "k.launch (prebuilt args)": lambda: k.launch(*launch_args),
        "launch args tuple build": lambda: (*entry.grid, 0, *k.head, *launch_args),
        "tensor.shape+stride x6": lambda: [(t.shape, t.stride()) for t in (kv, kv, kv, kv, kv, kv)],
    }
    rows = []
    for name, fn in pieces.items():
        for mode in ("b2b", "eval"):
            ts = []
            for _ in range(args.calls):
                if mode == "eval":
                    torch.cuda.synchronize()
                    flush()
                t0 = time.perf_counter_ns()
                r = fn()
                ts.append((time.perf_counter_ns() - t0) / 1e3)
                del r
            torch.cuda.synchronize()
            rows.append((name, mode, statistics.median(ts), statistics.mean(ts)))
    print(f"{'piece':40s} {'loop':5s} {'median us':>10s} {'mean us':>8s}")
    for r in rows:
        print(f"{r[0]:40s} {r[1]:5s} {r[2]:10.2f} {r[3]:8.2f}")


if __name__ == "__main__":
    main()
