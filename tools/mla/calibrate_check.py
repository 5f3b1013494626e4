"""Calibrates the accuracy rule: how far correct and wrong answers sit from each format's exact result.

Prints, per case: attention entropy, and for each candidate answer its relative L2 distance and its
worst element error (in units of rms(ref)) against exact attention over each cache format.
With --tail N: the tails over N inputs of fresh random seeds per shape, of the answers that round q to
fp8 (per tensor as a8w8 does, and per (row, head)) and of the nearest mistake, against the fp8 result
and the a8w8 result, and how many of them the check passes.
Run: python tools/mla/calibrate_check.py [--tail N]  (CPU is fine; docs/mla_design.md quotes its output)."""
import argparse
import math
import os
import random
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import reference as R  # noqa: E402


def entropy(q, kv, qo, kvp, sm_scale):
    ents = []
    for b in range(len(qo) - 1):
        k = kv[kvp[b]:kvp[b + 1], 0].float()
        s = torch.einsum("qhd,kd->qhk", q[qo[b]:qo[b + 1]].float(), k) * sm_scale
        p = torch.softmax(s, -1)
        ents.append((-(p * p.clamp(min=1e-30).log()).sum(-1)).mean().item())
        uniform = math.log(k.shape[0])
    return sum(ents) / len(ents), uniform


def candidates(data):
    q, kv_data, qo, kvp, cfg = data
    sm = cfg["sm_scale"]
    att = lambda kv, qq=q, s=sm: R.exact_attention(qq, kv, qo, kvp, s)
    out = {}
    for f in R.FORMATS:
        out[f"exact/{f}->bf16"] = att(R.dequantize_cache(kv_data, f)).to(torch.bfloat16)
    qf8, qs = R.quantize_fp8(q)
    out["a8w8 (q fp8)"] = att(R.dequantize_cache(kv_data, "fp8"), R.dequantize_fp8(qf8, qs)).to(torch.bfloat16)
    kv = R.dequantize_cache(kv_data, "bf16")
    no_rope_q = q.clone(); no_rope_q[..., R.KV_LORA_RANK:] = 0
    out["no rope dims"] = att(kv, no_rope_q).to(torch.bfloat16)
    out["sm_scale 1/sqrt(512)"] = att(kv, q, 1 / math.sqrt(512)).to(torch.bfloat16)
    out["closed form sm*q[:512]"] = (q[..., :512].float() * sm).to(torch.bfloat16)
    lens = (kvp[1:] - kvp[:-1]).tolist()
    mean_v = torch.stack([kv[kvp[b]:kvp[b + 1], 0, :512].mean(0) for b in range(len(lens))])
    out["mean of V"] = mean_v.repeat_interleave(cfg["q_seq_len"], 0)[:, None].expand(-1, 16, -1).to(torch.bfloat16)
    kv_rolled = torch.cat([kv[kvp[1]:], kv[:kvp[1]]])  # each sequence reads its neighbour's rows
    out["neighbour's cache"] = att(kv_rolled).to(torch.bfloat16)
    return out


def q_fp8_per_row_head(q):
    """q rounded to fp8 with one scale per (row, head): another q rounding than a8w8's."""
    scale = (q.float().abs().amax(-1, keepdim=True) / R.FP8_MAX).clamp(min=1e-12)
    return (q.float() / scale).clamp(-R.FP8_MAX, R.FP8_MAX).to(R.FP8_DTYPE).float() * scale


def _distance(out, ref):
    """(relative L2, worst element error beyond RTOL in units of rms(ref))."""
    d = (out.float() - ref).abs()
    return R.compare(out, ref)["rel_l2"], ((d - R.RTOL * ref.abs()) / ref.pow(2).mean().sqrt()).max().item()


def tail(n: int, seed=None):
    """seed: of the inputs' seeds (None: fresh from the system's randomness)."""
    draw = random.Random(seed).getrandbits if seed is not None else random.SystemRandom().getrandbits
    print(f"tails over {n} inputs a shape (random seeds); distances: rel L2 / worst element in rms(ref)")
    for spec in (dict(batchsize=2, qseqlen=1, kvseqlen=65), dict(batchsize=4, qseqlen=1, kvseqlen=1024)):
        rows = {"a8w8 (q fp8 per tensor)": [], "q fp8 per (row, head)": [], "sm_scale 1/sqrt(512)": []}
        passed = dict.fromkeys(rows, 0)
        for _ in range(n):
            data = R.generate_input(seed=draw(63), **spec)
            q, kv_data, qo, kvp, cfg = data
            fp8 = R.cache_rows(kv_data, "fp8")
            refs = {"fp8": R.exact_result(data, "fp8"), "a8w8": R.exact_result(data, "a8w8")}
            outs = {"a8w8 (q fp8 per tensor)": refs["a8w8"],
                    "q fp8 per (row, head)": R.exact_attention(q_fp8_per_row_head(q), fp8, qo, kvp, cfg["sm_scale"]),
                    "sm_scale 1/sqrt(512)": R.exact_attention(q, fp8, qo, kvp, 1 / math.sqrt(512))}
            check = R.make_checker(data)
            for name, out in outs.items():
                out = out.to(torch.bfloat16)
                rows[name].append([_distance(out, ref) for ref in refs.values()])
                passed[name] += check(out)[0]
        print(f"\n{spec}")
        for name, dists in rows.items():
            cells = []
            for i, ref in enumerate(("fp8", "a8w8")):
                for j, what in enumerate(("L2", "elt")):
                    xs = sorted(d[i][j] for d in dists)
                    cells.append(f"{ref} {what} p99.9 {xs[min(n - 1, int(n * 0.999))]:.3f} max {xs[-1]:.3f} "
                                 f"min {xs[0]:.3f}")
            print(f"  {name:24s} passes {passed[name]}/{n}  " + " | ".join(cells))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tail", type=int, metavar="N", help="the tails over N fresh inputs a shape instead")
    args = parser.parse_args()
    if args.tail:
        torch.set_num_threads(1)  # the inputs are small: one thread is as fast, and two runs can share a machine
        return tail(args.tail)
    torch.manual_seed(0)
    cases = [dict(batchsize=4, qseqlen=1, kvseqlen=1024), dict(batchsize=8, qseqlen=2, kvseqlen=300, ragged=1),
             dict(batchsize=2, qseqlen=1, kvseqlen=8192)]
    for spec in cases:
        for seed in (1, 2):
            data = R.generate_input(seed=seed, **spec)
            q, kv_data, qo, kvp, cfg = data
            ent, uni = entropy(q, kv_data["bf16"], qo.tolist(), kvp.tolist(), cfg["sm_scale"])
            print(f"\n{spec} seed {seed}: mean attention entropy {ent:.2f} nats (uniform over kvseqlen: {uni:.2f})")
            refs = {f: R.exact_attention(q, R.dequantize_cache(kv_data, f), qo, kvp, cfg["sm_scale"]) for f in R.FORMATS}
            for name, out in candidates(data).items():
                cells = []
                for f, ref in refs.items():
                    rel_l2, elt = _distance(out, ref)
                    cells.append(f"{f}: L2 {rel_l2:.4f} worst {elt:.3f}rms")
                ok, _ = R.check_implementation(data, out)
                print(f"  {name:24s} {'PASS' if ok else 'fail'}  " + " | ".join(cells))


if __name__ == "__main__":
    main()
