"""
Reference for MLA decode attention (DeepSeek forward_absorb path), pure PyTorch.

    out[r, h] = softmax(q[r, h] . K^T * sm_scale) . V       for every query row r of sequence b
    K = the sequence's cache rows, all 576 dims; V = their first 512 dims (kv_lora_rank).

Every query row of a sequence attends to all of that sequence's cache rows (no causal mask).

The input carries one cache in three formats (bf16, fp8 per tensor, MXFP4). A submission may read
any of them; `check_implementation` accepts the output if it matches exact fp32 attention over at
least one of them, or GPU MODE's a8w8 scheme (q rounded to fp8, over fp8; see README "Accuracy rule").

Sections: constants, quantizers (fp8, MXFP4) with their dequantizers, exact attention,
input generation, check.
"""
import math

import torch

from task import input_t, output_t

# DeepSeek-R1 latent attention, 16 query heads per device (tp = 8).
NUM_HEADS = 16
NUM_KV_HEADS = 1
KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
QK_HEAD_DIM = KV_LORA_RANK + QK_ROPE_HEAD_DIM  # 576
V_HEAD_DIM = KV_LORA_RANK  # 512
SM_SCALE = 1.0 / math.sqrt(QK_HEAD_DIM)

FORMATS = ("bf16", "fp8", "mxfp4")

# ---------------------------------------------------------------------------------------------
# fp8 e4m3, one scale per tensor (sglang's scaled_fp8_quant): x ~= fp8 * scale, scale = amax / 448
# ---------------------------------------------------------------------------------------------
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448


# Element-wise conversions of a large cache run over this many rows at a time, so that their fp32
# temporaries stay small (the results are the same as over the whole tensor).
_ROW_CHUNK = 1 << 16


def _by_rows(fn, *tensors):
    """fn over chunks of rows of tensors (the same rows of each), results concatenated along dim 0."""
    rows = tensors[0].shape[0]
    if rows <= _ROW_CHUNK:
        return fn(*tensors)
    parts = [fn(*(t[i:i + _ROW_CHUNK] for t in tensors)) for i in range(0, rows, _ROW_CHUNK)]
    if isinstance(parts[0], tuple):
        return tuple(torch.cat(p) for p in zip(*parts))
    return torch.cat(parts)


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor fp8 e4m3: returns (values e4m3fn with x's shape, scale fp32 of shape (1,))."""
    scale = (x.abs().amax().float() / FP8_MAX).clamp(min=1e-12)
    values = _by_rows(lambda rows: (rows.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), x)
    return values, scale.reshape(1)


def dequantize_fp8(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return values.float() * scale.float()


# ---------------------------------------------------------------------------------------------
# MXFP4 (OCP Microscaling Formats v1.0): blocks of 32 consecutive elements along the last dim share
# one E8M0 scale byte e (value 2^(e-127)); each element is E2M1 (sign, 2 exponent bits, 1 mantissa
# bit: magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6), two per byte, the even element in the low nibble.
# ---------------------------------------------------------------------------------------------
MX_BLOCK = 32
E2M1_EMAX = 2  # exponent of the largest E2M1 magnitude (6 = 1.5 * 2^2)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbouring magnitudes. Round to nearest, ties to the even code: a tie goes up
# exactly when the lower code is odd, so those thresholds compare with >= and the others with >.
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def quantize_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """
    x: (..., N) with N a multiple of 32.
    Returns (packed uint8 (..., N/2), scales uint8 (prod(leading dims), N/32)).
    For the KV cache (total_kv, 1, 576): packed (total_kv, 1, 288), scales (total_kv, 18).
    """
    n = x.shape[-1]
    if n % MX_BLOCK:
        raise ValueError(f"quantize_mxfp4: last dim {n} is not a multiple of {MX_BLOCK}")
    if x.dim() < 2:
        return _quantize_mxfp4_rows(x)
    return _by_rows(_quantize_mxfp4_rows, x)


def _quantize_mxfp4_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    *lead, n = x.shape
    blocks = x.float().reshape(-1, n // MX_BLOCK, MX_BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    # Shared exponent: floor(log2(amax)) - emax(E2M1); all-zero blocks get the smallest scale.
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp(min=1e-38))), torch.full_like(amax, -127.0))
    scale_exp = (exp - E2M1_EMAX).clamp(-127, 127)
    scaled = blocks / torch.exp2(scale_exp)  # exact: the scale is a power of two
    mag = scaled.abs()
    code = torch.zeros_like(mag, dtype=torch.uint8)
    for i, t in enumerate(_E2M1_MIDPOINTS):
        lower_code_is_odd = i % 2 == 1
        code += (mag >= t if lower_code_is_odd else mag > t).to(torch.uint8)  # saturates at code 7 (6.0)
    code |= (scaled < 0).to(torch.uint8) << 3
    code = code.reshape(*lead, n)
    packed = code[..., 0::2] | (code[..., 1::2] << 4)
    scales = (scale_exp + 127).to(torch.uint8).reshape(-1, n // MX_BLOCK)
    return packed.contiguous(), scales.contiguous()


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Inverse of quantize_mxfp4: (..., N/2) uint8 + (rows, N/32) uint8 -> fp32 (..., N)."""
    *lead, half = packed.shape
    n = 2 * half
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(*lead, n).long()
    values = lut[codes & 7] * (1 - 2 * (codes >> 3)).float()
    scale = torch.exp2(scales.float() - 127).reshape(-1, n // MX_BLOCK, 1)
    return (values.reshape(-1, n // MX_BLOCK, MX_BLOCK) * scale).reshape(*lead, n)


def dequantize_cache(kv_data: dict, fmt: str) -> torch.Tensor:
    """The cache in format `fmt` ("bf16", "fp8", "mxfp4") as fp32 (total_kv, 1, 576), whole."""
    return cache_rows(kv_data, fmt)(slice(None)).unsqueeze(1)


# ---------------------------------------------------------------------------------------------
# Exact attention in fp32
# ---------------------------------------------------------------------------------------------
# Sequences are processed in groups padded to the group's longest sequence; a group holds at most
# this many padded cache rows, which bounds the temporary (scores are tiny next to the cache).
_ROWS_PER_GROUP = 1 << 16


def exact_attention(q: torch.Tensor, kv, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                    sm_scale: float, v_dim: int = V_HEAD_DIM) -> torch.Tensor:
    """fp32 attention of q (total_q, H, D) over kv; returns fp32 (total_q, H, v_dim). kv is a (total_kv,
    1, D) tensor, or a function from cache row indices to those rows in fp32 (see cache_rows), so that
    a quantized cache is dequantized one group at a time rather than whole."""
    qo = qo_indptr.tolist()
    kvp = kv_indptr.tolist()
    batch = len(qo) - 1
    total_q, heads, dim = q.shape
    out = torch.empty(total_q, heads, v_dim, dtype=torch.float32, device=q.device)
    if isinstance(kv, torch.Tensor):
        kv2 = kv.reshape(kv.shape[0], dim)
        load, last_row = (lambda rows: kv2[rows].float()), kv2.shape[0] - 1
    else:
        load, last_row = kv, max(kvp[-1] - 1, 0)
    start = 0
    while start < batch:
        # Grow the group while the padded size stays under the bound (always at least one sequence).
        end, longest = start + 1, kvp[start + 1] - kvp[start]
        while end < batch:
            cand = max(longest, kvp[end + 1] - kvp[end])
            if cand * (end + 1 - start) > _ROWS_PER_GROUP:
                break
            longest, end = cand, end + 1
        _attend_group(q, load, last_row, qo, kvp, start, end, max(longest, 1), sm_scale, v_dim, out)
        start = end
    return out


def cache_rows(kv_data: dict, fmt: str):
    """The cache in format `fmt` as a function from row indices (a tensor, or a slice) to those rows in
    fp32 (n, 576): what exact_attention takes, one group at a time, and dequantize_cache whole."""
    if fmt == "bf16":
        return lambda rows: kv_data["bf16"][rows, 0].float()
    if fmt == "fp8":
        values, scale = kv_data["fp8"]
        return lambda rows: dequantize_fp8(values[rows, 0], scale)
    if fmt == "mxfp4":
        packed, scales = kv_data["mxfp4"]
        return lambda rows: dequantize_mxfp4(packed[rows, 0], scales[rows])
    raise ValueError(f"unknown KV format {fmt!r}; expected one of {FORMATS}")


def _attend_group(q, load, last_row, qo, kvp, start, end, longest, sm_scale, v_dim, out):
    n = end - start
    qlen = max(qo[b + 1] - qo[b] for b in range(start, end))
    heads, dim = q.shape[1], q.shape[2]
    device = q.device
    lens = torch.tensor([kvp[b + 1] - kvp[b] for b in range(start, end)], device=device)
    pos = torch.arange(longest, device=device)
    valid = pos[None, :] < lens[:, None]  # (n, longest)
    rows = (torch.tensor(kvp[start:end], device=device)[:, None] + pos[None, :]).clamp(max=last_row)
    keys = load(rows.reshape(-1)).reshape(n, longest, dim)
    qs = torch.zeros(n, qlen * heads, dim, dtype=torch.float32, device=device)
    for i, b in enumerate(range(start, end)):
        qs[i, : (qo[b + 1] - qo[b]) * heads] = q[qo[b]:qo[b + 1]].float().reshape(-1, dim)
    scores = torch.bmm(qs, keys.transpose(1, 2)) * sm_scale  # (n, qlen*H, longest)
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # an empty sequence gives zeros
    o = torch.bmm(probs, keys[..., :v_dim])
    for i, b in enumerate(range(start, end)):
        out[qo[b]:qo[b + 1]] = o[i, : (qo[b + 1] - qo[b]) * heads].reshape(-1, heads, v_dim)


# ---------------------------------------------------------------------------------------------
# Input generation
# ---------------------------------------------------------------------------------------------
# With q and K i.i.d. N(0, 1), attention is nearly uniform and its output is close to a closed form
# of q alone (a published submission passed by returning sm_scale * q[:512]). These inputs make the
# answer depend on the cache: token norms vary, each sequence has a few dominant tokens at random
# positions, and every head's query points at a random mix of them, so attention is peaky. The rope
# dims carry a larger share of the score so that dropping them changes the answer.
_NORM_SPREAD = 0.3  # log-normal sigma of per-token key norms
_ROPE_GAIN = 2.0  # std of the 64 rope dims of keys and queries, against 1 for the 512 latent dims
_Q_NOISE = 0.5  # std of the query's random part (latent dims; rope dims get _ROPE_GAIN times that)
_DOMINANT_MAX = 16  # dominant tokens per sequence (fewer for short sequences)
_FOCUS_LOGIT = (-1.0, 2.0)  # extra logit over log(len) that a head gives its dominant mix, uniform range


def _kv_lengths(batch: int, kvseqlen: int, ragged: bool, gen: torch.Generator) -> list[int]:
    if not ragged:
        return [kvseqlen] * batch
    # Uniform in [1, 2*kvseqlen - 1] (mean kvseqlen); the first sequence has length 1.
    lens = torch.randint(1, 2 * kvseqlen, (batch,), generator=gen, device=gen.device).tolist()
    lens[0] = 1
    return lens


def generate_input(batchsize: int, qseqlen: int, kvseqlen: int, seed: int, ragged: int = 0) -> input_t:
    """Deterministic from the arguments (on CUDA when present, else on the CPU)."""
    for name, value, low in (("batchsize", batchsize, 1), ("qseqlen", qseqlen, 1), ("kvseqlen", kvseqlen, 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"generate_input: {name} must be an integer >= {low}, got {value!r}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, device=device)

    lens = _kv_lengths(batchsize, kvseqlen, bool(ragged), gen)
    total_kv, total_q = sum(lens), batchsize * qseqlen
    dim_gain = torch.ones(QK_HEAD_DIM, device=device)
    dim_gain[KV_LORA_RANK:] = _ROPE_GAIN

    norms = torch.exp(_NORM_SPREAD * randn(total_kv, 1))
    keys = randn(total_kv, QK_HEAD_DIM).mul_(dim_gain).mul_(norms)  # in place: one cache-sized fp32 tensor

    queries = _Q_NOISE * randn(total_q, NUM_HEADS, QK_HEAD_DIM) * dim_gain
    start = 0
    for b, length in enumerate(lens):
        n_dom = min(_DOMINANT_MAX, length)
        dom = start + torch.randperm(length, generator=gen, device=device)[:n_dom]
        # Each head of each query row points at its own random mix of the dominant keys.
        mix = torch.softmax(randn(qseqlen, NUM_HEADS, n_dom), dim=-1)
        target = mix @ keys[dom]  # (qseqlen, H, D)
        target = target / target.norm(dim=-1, keepdim=True).clamp(min=1e-6)
        lo, hi = _FOCUS_LOGIT
        logit = math.log(length + 1) + lo + (hi - lo) * rand(qseqlen, NUM_HEADS, 1)
        # A key of typical norm (about 1/sm_scale) along target_dir gains about `logit` in its score.
        queries[b * qseqlen:(b + 1) * qseqlen] += target * logit
        start += length

    q = queries.to(torch.bfloat16)
    kv_bf16 = keys.to(torch.bfloat16).reshape(total_kv, NUM_KV_HEADS, QK_HEAD_DIM)
    del keys, queries
    kv_data = {
        "bf16": kv_bf16,
        "fp8": quantize_fp8(kv_bf16),
        "mxfp4": quantize_mxfp4(kv_bf16),
    }
    qo_indptr = (torch.arange(batchsize + 1, device=device) * qseqlen).to(torch.int32)
    kv_indptr = torch.tensor([0] + lens, device=device).cumsum(0).to(torch.int32)
    config = {
        "batch_size": batchsize,
        "num_heads": NUM_HEADS,
        "num_kv_heads": NUM_KV_HEADS,
        "qk_head_dim": QK_HEAD_DIM,
        "kv_lora_rank": KV_LORA_RANK,
        "qk_rope_head_dim": QK_ROPE_HEAD_DIM,
        "v_head_dim": V_HEAD_DIM,
        "q_seq_len": qseqlen,
        "kv_seq_len": kvseqlen,
        "sm_scale": SM_SCALE,
    }
    return q, kv_data, qo_indptr, kv_indptr, config


def ref_kernel(data: input_t) -> output_t:
    """Exact fp32 attention over the bf16 cache, returned in bf16."""
    q, kv_data, qo_indptr, kv_indptr, config = data
    return exact_attention(q, kv_data["bf16"], qo_indptr, kv_indptr, config["sm_scale"]).to(torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# Check
# ---------------------------------------------------------------------------------------------
# Accuracy rule (README "Accuracy rule" gives the calibration): the output passes if, against at least
# one of the RESULTS (exact fp32 attention over each of the three caches, and GPU MODE's a8w8 scheme),
#   every element:  |out - ref| <= ATOL_RMS * rms(ref) + RTOL * |ref|
#   and overall:    ||out - ref||_2 / ||ref||_2 <= REL_L2_TOL
# a8w8 is a result of its own because rounding q to fp8 moves the output by as much as the input's
# attention is sensitive to its scores: against the fp8 result it reaches the bounds on about one input
# in 2,000 (tools/mla/calibrate_check.py --tail), so a kernel doing exactly what the upstream problem's
# reference does would fail now and then.
RESULTS = FORMATS + ("a8w8",)
ATOL_RMS = 0.5
RTOL = 0.05
REL_L2_TOL = 0.04


def compare(output: torch.Tensor, ref: torch.Tensor) -> dict:
    """Error statistics of output against ref (both converted to fp32)."""
    out = output.float()
    diff = (out - ref).abs()
    rms = ref.pow(2).mean().sqrt().item()
    bound = ATOL_RMS * rms + RTOL * ref.abs()
    excess = diff - bound
    worst = int(excess.argmax()) if excess.numel() else 0
    return {
        "rel_l2": (diff.norm() / ref.norm().clamp(min=1e-30)).item(),
        "bad": int((excess > 0).sum()),
        "worst_index": tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), ref.shape)) if ref.numel() else (),
        "worst_got": out.flatten()[worst].item() if ref.numel() else 0.0,
        "worst_want": ref.flatten()[worst].item() if ref.numel() else 0.0,
    }


def _check_output_form(q: torch.Tensor, output) -> str:
    """'' if output has the right type, shape, dtype, device and finite values, else why not."""
    want_shape = (q.shape[0], NUM_HEADS, V_HEAD_DIM)
    if not isinstance(output, torch.Tensor):
        return f"output must be a torch.Tensor, got {type(output).__name__}"
    if tuple(output.shape) != want_shape:
        return f"output shape {tuple(output.shape)}, expected {want_shape}"
    if output.dtype != torch.bfloat16:
        return f"output dtype {output.dtype}, expected torch.bfloat16"
    if output.device != q.device:
        return f"output on {output.device}, expected {q.device}"
    n_nan = int(torch.isnan(output).sum())
    n_inf = int(torch.isinf(output).sum())
    if n_nan or n_inf:
        return f"output has {n_nan} NaN and {n_inf} Inf values"
    return ""


def exact_result(data: input_t, name: str) -> torch.Tensor:
    """One of RESULTS in fp32: exact attention of q over the cache in format `name`, or for "a8w8" of q
    rounded to fp8 per tensor (quantize_fp8, as the upstream problem's reference does) over the fp8 cache."""
    q, kv_data, qo_indptr, kv_indptr, config = data
    if name == "a8w8":
        q, name = dequantize_fp8(*quantize_fp8(q)), "fp8"
    return exact_attention(q, cache_rows(kv_data, name), qo_indptr, kv_indptr, config["sm_scale"])


def describe_result(name: str) -> str:
    if name == "a8w8":
        return "GPU MODE's a8w8 scheme (exact attention of q rounded to fp8 per tensor, over the fp8 cache)"
    return f"exact attention over the {name} cache"


def make_checker(data: input_t):
    """The check of one input, with every one of RESULTS computed once: the returned function takes an
    output and gives (True, the closest result it matches) or (False, why not), never raising on a bad
    output. Every result is compared, so the message names the one the output is closest to (an fp8
    kernel is also within tolerance of the bf16 result, at ~15x the distance)."""
    refs = {name: exact_result(data, name) for name in RESULTS}
    q = data[0]

    def check(output) -> tuple[bool, str]:
        problem = _check_output_form(q, output)
        if problem:
            return False, problem
        report, passed = [], []
        for name, ref in refs.items():
            s = compare(output, ref)
            if s["bad"] == 0 and s["rel_l2"] <= REL_L2_TOL:
                passed.append((s["rel_l2"], name))
            report.append(
                f"{name}: rel L2 {s['rel_l2']:.4f} (limit {REL_L2_TOL}), {s['bad']} elements out of tolerance, "
                f"worst at (row, head, dim) {s['worst_index']}: got {s['worst_got']:.5g}, want {s['worst_want']:.5g}")
        if passed:
            rel_l2, name = min(passed)
            return True, f"matches {describe_result(name)} (rel L2 {rel_l2:.4f})"
        return False, "output matches exact attention over none of the caches, nor a8w8: " + "; ".join(report)

    return check


def check_implementation(data: input_t, output: output_t) -> tuple[bool, str]:
    """GPU MODE's check: (True, message) or (False, why not); see make_checker."""
    return make_checker(data)(output)


def input_bytes(batchsize: int, qseqlen: int, kvseqlen: int, seed: int = 0, ragged: int = 0) -> int:
    """The bytes of one input of these sizes, at most (ragged lengths are below 2 * kvseqlen), known
    before it is generated: what the judge weighs against the machine's memory."""
    tokens = batchsize * (2 * kvseqlen - 1 if ragged else kvseqlen)
    per_token = QK_HEAD_DIM * 2 + QK_HEAD_DIM + QK_HEAD_DIM // 2 + QK_HEAD_DIM // MX_BLOCK  # bf16, fp8, MXFP4
    return tokens * per_token + batchsize * qseqlen * NUM_HEADS * (QK_HEAD_DIM + V_HEAD_DIM) * 2


def min_bytes(data: input_t) -> int:
    """The fewest bytes one call must move through device memory: q and the smallest cache (MXFP4)
    read once, the output written once. The judge's memory floor is this over the device's peak
    bandwidth: no correct call is faster."""
    q, kv_data, qo_indptr, kv_indptr, _ = data
    packed, scales = kv_data["mxfp4"]
    output = q.shape[0] * NUM_HEADS * V_HEAD_DIM * 2
    return sum(t.numel() * t.element_size() for t in (q, packed, scales, qo_indptr, kv_indptr)) + output
