"""Calibrates the accuracy rule: how far correct and wrong answers sit from each format's exact result.

Prints, per case: attention entropy, and for each candidate answer its relative L2 distance and its
worst element error (in units of rms(ref)) against exact attention over each cache format.
Run: python tools/mla/calibrate_check.py  (CPU is fine; docs/mla_design.md quotes its output)."""
import math
import os
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


def main():
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
                    d = (out.float() - ref).abs()
                    rms = ref.pow(2).mean().sqrt()
                    elt = ((d - R.RTOL * ref.abs()) / rms).max().item()
                    cells.append(f"{f}: L2 {R.compare(out, ref)['rel_l2']:.4f} worst {elt:.3f}rms")
                ok, _ = R.check_implementation(data, out)
                print(f"  {name:24s} {'PASS' if ok else 'fail'}  " + " | ".join(cells))


if __name__ == "__main__":
    main()
