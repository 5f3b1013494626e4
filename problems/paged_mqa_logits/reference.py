"""
Reference for paged MQA logits (DeepGEMM's fp8_fp4_paged_mqa_logits: DeepSeek-V3.2's lightning indexer
scoring a paged key cache), pure PyTorch.

For each query row r = b * next_n + i (sequence b, draft position i) and cache position t:

    logits[r, t] = sum_h weights[r, h] * relu(q[b, i, h] . k_t)       if t <= context_lens[b] - next_n + i
                 = -inf                                                otherwise (up to max_model_len)

k_t is token t of sequence b, stored in physical block block_tables[b, t // 64] at row t % 64.

The input carries q and the cache in two formats (fp8 e4m3 with per-token fp32 key scales, and fp4
E2M1 with UE8M0 scales per 32 elements). A submission may compute from either pair;
`check_implementation` accepts the output if it matches the exact fp32 result over one pair
(README "Accuracy rule").

Sections: constants, fp8 layout, fp4 layout, exact logits, input generation, check.
"""
import math

import torch

from task import input_t, output_t

NUM_HEADS = 64
HEAD_DIM = 128
BLOCK_SIZE = 64
FORMATS = ("fp8", "fp4")

# Accuracy rule: |out - ref| <= RTOL * bound + ATOL on every valid position, where
# bound[r, t] = sum_h |weights[r, h]| * sum_d |q[b, i, h, d] * k_t[d]| (README "Accuracy rule").
RTOL = 2.0 ** -10
ATOL = 1e-5

# ---------------------------------------------------------------------------------------------
# fp8 cache (DeepGEMM's layout). Each block's 64 * 132 bytes: 64 x 128 e4m3 values (token-major),
# then 64 fp32 scales. k_t = float(value) * scale_t, scale_t = amax(|k_t|) / 448.
# ---------------------------------------------------------------------------------------------
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
FP8_ROW_BYTES = HEAD_DIM + 4            # 132: the last dim of the cache view
FP8_BLOCK_BYTES = BLOCK_SIZE * FP8_ROW_BYTES  # 8448


def quantize_fp8_tokens(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k (..., 128) fp32 -> (values e4m3fn (..., 128), scales fp32 (...,)), per-token amax / 448."""
    amax = k.abs().float().amax(dim=-1, keepdim=True).clamp(min=1e-4)
    scale = amax / FP8_MAX
    values = (k.float() * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return values, scale.squeeze(-1)


def pack_fp8_cache(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """values e4m3 (nb, 64, 128), scales fp32 (nb, 64) -> uint8 (nb, 64, 1, 132)."""
    nb = values.shape[0]
    v = values.contiguous().view(torch.uint8).reshape(nb, BLOCK_SIZE * HEAD_DIM)
    s = scales.float().contiguous().view(torch.uint8).reshape(nb, BLOCK_SIZE * 4)
    return torch.cat([v, s], dim=1).reshape(nb, BLOCK_SIZE, 1, FP8_ROW_BYTES)


def unpack_fp8_cache(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 (nb, 64, 1, 132) -> (values e4m3 (nb, 64, 128), scales fp32 (nb, 64))."""
    flat = cache.reshape(cache.shape[0], FP8_BLOCK_BYTES)
    values = flat[:, : BLOCK_SIZE * HEAD_DIM].contiguous().view(FP8).reshape(-1, BLOCK_SIZE, HEAD_DIM)
    scales = flat[:, BLOCK_SIZE * HEAD_DIM:].contiguous().view(torch.float32).reshape(-1, BLOCK_SIZE)
    return values, scales


def dequantize_fp8_cache(cache: torch.Tensor) -> torch.Tensor:
    values, scales = unpack_fp8_cache(cache)
    return values.float() * scales.unsqueeze(-1)


# ---------------------------------------------------------------------------------------------
# fp4: E2M1 elements (sign, 2 exponent bits, 1 mantissa bit: magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6),
# two per byte, the even element in the low nibble; one UE8M0 scale byte e per 32 consecutive
# elements (value 2^(e - 127)), chosen as 2^ceil(log2(amax / 6)) so nothing saturates; elements
# round to nearest, ties to the even code.
# Cache: each block's 64 * 68 bytes: 64 x 64 packed bytes (token-major), then 64 x 4 scale bytes
# (token-major, group g of token t at byte 4t + g). q: packed (b, n, 64, 64), scales (b, n, 64, 4).
# ---------------------------------------------------------------------------------------------
FP4_GROUP = 32
FP4_ROW_BYTES = HEAD_DIM // 2 + 4       # 68
FP4_BLOCK_BYTES = BLOCK_SIZE * FP4_ROW_BYTES  # 4352
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# midpoint between code c and c + 1; a tie goes to the even code, i.e. up when c is odd
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def quantize_fp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., N), N % 32 == 0 -> (packed uint8 (..., N/2), scales uint8 (..., N/32))."""
    *lead, n = x.shape
    g = x.float().reshape(*lead, n // FP4_GROUP, FP4_GROUP)
    amax = g.abs().amax(dim=-1, keepdim=True).clamp(min=1e-30)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = g / torch.exp2(exp)  # exact: a power of two
    mag = scaled.abs()
    code = torch.zeros_like(mag, dtype=torch.uint8)
    for c, mid in enumerate(_E2M1_MIDPOINTS):
        code += (mag >= mid if c % 2 else mag > mid).to(torch.uint8)
    nib = code | ((scaled < 0).to(torch.uint8) << 3)
    nib = nib.reshape(*lead, n)
    packed = nib[..., 0::2] | (nib[..., 1::2] << 4)
    scales = (exp + 127).to(torch.uint8).squeeze(-1)
    return packed.contiguous(), scales.contiguous()


def dequantize_fp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """packed uint8 (..., N/2), scales uint8 (..., N/32) -> fp32 (..., N)."""
    lut = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32, device=packed.device)
    lo = (packed & 0xF).long()
    hi = (packed >> 4).long()
    vals = torch.stack([lut[lo], lut[hi]], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    *lead, n = vals.shape
    s = torch.exp2(scales.float() - 127.0)
    return (vals.reshape(*lead, n // FP4_GROUP, FP4_GROUP) * s.unsqueeze(-1)).reshape(*lead, n)


def pack_fp4_cache(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """packed uint8 (nb, 64, 64), scales uint8 (nb, 64, 4) -> uint8 (nb, 64, 1, 68)."""
    nb = packed.shape[0]
    return torch.cat([packed.reshape(nb, -1), scales.reshape(nb, -1)], dim=1).reshape(nb, BLOCK_SIZE, 1, FP4_ROW_BYTES)


def unpack_fp4_cache(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 (nb, 64, 1, 68) -> (packed (nb, 64, 64), scales (nb, 64, 4))."""
    flat = cache.reshape(cache.shape[0], FP4_BLOCK_BYTES)
    packed = flat[:, : BLOCK_SIZE * HEAD_DIM // 2].reshape(-1, BLOCK_SIZE, HEAD_DIM // 2)
    scales = flat[:, BLOCK_SIZE * HEAD_DIM // 2:].reshape(-1, BLOCK_SIZE, HEAD_DIM // FP4_GROUP)
    return packed, scales


def dequantize_fp4_cache(cache: torch.Tensor) -> torch.Tensor:
    return dequantize_fp4(*unpack_fp4_cache(cache))


def dequantize_pair(data: input_t, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(q fp32 (b, n, 64, 128), per-physical-block keys fp32 (nb, 64, 128)) of one format pair."""
    q, kv_cache = data[0], data[1]
    if fmt == "fp8":
        return q["fp8"].float(), dequantize_fp8_cache(kv_cache["fp8"])
    if fmt == "fp4":
        return dequantize_fp4(*q["fp4"]), dequantize_fp4_cache(kv_cache["fp4"])
    raise ValueError(f"unknown format {fmt!r}")


# ---------------------------------------------------------------------------------------------
# exact logits
# ---------------------------------------------------------------------------------------------
def _tf32_off():
    class _Ctx:
        def __enter__(self):
            self.saved = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = False

        def __exit__(self, *exc):
            torch.backends.cuda.matmul.allow_tf32 = self.saved

    return _Ctx()


def valid_mask(context_lens: torch.Tensor, next_n: int, max_model_len: int) -> torch.Tensor:
    """(batch * next_n, max_model_len) bool: t <= context_lens[b] - next_n + i."""
    t = torch.arange(max_model_len, device=context_lens.device)
    i = torch.arange(next_n, device=context_lens.device)
    limit = context_lens.long()[:, None] - next_n + i[None, :]  # (b, n)
    return (t[None, None, :] <= limit[:, :, None]).reshape(-1, max_model_len)


def exact_logits(qf, kf, weights, context_lens, block_tables, max_model_len, with_bound=False, relu=True):
    """fp32 logits (and, with_bound, the error bound sum_h |w| sum_d |q k|) from dequantized q and keys.
    relu=False drops the relu: the classic wrong answer that the tests and calibrate.py must see fail."""
    batch, next_n, heads, dim = qf.shape
    rows = batch * next_n
    out = torch.full((rows, max_model_len), float("-inf"), dtype=torch.float32, device=qf.device)
    bound = torch.zeros((rows, max_model_len), dtype=torch.float32, device=qf.device) if with_bound else None
    w = weights.float().reshape(batch, next_n, heads)
    lens = context_lens.tolist()
    bt = block_tables.long()
    with _tf32_off():
        for b in range(batch):
            length = min(int(lens[b]), max_model_len)
            if length <= 0:
                continue
            pages = (length + BLOCK_SIZE - 1) // BLOCK_SIZE
            k = kf[bt[b, :pages]].reshape(-1, dim)[:length]                      # (L, D)
            s = torch.matmul(qf[b].reshape(next_n * heads, dim), k.t())          # (n*H, L)
            s = s.relu() if relu else s
            logit = (w[b].unsqueeze(-1) * s.reshape(next_n, heads, length)).sum(1)  # (n, L)
            out[b * next_n:(b + 1) * next_n, :length] = logit
            if with_bound:
                a = (w[b].abs().unsqueeze(-1) * qf[b].abs()).sum(1)              # (n, D)
                bound[b * next_n:(b + 1) * next_n, :length] = torch.matmul(a, k.abs().t())
    mask = valid_mask(context_lens, next_n, max_model_len)
    out = out.masked_fill(~mask, float("-inf"))
    return (out, bound) if with_bound else out


def logits_for_format(data: input_t, fmt: str, with_bound=False):
    _, _, weights, context_lens, block_tables, max_model_len = data
    qf, kf = dequantize_pair(data, fmt)
    return exact_logits(qf, kf, weights, context_lens, block_tables, max_model_len, with_bound)


def ref_kernel(data: input_t) -> output_t:
    """Exact fp32 logits over the fp8 pair (fp8 q x fp8 cache)."""
    return logits_for_format(data, "fp8")


# ---------------------------------------------------------------------------------------------
# input generation
# ---------------------------------------------------------------------------------------------
def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def generate_input(batch: int, next_n: int, context: int, seed: int, random: int = 1) -> input_t:
    """
    Deterministic from the spec. Context lengths: uniform in [ceil(0.7 c), floor(1.3 c)] (random=1)
    or all c; max_model_len = the largest possible length rounded up to 64. The physical block pool
    holds the blocks in use plus ~10% spare, in random order (block tables are a random permutation,
    never the identity); unused table entries point at random blocks. Keys are Gaussian with
    per-token magnitudes spread over e^(+-1); q Gaussian, so scores take both signs; weights
    Gaussian times 2^U(-3, 3), both signs, varied magnitude.
    """
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    lo = max(1, math.ceil(0.7 * context)) if random else context
    hi = max(lo, math.floor(1.3 * context)) if random else context
    max_model_len = _round_up(max(hi, 1), BLOCK_SIZE)
    max_pages = max_model_len // BLOCK_SIZE
    context_lens = torch.randint(lo, hi + 1, (batch,), generator=gen, device=device, dtype=torch.int32)
    pages = ((context_lens.long() + BLOCK_SIZE - 1) // BLOCK_SIZE)
    used = int(pages.sum())
    num_blocks = used + used // 10 + 1
    perm = torch.randperm(num_blocks, generator=gen, device=device).to(torch.int32)
    block_tables = torch.randint(0, num_blocks, (batch, max_pages), generator=gen, device=device, dtype=torch.int32)
    starts = torch.cumsum(pages, 0) - pages
    col = torch.arange(max_pages, device=device)
    in_use = col[None, :] < pages[:, None]
    idx = (starts[:, None] + col[None, :]).clamp(max=num_blocks - 1)
    block_tables = torch.where(in_use, perm[idx], block_tables).contiguous()

    # keys, one row per physical slot (unused slots hold data too)
    k = torch.randn(num_blocks, BLOCK_SIZE, HEAD_DIM, generator=gen, device=device)
    k = k * torch.exp(2 * torch.rand(num_blocks, BLOCK_SIZE, 1, generator=gen, device=device) - 1)
    k_fp8, k_scale = quantize_fp8_tokens(k)
    k_fp4, k_sf = quantize_fp4(k)
    kv_cache = {"fp8": pack_fp8_cache(k_fp8, k_scale), "fp4": pack_fp4_cache(k_fp4, k_sf)}

    q = torch.randn(batch, next_n, NUM_HEADS, HEAD_DIM, generator=gen, device=device)
    q_fp4 = quantize_fp4(q)
    qd = {"fp8": q.to(FP8).contiguous(), "fp4": q_fp4}

    w = torch.randn(batch * next_n, NUM_HEADS, generator=gen, device=device)
    w = w * torch.exp2(6 * torch.rand(batch * next_n, NUM_HEADS, generator=gen, device=device) - 3)
    return qd, kv_cache, w.contiguous(), context_lens, block_tables, max_model_len


# ---------------------------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------------------------
def _positions(mask: torch.Tensor, limit: int = 4) -> str:
    idx = mask.nonzero()[:limit].tolist()
    return ", ".join(f"(row {r}, t {t})" for r, t in idx)


def _expected(data: input_t, fmt: str):
    """(exact fp32 logits, their error bound) over one format pair."""
    return logits_for_format(data, fmt, with_bound=True)


def compare(data: input_t, output: torch.Tensor, fmt: str, expected=None) -> tuple[bool, str, float]:
    """(passed, message, badness) of output against the exact fp32 result over one format pair
    (expected: that pair's _expected(data, fmt), when already computed)."""
    _, _, weights, context_lens, block_tables, max_model_len = data
    next_n = data[0]["fp8"].shape[1]
    ref, bound = expected if expected is not None else _expected(data, fmt)
    out = output.detach().to(device=ref.device, dtype=torch.float32)
    valid = valid_mask(context_lens, next_n, max_model_len)
    not_neg_inf = ~torch.isneginf(out) & ~valid
    if not_neg_inf.any():
        n = int(not_neg_inf.sum())
        return False, (f"{n} position(s) outside the causal window (t > context_len - next_n + i, up to "
                       f"max_model_len) are not -inf, e.g. {_positions(not_neg_inf)}"), 1e30 + n
    nonfinite = ~torch.isfinite(out) & valid
    if nonfinite.any():
        n = int(nonfinite.sum())
        return False, f"{n} valid position(s) are NaN or +-inf, e.g. {_positions(nonfinite)}", 1e20 + n
    err = (out - ref).abs().masked_fill(~valid, 0.0)
    tol = RTOL * bound + ATOL
    bad = err > tol
    ratio = (err / tol).masked_fill(~valid, 0.0)
    worst = float(ratio.max()) if ratio.numel() else 0.0
    if bad.any():
        n = int(bad.sum())
        r, t = divmod(int(ratio.argmax()), max_model_len)
        rows = torch.unique(bad.nonzero()[:, 0])
        return False, (f"vs exact fp32 over the {fmt} pair: {n} of {int(valid.sum())} valid positions exceed "
                       f"|out - ref| <= {RTOL:.3g} * bound + {ATOL:g} (in rows {rows[:8].tolist()}"
                       f"{' ...' if len(rows) > 8 else ''}); worst at (row {r}, t {t}): out {float(out[r, t]):.6g}, "
                       f"ref {float(ref[r, t]):.6g}, |err| {float(err[r, t]):.3g}, bound {float(bound[r, t]):.4g}, "
                       f"err / tol {worst:.3g}; max |err| {float(err.max()):.3g}"), worst
    return True, f"matches the {fmt} pair (max err / tol {worst:.3g})", worst


def make_checker(data: input_t):
    """The check of one input, with the exact results over both pairs computed once: the returned
    function takes an output and gives (True, message) or (False, why not, naming the closest pair),
    never raising on a bad output."""
    _, _, weights, context_lens, _, max_model_len = data
    expected = {fmt: _expected(data, fmt) for fmt in FORMATS}

    def check(output) -> tuple[bool, str]:
        try:
            rows = weights.shape[0]
            if not isinstance(output, torch.Tensor):
                return False, f"output is a {type(output).__name__}, expected a torch.Tensor"
            if tuple(output.shape) != (rows, max_model_len):
                return False, f"output shape {tuple(output.shape)}, expected {(rows, max_model_len)}"
            if output.dtype != torch.float32:
                return False, f"output dtype {output.dtype}, expected torch.float32"
            if torch.isnan(output).any():
                n = int(torch.isnan(output).sum())
                return False, f"output has {n} NaN(s), e.g. {_positions(torch.isnan(output))}"
            results = [compare(data, output, fmt, expected[fmt]) for fmt in FORMATS]
            for ok, msg, _ in results:
                if ok:
                    return True, msg
            best = min(range(len(FORMATS)), key=lambda j: results[j][2])
            others = "; ".join(f"{FORMATS[j]}: {results[j][1][:160]}" for j in range(len(FORMATS)) if j != best)
            return False, f"{results[best][1]} [closest pair: {FORMATS[best]}; also {others}]"
        except Exception as exc:  # never raise on bad output
            return False, f"check failed on this output: {type(exc).__name__}: {exc}"

    return check


def check_implementation(data: input_t, output: output_t) -> tuple[bool, str]:
    """GPU MODE's check: (True, message) or (False, why not); see make_checker."""
    return make_checker(data)(output)


def input_bytes(batch: int, next_n: int, context: int, seed: int = 0, random: int = 1) -> int:
    """The bytes of one input of these sizes, at most, known before it is generated: what the judge
    weighs against the machine's memory (the fp32 keys of the generation included)."""
    hi = max(math.floor(1.3 * context), 1) if random else max(context, 1)
    max_model_len = _round_up(hi, BLOCK_SIZE)
    blocks = batch * (max_model_len // BLOCK_SIZE) * 11 // 10 + 1
    per_token = HEAD_DIM * 4 + FP8_ROW_BYTES + FP4_ROW_BYTES  # fp32 keys while generating, both caches
    rows = batch * next_n
    return blocks * BLOCK_SIZE * per_token + rows * (max_model_len * 4 + NUM_HEADS * HEAD_DIM * 2 + NUM_HEADS * 4)


def min_bytes(data: input_t) -> int:
    """The fewest bytes one call must move through device memory: the fp4 pair (the smaller) read once
    for the tokens in use, the weights, context lengths and used block-table entries read, the whole
    output written. The judge's memory floor is this over the device's peak bandwidth."""
    q, _, weights, context_lens, block_tables, max_model_len = data
    q_packed, q_scales = q["fp4"]
    tokens = int(context_lens.clamp(min=0, max=max_model_len).sum())
    pages = int(((context_lens.clamp(min=0, max=max_model_len) + BLOCK_SIZE - 1) // BLOCK_SIZE).sum())
    output = weights.shape[0] * max_model_len * 4
    reads = sum(t.numel() * t.element_size() for t in (q_packed, q_scales, weights, context_lens))
    return reads + tokens * FP4_ROW_BYTES + pages * block_tables.element_size() + output
