"""What the table decode of an fp4 cache costs: E2M1 codes to e4m3 bytes with the block scale folded into
an 8-entry table, per 8 codes one mask, one shift, four prmt (two lookups, two gathers) and the sign
logic, alone in a kernel that streams each kit's cache layout and reduces the decoded bytes (no softmax).

    python tools/kits/fp4_decode_probe.py --sass   # any machine: compiles for sm_90, SASS instructions per element
    python tools/kits/fp4_decode_probe.py          # GPU: also checks every decoded value and measures bytes per second

The decode (E2M1_TABLE_ASM, run through the PTX emulator in tests/test_asm_decodes.py):

- table: entry c of the 8 holds e4m3(E2M1[c] * 2^s) for the block's relative scale exponent s, built by two
  integer adds per block of 32 (table_words): adding 8 s to a byte moves its exponent, exact for s in
  [S_MIN, S_MAX] (below, 0.5 * 2^s is subnormal; above, 6 * 2^s passes 448). Entry 0 stays 0.
- order: word w holds elements 0-7 (element i in nibble i, the even one low); the decode returns
  $0 = elements 0, 2, 4, 6 and $1 = elements 1, 3, 5, 7, one byte each, so that every sign is one shift
  (or none) from its place: an odd element's sign bit is bit 7 of its byte already. A kernel that reads
  the cache this way permutes its other operand's contraction dimension to match.
- scale: s = e - e_ref for block exponent e, with e_ref = (the token's largest block exponent) - S_MAX, so
  the token's values are e4m3 * 2^(e_ref - 127), one factor per token. A block with s < S_MIN (more than
  11 binades under the token's largest) needs an exact path of its own; the probe counts them."""
import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib")]
from problem_loader import median_gpu_us, opcode_counts, results_stamp, sass_of  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
S_MIN, S_MAX = -5, 6
# Table entries 0-3 and 4-7 as e4m3 bytes of 0, .5, 1, 1.5 and 2, 3, 4, 6 (s = 0), little-endian.
TABLE_LO, TABLE_HI = tl.constexpr(0x3C383000), tl.constexpr(0x4C484440)

E2M1_TABLE_ASM = tl.constexpr("""
{
.reg .b32 m, hi, l1, l2, sg;
and.b32 m, $2, 0x77777777;
shr.b32 hi, m, 16;
prmt.b32 l1, $3, $4, m;
prmt.b32 l2, $3, $4, hi;
prmt.b32 $0, l1, l2, 0x6420;
prmt.b32 $1, l1, l2, 0x7531;
shl.b32 sg, $2, 4;
and.b32 sg, sg, 0x80808080;
or.b32 $0, $0, sg;
and.b32 sg, $2, 0x80808080;
or.b32 $1, $1, sg;
}
""")
# The same contract with no decode (the words and a table word passed through): the probe compiled with it
# and without it differ by what the decode itself costs.
PASS_THROUGH_ASM = tl.constexpr("mov.b32 $0, $2; mov.b32 $1, $3;")

# The two kits' fp4 caches: per token, 32-element blocks of 4 packed words and one E8M0 scale byte each.
BLOCKS_PER_TOKEN = {"mla": 18, "paged": 4}


def table_words(s: int) -> tuple[int, int]:
    """The table's two words for relative scale exponent s (what the kernel computes per block)."""
    assert S_MIN <= s <= S_MAX
    return (TABLE_LO.value + 8 * s * 0x01010100) & 0xFFFFFFFF, (TABLE_HI.value + 8 * s * 0x01010101) & 0xFFFFFFFF


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _probe_kernel(words_ptr, scales_ptr, ref_ptr, out_ptr, slow_ptr, n_blocks, BLOCKS: tl.constexpr,
                  NB: tl.constexpr, S_MIN_: tl.constexpr, CHECK: tl.constexpr, ASM: tl.constexpr):
    """NB blocks a program (block b of token b // BLOCKS, its words at 4 b, its scale byte at b; ref: each
    token's e_ref), each word decoded by ASM (E2M1_TABLE_ASM, or PASS_THROUGH_ASM for the probe's twin). The
    decoded words xor-reduced per program (out), or with CHECK stored (out: per word, evens then odds); slow:
    per program, the blocks under S_MIN."""
    pid = tl.program_id(0)
    b = pid * NB + tl.arange(0, NB)
    live = b < n_blocks
    e = tl.load(scales_ptr + b, mask=live, other=0).to(tl.int32)
    s = e - tl.load(ref_ptr + b // BLOCKS, mask=live, other=0)
    tl.store(slow_ptr + pid, tl.sum(((s < S_MIN_) & live).to(tl.int32), axis=0))
    s = tl.maximum(s, S_MIN_)
    t_lo = tl.broadcast_to((TABLE_LO + s * 0x08080800).to(tl.uint32)[:, None], (NB, 4))
    t_hi = tl.broadcast_to((TABLE_HI + s * 0x08080808).to(tl.uint32)[:, None], (NB, 4))
    idx = b[:, None] * 4 + tl.arange(0, 4)[None, :]
    w = tl.load(words_ptr + idx, mask=live[:, None], other=0)
    even, odd = tl.inline_asm_elementwise(ASM, "=r,=r,r,r,r", [w, t_lo, t_hi], dtype=(tl.uint32, tl.uint32),
                                          is_pure=True, pack=1)
    if CHECK:
        tl.store(out_ptr + idx * 2, even, mask=live[:, None])
        tl.store(out_ptr + idx * 2 + 1, odd, mask=live[:, None])
    else:
        tl.store(out_ptr + pid, tl.reduce(tl.reduce(even ^ odd, 1, _xor), 0, _xor))


def compile_offline(nb: int = 2048, warps: int = 4, blocks: int = 18, decode: bool = True):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    signature = {"words_ptr": "*u32", "scales_ptr": "*u8", "ref_ptr": "*i32", "out_ptr": "*u32", "slow_ptr": "*i32",
                 "n_blocks": "i32", "BLOCKS": "constexpr", "NB": "constexpr", "S_MIN_": "constexpr",
                 "CHECK": "constexpr", "ASM": "constexpr"}
    constexprs = {"BLOCKS": blocks, "NB": nb, "S_MIN_": S_MIN, "CHECK": False,
                  "ASM": (E2M1_TABLE_ASM if decode else PASS_THROUGH_ASM).value}
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(5)}
    src = ASTSource(_probe_kernel, signature, constexprs, aligned)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})


def sass_counts(nb: int = 2048, warps: int = 4, blocks: int = 18, decode: bool = True):
    """(SASS instruction counts by opcode, decoded elements per thread) of the probe compiled for sm_90: the
    kernel is straight-line, so its static count is what each thread executes."""
    return opcode_counts(sass_of(compile_offline(nb, warps, blocks, decode))), nb * 32 / (32 * warps)


def decode_counts():
    """(the probe's SASS opcode counts, its pass-through twin's, decoded elements per thread)."""
    (ops, elements), (base, _) = sass_counts(), sass_counts(decode=False)
    return ops, base, elements


def decode_per_element(ops, base, elements):
    """SASS instructions per element of the decode alone: the probe less its pass-through twin."""
    return (sum(ops.values()) - sum(base.values())) / elements


def sass_rows():
    """The probe's SASS per element, and the decode's alone (the probe less its pass-through twin)."""
    ops, base, elements = decode_counts()
    total, without = sum(ops.values()), sum(base.values())
    mix = ", ".join(f"{op} {ops[op] - base[op]:+d}" for op in ("PRMT", "LOP3", "SHF", "IMAD", "MOV") if ops[op] != base[op])
    return [f"- probe, sm_90 SASS: {total} instructions a thread for {elements:.0f} elements, {total / elements:.2f} per "
            f"element (loads, table build, xor reduce included); LDL/STL {ops['LDL'] + ops['STL']}",
            f"- the decode alone (the probe less its pass-through twin): {total - without} instructions, "
            f"{decode_per_element(ops, base, elements):.2f} per element ({mix})"]


def slow_share_rows():
    """How many blocks of the kits' own inputs the table cannot hold (s under S_MIN): they need the exact path."""
    sys.path.insert(0, ROOT)
    import reference as mla
    rows = []
    _, scales = mla.generate_input(4, 1, 2048, 5)[1]["mxfp4"]
    rows.append(_slow_row("MLA MXFP4 cache (4 x 2048, seed 5)", scales.reshape(-1, 18)))
    sys.path.insert(0, os.path.join(ROOT, "problems", "paged_mqa_logits"))
    import importlib.util
    spec = importlib.util.spec_from_file_location("paged_reference", os.path.join(
        ROOT, "problems", "paged_mqa_logits", "reference.py"))
    paged = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(paged)
    data = paged.generate_input(batch=8, next_n=1, context=2048, seed=5)
    pages = data[1]["fp4"].reshape(-1, 64 * 68)[:, 4096:].reshape(-1, 4)  # per token: its 4 scale bytes
    rows.append(_slow_row("paged fp4 cache (8 x 2048, seed 5)", pages))
    q_scales = data[0]["fp4"][1].reshape(-1, 4)
    rows.append(_slow_row("paged fp4 q (per token and head)", q_scales))
    return rows


def _slow_row(name, scales):
    e = scales.long()
    s = e - (e.max(1, keepdim=True).values - S_MAX)
    slow = ((s < S_MIN) & (e > 0)).sum().item()  # an all-zero block (scale byte 0) decodes to zeros at any s
    return f"- {name}: {slow} of {e.numel()} blocks under S_MIN ({100 * slow / e.numel():.3f} %)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sass", action="store_true", help="only what needs no GPU: SASS counts and the slow share")
    ap.add_argument("--cache-mb", type=int, default=256,
                    help="size of each layout's cache to time on the GPU, in MiB (4 x the H200's L2 by default)")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "fp4_decode.md"))
    args = ap.parse_args()
    rows = ["# The fp4 table decode", "", results_stamp("python tools/kits/fp4_decode_probe.py" + " --sass" * args.sass)
            + f"; target sm_90 (Triton's ptxas). S_MIN {S_MIN}, S_MAX {S_MAX}.", ""]
    rows += sass_rows() + slow_share_rows()
    if not args.sass and torch.cuda.is_available():
        rows += ["- " + gpu_row(layout, blocks, -(-(args.cache_mb << 20) // (17 * blocks)))
                 for layout, blocks in BLOCKS_PER_TOKEN.items()]
    text = "\n".join(rows) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)


def _inputs(tokens, blocks, seed, device="cuda"):
    """Random packed words (every code), block exponents over 28 binades (many outside the table), e_ref."""
    gen = torch.Generator(device=device).manual_seed(seed)
    words = torch.randint(-2 ** 31, 2 ** 31, (tokens * blocks * 4,), generator=gen, device=device, dtype=torch.int64)
    words = words.to(torch.int32)
    scales = torch.randint(112, 140, (tokens, blocks), generator=gen, device=device, dtype=torch.int32)
    ref = (scales.max(1).values - S_MAX).to(torch.int32)  # e_ref per token
    return words, scales.to(torch.uint8).reshape(-1), ref


def gpu_row(layout, blocks, tokens):
    """Every decoded value of 4096 tokens against E2M1 * 2^s, then the reduce-only kernel's GPU time and
    bytes per second over `tokens` tokens (17 bytes a block: 16 of codes, one of scale)."""
    nb = 2048
    words, scales, ref = _inputs(4096, blocks, 1)
    n = scales.numel()
    out = torch.empty(n * 8, dtype=torch.int32, device="cuda")
    slow = torch.empty(triton.cdiv(n, nb), dtype=torch.int32, device="cuda")
    kw = dict(BLOCKS=blocks, NB=nb, S_MIN_=S_MIN, ASM=E2M1_TABLE_ASM, num_warps=4)
    _probe_kernel[(triton.cdiv(n, nb),)](words, scales, ref, out, slow, n, CHECK=True, **kw)
    wrong = _wrong(words, scales, ref, out, blocks)
    words, scales, ref = _inputs(tokens, blocks, 2)
    n = scales.numel()
    grid = (triton.cdiv(n, nb),)
    red = torch.empty(grid[0], dtype=torch.int32, device="cuda")
    slow = torch.empty(grid[0], dtype=torch.int32, device="cuda")
    us = median_gpu_us(lambda: _probe_kernel[grid](words, scales, ref, red, slow, n, CHECK=False, **kw))
    nbytes = words.numel() * 4 + scales.numel()
    return (f"{layout} ({blocks} blocks a token): 4096 tokens decoded, {wrong} values wrong; {tokens} tokens in "
            f"{us:.1f} us: {nbytes / us / 1e3:.0f} GB/s of fp4 cache, {int(slow.sum())} blocks under S_MIN")


def _wrong(words, scales, ref, out, blocks):
    """Decoded bytes that differ from E2M1 * 2^s (exact in e4m3), over the blocks the table holds."""
    e2m1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], device=words.device)
    b = words.view(torch.uint8).long()
    codes = torch.stack([b & 15, b >> 4], -1).reshape(-1, 32)  # per block, element order
    s = scales.long() - ref.long().repeat_interleave(blocks)
    want = e2m1[codes] * torch.exp2(s.clamp(min=S_MIN).float())[:, None]
    got = out.view(torch.uint8).reshape(-1, 4, 2, 4)  # per block: 4 words, (evens, odds), 4 bytes
    got = got.permute(0, 1, 3, 2).reshape(-1, 32).contiguous().view(torch.float8_e4m3fn).float()
    return int(((got != want) & (s >= S_MIN)[:, None]).sum())


if __name__ == "__main__":
    main()
