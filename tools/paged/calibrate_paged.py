"""
Calibration of the accuracy rule (README "Accuracy rule"), on the CPU:

    python tools/paged/calibrate_paged.py

For each case prints max err/tol (tol = RTOL * bound + ATOL) of results that must pass and the share of
valid positions beyond tolerance of results that must fail. Must pass: the exact result in float64,
an fp8 tensor-core accumulation emulated with a 13-bit aligned (truncating) adder per 32-element
k-step, and the fp4 pair's own exact result checked against the fp4 pair. Must fail: relu dropped,
weights ignored (all 1), identity block tables, key scales ignored, mixed pair (fp8 q x fp4 keys).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "problems", "paged_mqa_logits"))
import reference as R  # noqa: E402


def emulated_tc(data, bits=13):
    """fp8 pair with each 32-product k-step summed on a grid of 2^(e_max - bits), e_max the exponent
    of the largest of |running sum| and the step's products (truncation toward zero)."""
    q, kv, w, cl, bt, L = data
    qf, kf = R.dequantize_pair(data, "fp8")
    vals, scales = R.unpack_fp8_cache(kv["fp8"])
    batch, next_n = qf.shape[:2]
    out = torch.full((batch * next_n, L), float("-inf"))
    for b in range(batch):
        n = int(cl[b])
        pages = bt[b, : (n + 63) // 64].long()
        k = vals[pages].float().reshape(-1, 128)[:n]
        sc = scales[pages].reshape(-1)[:n]
        prods = qf[b].reshape(-1, 1, 128) * k.unsqueeze(0)             # (nH, n, 128) exact
        acc = torch.zeros(prods.shape[:2])
        for j in range(0, 128, 32):
            p = prods[..., j:j + 32]
            emax = torch.maximum(acc.abs(), p.abs().amax(-1)).clamp(min=1e-30)
            ulp = torch.exp2(torch.floor(torch.log2(emax)) - bits)
            acc = torch.trunc(acc / ulp) * ulp + (torch.trunc(p / ulp.unsqueeze(-1)) * ulp.unsqueeze(-1)).sum(-1)
        s = (acc * sc).reshape(next_n, 64, n)
        out[b * next_n:(b + 1) * next_n, :n] = (w.reshape(batch, next_n, 64)[b].unsqueeze(-1) * s.relu()).sum(1)
    return out.masked_fill(~R.valid_mask(cl, next_n, L), float("-inf"))


def stats(data, out, fmt):
    ref, bound = R.logits_for_format(data, fmt, with_bound=True)
    valid = R.valid_mask(data[3], data[0]["fp8"].shape[1], data[5])
    ratio = ((out.double() - ref.double()).abs() / (R.RTOL * bound + R.ATOL).double())[valid]
    return float(ratio.max()), float((ratio > 1).double().mean()), float(ratio.median())


def main():
    torch.manual_seed(0)
    for spec in [dict(batch=4, next_n=1, context=300), dict(batch=2, next_n=2, context=1000)]:
        data = R.generate_input(seed=7, **spec)
        q, kv, w, cl, bt, L = data
        qf, kf = R.dequantize_pair(data, "fp8")
        q4, k4 = R.dequantize_pair(data, "fp4")
        exact64 = R.exact_logits(qf.double(), kf.double(), w.double(), cl, bt, L).float()
        rows = {
            "pass: exact in float64": (exact64, "fp8"),
            "pass: emulated fp8 tensor-core accumulation (13-bit)": (emulated_tc(data), "fp8"),
            "pass: fp4 pair exact": (R.logits_for_format(data, "fp4"), "fp4"),
            "fail: relu dropped": (R.exact_logits(qf, kf, w, cl, bt, L, relu=False), "fp8"),
            "fail: weights ignored": (R.exact_logits(qf, kf, torch.ones_like(w), cl, bt, L), "fp8"),
            "fail: identity block tables": (R.exact_logits(qf, kf, w, cl, torch.arange(bt.numel(), dtype=torch.int32)
                                                           .reshape(bt.shape) % kf.shape[0], L), "fp8"),
            "fail: key scales ignored": (R.exact_logits(qf, R.unpack_fp8_cache(kv["fp8"])[0].float(), w, cl, bt, L), "fp8"),
            "fail: fp8 q x fp4 keys": (R.exact_logits(qf, k4, w, cl, bt, L), "fp8"),
        }
        print(spec)
        for name, (out, fmt) in rows.items():
            mx, share, med = stats(data, out, fmt)
            print(f"  {name:55s} vs {fmt}: max err/tol {mx:9.3g}  median {med:9.3g}  share beyond tol {share:.3f}")


if __name__ == "__main__":
    main()
