#!POPCORN leaderboard paged-mqa-logits
#!POPCORN gpu H100
"""
Paged MQA logits on Hopper: a Triton kernel reading either format pair (constexpr FMT), and a Gluon
kernel for each pair (plan formats "fp8w" and "fp4w"; "fp4ws" the fp4 one warp-specialised).

Grid (page chunks, batch). A program loads its sequence's q rows and weights once (q stays on chip
for the whole page loop), then walks CHUNK logical pages; each page's keys come in by TMA, the page
loop software-pipelined NUM_STAGES deep; the scores S[64 tokens, next_n * 64 heads] = K_page . q^T
come from tensor-core dots, and the epilogue (relu, x weight, sum over heads, causal mask) writes
each row's 64 logits once. Pages past the context are written -inf by the same program, so the
whole (rows, max_model_len) output is written exactly once, by this one kernel.

  fp8 pair: the cache viewed as a 2-D fp8 matrix of 128-byte rows (block blk's tokens are rows
      66 blk .. 66 blk + 63, its fp32 scales the next two rows); one fp8 wgmma dot per page (QGMMA),
      the per-token scale applied after the head sum (it is positive, so it commutes with relu).
  fp4 pair: the cache viewed as 64-byte rows (block blk's packed tokens are rows 68 blk .. 68 blk + 63,
      the 4 UE8M0 scale bytes of token t the int32 word 1088 blk + 1024 + t). Keys and q are
      dequantized in registers to bf16 exactly (E2M1 x 2^(e-127) is a bf16 value for every e), the
      block scales folded in, so one bf16 wgmma pair per page (HGMMA; even and odd elements) gives
      the exact products summed in fp32. Half the cache bytes of fp8, but on the H200 it is slower
      (docs/paged_design.md, "The fp4 kernels"), so PLANS read fp8.
  fp8w (Gluon): the fp8 pair as the Triton kernel reads it, keys and key scales by TMA on one mbarrier
      a page, the logits stored from the reduction's layout (no layout conversion). PLANS route six of
      the seven benchmark shapes to it (docs/paged_design.md has the sweep).
  fp4w (Gluon): the fp4 pair with the keys read from shared memory straight into the wgmma register
      operand and decoded there to e5m2 with the block scales folded in; one fp8 wgmma pair per page
      (QGMMA). Issue-bound (the decode and the epilogue), still slower than fp8, so no plan uses it.

Per-shape plans (PLANS) pick the input pair, the kernel, chunk, pipeline depth and which loads use TMA.

Host path: the first call of an input signature routes, compiles through Triton's JIT and caches a
_Route; later calls launch the compiled kernel through Triton's C launcher with pre-expanded arguments
(_DirectLaunch), so that a call's host time stays a few microseconds (the judge shows it as host/call).

Falls back to the reference (one log line with the reason) without CUDA, off sm_90, when Triton
lacks tensor descriptors, or when the input breaks a layout assumption.
Assumptions not checked (checking needs a device sync): 0 <= context_lens <= max_model_len and
block_tables entries of pages in use are valid block ids.
"""
import logging
import os
from typing import NamedTuple

import torch

from task import input_t, output_t

try:
    import triton
    import triton.language as tl
    from triton import knobs
    from triton.tools.tensor_descriptor import TensorDescriptor
    _TRITON_ERROR = None
except Exception as exc:  # pragma: no cover - depends on the install
    triton = tl = TensorDescriptor = knobs = None
    _TRITON_ERROR = f"{type(exc).__name__}: {exc}"
try:  # Gluon (Triton's explicit-layout dialect): the fp4 kernel that keeps decoded keys in registers
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma as gtma,
                                                                   warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
    _GLUON_ERROR = None
except Exception as exc:  # pragma: no cover - depends on the install
    gluon = gl = None
    _GLUON_ERROR = f"{type(exc).__name__}: {exc}"

H, D, BLOCK = 64, 128, 64
FMT_FP8, FMT_FP4 = 8, 4
# The kernels a plan can name: the Triton kernel (either pair), the Gluon kernel of the pair (fp4: keys
# decoded into the wgmma register operand), and the fp4 Gluon kernel warp-specialised.
TRITON, GLUON, GLUON_WS = "triton", "gluon", "gluon-ws"
# A plan's route, its pair and kernel in one name (Plan.fmt; the sweeps' and tests' compact tuples start with
# it): the pair, then "w" for its Gluon kernel, "ws" for the warp-specialised one.
ROUTE_SUFFIX = {TRITON: "", GLUON: "w", GLUON_WS: "ws"}
_KERNEL_OF_SUFFIX = {suffix: kernel for kernel, suffix in ROUTE_SUFFIX.items()}
FMT_IDS = {"fp8": FMT_FP8, "fp4": FMT_FP4, "fp4w": FMT_FP4, "fp4ws": FMT_FP4, "fp8w": FMT_FP8}
PAIR = {"fp8": "fp8", "fp4": "fp4", "fp4w": "fp4", "fp4ws": "fp4", "fp8w": "fp8"}  # the input pair a plan format reads
GLUON_FORMATS = ("fp4w", "fp4ws", "fp8w")  # plan formats run by a Gluon kernel
# The cache seen as 2-D rows of ROW_BYTES: a block is CACHE_ROWS_PER_BLOCK rows (keys, then scales).
ROW_BYTES = {f: {"fp8": D, "fp4": D // 2}[pair] for f, pair in PAIR.items()}  # 128 / 64
CACHE_ROWS_PER_BLOCK = {f: BLOCK * (rb + 4) // rb for f, rb in ROW_BYTES.items()}  # 66 / 68
log = logging.getLogger("paged_submission")
PRODUCER_REGS = 24  # fp4ws: the producer warpgroup's registers (setmaxnreg)


def ws_maxnreg(next_n: int) -> int:
    """fp4ws's registers at launch. They set the programs an SM holds (256 threads: Triton pads the producer
    warp to a warpgroup) and bound the code outside the partitions (the exact fallback; at next_n 2 that
    code, q's fold then included, needed ~160); the warpgroup gets the rest of the program's. 64 at next_n
    1: 4 programs an SM, 104 for the warpgroup."""
    return 64 if next_n == 1 else 192


LOG_PREFIX = "paged MQA logits"  # what this submission's log lines start with
_logged_reasons = set()
_compiled = {}  # (kernel, plan, device) -> CompiledKernel, the latest launch last: code, for tools


class Plan(NamedTuple):
    pair: str       # the input pair it reads: "fp8" or "fp4"
    kernel: str     # TRITON, GLUON or GLUON_WS (fp4 only)
    chunk: int      # cache pages (blocks of 64 tokens) per program
    stages: int     # depth of the page pipeline
    warps: int
    bt_vector: int  # 1: the chunk's block-table entries loaded once as a vector (a scalar load per
    #                 page stalls the pipeliner)
    scale_tma: int  # 1: TMA for the key scales / the keys / q, else plain loads (the fp4 kernel loads
    kv_tma: int     #    q and the scales plainly)
    q_tma: int

    @property
    def fmt(self) -> str:
        """The route's name: "fp8", "fp4" (the Triton kernel), "fp8w", "fp4w", "fp4ws" (the Gluon ones)."""
        return self.pair + ROUTE_SUFFIX[self.kernel]


def as_plan(plan) -> Plan:
    """A Plan, from a Plan or from the compact tuple the sweeps and tests write: (route name, chunk, stages,
    warps, bt_vector, scale_tma, kv_tma, q_tma)."""
    if isinstance(plan, Plan):
        return plan
    route, *rest = plan
    if route not in PAIR:
        raise ValueError(f"plan {tuple(plan)!r}: unknown route {route!r} (one of {', '.join(PAIR)})")
    return Plan(PAIR[route], _KERNEL_OF_SUFFIX[route[len(PAIR[route]):]], *rest)


# Per-shape plans, keyed by (batch, next_n, max_model_len), from a sweep on an H200
# (tools/paged/bench_paged.py, each plan timed through custom_kernel). Each host tensor descriptor costs an
# encode for each new input (memoized by address), so the Triton plans keep one (the keys'); the Gluon
# kernels take two (keys, scale words).
PLANS = {
    (256, 1, 1344): Plan(pair="fp8", kernel=TRITON, chunk=8, stages=3, warps=4, bt_vector=1, scale_tma=0, kv_tma=1, q_tma=0),
    (256, 1, 5376): Plan(pair="fp8", kernel=GLUON, chunk=4, stages=2, warps=4, bt_vector=0, scale_tma=1, kv_tma=1, q_tma=0),
    (256, 1, 10688): Plan(pair="fp8", kernel=GLUON, chunk=8, stages=2, warps=4, bt_vector=0, scale_tma=1, kv_tma=1, q_tma=0),
    (256, 2, 10688): Plan(pair="fp8", kernel=GLUON, chunk=16, stages=2, warps=4, bt_vector=0, scale_tma=1, kv_tma=1, q_tma=0),
    (128, 1, 21312): Plan(pair="fp8", kernel=GLUON, chunk=4, stages=2, warps=4, bt_vector=0, scale_tma=1, kv_tma=1, q_tma=0),
    (64, 1, 42624): Plan(pair="fp8", kernel=GLUON, chunk=4, stages=2, warps=4, bt_vector=0, scale_tma=1, kv_tma=1, q_tma=0),
    (32, 1, 85248): Plan(pair="fp8", kernel=GLUON, chunk=4, stages=2, warps=4, bt_vector=0, scale_tma=1, kv_tma=1, q_tma=0),
}
DEFAULT_FORMAT = "fp8"


def _default_plan(batch: int, next_n: int, max_model_len: int):
    pages = (max_model_len + BLOCK - 1) // BLOCK
    chunk = 8 if next_n == 1 else 16
    while chunk > 1 and batch * ((pages + chunk - 1) // chunk) < 132 * 4:
        chunk //= 2
    return Plan(pair=DEFAULT_FORMAT, kernel=TRITON, chunk=chunk, stages=3 if next_n == 1 else 4, warps=4, bt_vector=1, scale_tma=0,
                kv_tma=1, q_tma=0)


def plan_for(batch: int, next_n: int, max_model_len: int) -> Plan:
    plan = PLANS.get((batch, next_n, max_model_len))
    if plan is None:
        return _default_plan(batch, next_n, max_model_len)
    plan = as_plan(plan)  # (a table edited by hand may hold tuples)
    if plan.kernel != TRITON and _GLUON_ERROR is not None:  # a Triton without Gluon: the Triton kernel
        return _default_plan(batch, next_n, max_model_len)
    return plan


def _shape_of(data):
    """(batch, next_n, max_model_len) from the format-independent inputs."""
    weights, context_lens, max_model_len = data[2], data[3], data[5]
    batch = context_lens.shape[0]
    return batch, (weights.shape[0] // batch if batch else 0), max_model_len


# Under TRITON_INTERPRET=1 (the CPU tests) inline PTX cannot run, and bf16 dots are wrong in the
# interpreter: the fp4 decode then uses plain Triton ops and fp32 (exact) dots.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

if triton is not None:
    _INTERP = tl.constexpr(_INTERPRET)

    # E2M1 pairs -> bf16 on packed registers, per 4 bytes (8 elements). prmt spreads bytes 0/1 (then
    # 2/3) to the two 16-bit halves; a nibble's sign / exponent / mantissa bits shifted to bf16 bits
    # 15 / 8-7 / 6 give exactly value * 2^-126 (exponent 0 lands on a bf16 subnormal); two exact
    # multiplies, by 2^126 and by the block scale 2^(e-127), finish (one multiply could overflow the
    # factor for e > 128). Outputs: $0,$1 the low nibbles (even elements) of bytes 0-3, $2,$3 the high.
    _E2M1_ASM = tl.constexpr("""
    {
    .reg .b32 a, t, u, k;
    mov.b32 k, 0x7E807E80;
    prmt.b32 a, $4, 0, 0x4140;
    shl.b32 t, a, 6; and.b32 t, t, 0x01C001C0; shl.b32 u, a, 12; and.b32 u, u, 0x80008000; or.b32 t, t, u;
    mul.rn.bf16x2 t, t, k; mul.rn.bf16x2 $0, t, $5;
    shl.b32 t, a, 2; and.b32 t, t, 0x01C001C0; shl.b32 u, a, 8; and.b32 u, u, 0x80008000; or.b32 t, t, u;
    mul.rn.bf16x2 t, t, k; mul.rn.bf16x2 $2, t, $5;
    prmt.b32 a, $4, 0, 0x4342;
    shl.b32 t, a, 6; and.b32 t, t, 0x01C001C0; shl.b32 u, a, 12; and.b32 u, u, 0x80008000; or.b32 t, t, u;
    mul.rn.bf16x2 t, t, k; mul.rn.bf16x2 $1, t, $6;
    shl.b32 t, a, 2; and.b32 t, t, 0x01C001C0; shl.b32 u, a, 8; and.b32 u, u, 0x80008000; or.b32 t, t, u;
    mul.rn.bf16x2 t, t, k; mul.rn.bf16x2 $3, t, $6;
    }
    """)

    @triton.jit
    def _fp4_decode(packed, words, ROWS: tl.constexpr):
        """packed [ROWS, 64] uint8 (E2M1, even element in the low nibble), words [ROWS] int32 (the
        UE8M0 scale of elements 32g .. 32g+31 in byte g) -> (even elements, odd elements), each
        [ROWS, 64], exact: bf16 on the GPU, fp32 under the interpreter."""
        e = (words[:, None] >> (tl.arange(0, 4) * 8)[None, :]) & 0xFF
        scale = tl.where(e > 0, e << 23, 0x400000).to(tl.float32, bitcast=True)  # 2^(e-127)
        scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (ROWS, 4, 16)), (ROWS, 64))
        if _INTERP:  # E2M1 -> e4m3 bits is exact and equals value * 2^-6
            lo = packed & 15
            hi = packed >> 4
            lo = (((lo & 8) << 4) | ((lo & 7) << 2)).to(tl.float8e4nv, bitcast=True).to(tl.float32)
            hi = (((hi & 8) << 4) | ((hi & 7) << 2)).to(tl.float8e4nv, bitcast=True).to(tl.float32)
            return lo * (scale * 64.0), hi * (scale * 64.0)
        else:  # impure, as the MLA submission's decodes (pure made no difference here)
            return tl.inline_asm_elementwise(_E2M1_ASM, "=r,=r,=r,=r,r,r,r", [packed, scale.to(tl.bfloat16)],
                                             dtype=(tl.bfloat16, tl.bfloat16), is_pure=False, pack=4)

    @triton.jit
    def _page_range(ctx_ptr, b, pid_c, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
        """Sequence b's context length and page count, and program pid_c's logical pages [p0, p_end) of
        it (empty past the context). Scalar code, so the Gluon kernel calls it too."""
        ctx = tl.load(ctx_ptr + b)
        n_pages = tl.cdiv(ctx, BLOCK)
        p0 = pid_c * CHUNK
        return ctx, n_pages, p0, tl.minimum(p0 + CHUNK, n_pages)

    @triton.jit
    def _dot(a, b, acc):
        if _INTERP:
            return tl.dot(a, b, acc, input_precision="ieee")
        else:
            return tl.dot(a, b, acc)

    @triton.jit(do_not_specialize=["bt_stride", "out_stride", "max_model_len"])
    def _paged_mqa_logits_kernel(
        q_desc, k_desc, s_desc, q_ptr, q_scale_ptr, kv_ptr, kv_word_ptr, w_ptr, ctx_ptr, bt_ptr, out_ptr,
        bt_stride, out_stride, max_model_len,
        FMT: tl.constexpr, NEXT_N: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
        CHUNK: tl.constexpr, NUM_STAGES: tl.constexpr,
        BT_VECTOR: tl.constexpr, SCALE_TMA: tl.constexpr, KV_TMA: tl.constexpr, Q_TMA: tl.constexpr,
    ):
        # FMT: 8 = the fp8 pair, 4 = the fp4 pair (FMT_FP8 / FMT_FP4; Triton reads only constexpr globals).
        # fp8: kv_ptr = the cache as fp8 rows of D, kv_word_ptr = as fp32 (scales); q_ptr fp8 [rows, D].
        # fp4: kv_ptr = the cache as uint8 rows of D/2, kv_word_ptr = as int32 (scale words);
        #      q_ptr packed uint8 [rows, D/2], q_scale_ptr int32 [rows] (4 UE8M0 bytes).
        QN: tl.constexpr = NEXT_N * H
        RB: tl.constexpr = D if FMT == 8 else D // 2              # bytes per 2-D cache row
        ROWS_PER_BLOCK: tl.constexpr = (BLOCK * (RB + 4)) // RB    # 66 / 68
        WORDS_PER_BLOCK: tl.constexpr = ROWS_PER_BLOCK * RB // 4
        pid_c = tl.program_id(0)
        b = tl.program_id(1)
        ctx, n_pages, p0, p_end = _page_range(ctx_ptr, b, pid_c, CHUNK, BLOCK)
        tok = tl.arange(0, BLOCK)
        hcol = tl.arange(0, QN)
        rcol = tl.arange(0, RB)
        out_row = out_ptr + (b * NEXT_N).to(tl.int64) * out_stride
        bt_row = bt_ptr + b.to(tl.int64) * bt_stride

        if FMT == 8:
            if Q_TMA:
                q = q_desc.load([b * QN, 0])                  # [QN, D] fp8, resident in smem
            else:
                q = tl.load(q_ptr + (b * QN + hcol)[:, None] * D + rcol[None, :])  # < 2^31: route checks
        else:
            q_words = tl.load(q_scale_ptr + b * QN + hcol)
            q_lo, q_hi = _fp4_decode(tl.load(q_ptr + (b * QN + hcol)[:, None] * RB + rcol[None, :]), q_words, QN)
            q_lo = tl.trans(q_lo)
            q_hi = tl.trans(q_hi)
        w = tl.load(w_ptr + b * QN + hcol)                    # [QN] fp32
        if BT_VECTOR:
            jj = tl.arange(0, CHUNK)
            # Masked by the table's width for max_model_len, not by the context: this load then does
            # not wait for ctx's, and the first key load waits for one round trip instead of two.
            btv = tl.load(bt_row + p0 + jj, mask=p0 + jj < tl.cdiv(max_model_len, BLOCK), other=0)
        for p in tl.range(p0, p_end, num_stages=NUM_STAGES):
            if BT_VECTOR:
                blk = tl.sum(tl.where(jj == p - p0, btv, 0))
            else:
                blk = tl.load(bt_row + p)
            if KV_TMA:
                k = k_desc.load([blk * ROWS_PER_BLOCK, 0])    # [BLOCK, RB] (TMA)
            else:
                k = tl.load(kv_ptr + blk.to(tl.int64) * (ROWS_PER_BLOCK * RB) + tok[:, None] * RB + rcol[None, :])
            if FMT == 8:
                if SCALE_TMA:
                    sc = tl.reshape(s_desc.load([blk * ROWS_PER_BLOCK + BLOCK, 0]), [BLOCK])
                else:
                    sc = tl.load(kv_word_ptr + blk.to(tl.int64) * WORDS_PER_BLOCK + BLOCK * D // 4 + tok)
                s = tl.dot(k, tl.trans(q))                    # [BLOCK, QN] fp32 (fp8 wgmma)
            else:
                k_words = tl.load(kv_word_ptr + blk.to(tl.int64) * WORDS_PER_BLOCK + BLOCK * RB // 4 + tok)
                k_lo, k_hi = _fp4_decode(k, k_words, BLOCK)
                s = _dot(k_lo, q_lo, tl.zeros([BLOCK, QN], tl.float32))  # bf16 wgmma, exact products
                s = _dot(k_hi, q_hi, s)
            x = tl.maximum(s, 0.0) * w[None, :]
            cols = p * BLOCK + tok
            if NEXT_N == 1:
                li = tl.sum(x, axis=1)
                if FMT == 8:
                    li = li * sc
                li = tl.where(cols <= ctx - 1, li, float("-inf"))
                tl.store(out_row + cols, li, mask=cols < max_model_len)
            else:
                # [BLOCK, NEXT_N] in one reduction and one store: one layout conversion a page, not one
                # per query row
                nn = tl.arange(0, NEXT_N)
                li = tl.sum(tl.reshape(x, [BLOCK, NEXT_N, H]), axis=2)
                if FMT == 8:
                    li = li * sc[:, None]
                li = tl.where(cols[:, None] <= ctx - NEXT_N + nn[None, :], li, float("-inf"))
                tl.store(out_row + nn[None, :] * out_stride + cols[:, None], li, mask=(cols < max_model_len)[:, None])

        neg = tl.full([BLOCK], float("-inf"), tl.float32)
        for p in range(tl.maximum(p0, n_pages), p0 + CHUNK):
            cols = p * BLOCK + tok
            for i in tl.static_range(NEXT_N):
                tl.store(out_row + i * out_stride + cols, neg, mask=cols < max_model_len)


# ---------------------------------------------------------------------------------------------------
# The fp4 pair on Hopper through Gluon (plan format "fp4w")
#
# Why Gluon: in the fp4 Triton kernel above the decoded keys make a shared-memory round trip every
# page. Triton keeps a decoded wgmma operand in registers only if the decode is a pure unary op of the
# loaded tile (OptimizeDotOperands' MMAV3HoistLayoutConversion); a decode that also reads the block
# scales is not. Gluon states the layouts: the packed keys are read from shared memory straight into
# the wgmma register-operand layout and decoded in place (faster than the same decode in Triton:
# docs/paged_design.md). What is left is instruction issue: ~170 instructions of decode and ~110 of
# epilogue per thread per 64-key page, where the fp8 kernel needs no decode and is memory-bound.
#
# Decode ("fold"): a key's 4 UE8M0 scales 2^(e_g - 127) are split into 2^(emax - 129), applied to the
# fp32 result after relu (it is positive), and 2^(2 - n_g), n_g = emax - e_g, folded into the element:
# E2M1 x 4 x 2^-n is an e5m2 normal for every code while n <= 15, so the products of the e5m2 dots are
# exact. q is folded the same way (its per-(row, head) factor goes into the weights). A key or q row
# whose scales span more than 15 binades (never in generated data) sends its chunk to an exact fp32
# loop instead.
# ---------------------------------------------------------------------------------------------------
if triton is not None:
    # The fold's 8-entry table of one (row, scale group): code c -> the e5m2 byte of E2M1(c) x 4 x 2^-n,
    # i.e. n << 2 taken off the exponent field of entries 1-7 (no borrow: they are >= 0x40, n << 2 <= 60;
    # code 0 stays 0). $0 = codes 0-3, $1 = codes 4-7 (the two prmt source words); $2 = n (0..15).
    _TABLE_ASM = tl.constexpr("""
    {
    .reg .b32 t;
    mul.lo.u32 t, $2, 0x04040404;
    sub.u32 $1, 0x4E4C4A48, t;
    and.b32 t, t, 0xFFFFFF00; sub.u32 $0, 0x46444000, t;
    }
    """)
    # Per 4 packed bytes (8 elements) of one table: one mask and one shift, two prmt lookups of all eight
    # codes (a prmt selector nibble's bit 3 is the sign, so codes are masked to 3 bits), two prmt gathers,
    # and the signs: an odd element's already at bit 7 of its byte, an even one's 4 bits under it.
    # Inputs: $2 the packed bytes; $3 (= $4..$6) and $7 (= $8..$10) the table. $0 receives the low nibbles
    # (elements 0, 2, 4, 6: byte j is packed byte j's even element), $1 the high ones (1, 3, 5, 7).
    _LOOKUP_ASM = tl.constexpr("""
    {
    .reg .b32 m, hi, a, b, s;
    and.b32 m, $2, 0x77777777; shr.b32 hi, m, 16;
    prmt.b32 a, $3, $7, m; prmt.b32 b, $3, $7, hi;
    prmt.b32 $0, a, b, 0x6420; prmt.b32 $1, a, b, 0x7531;
    shl.b32 s, $2, 4; and.b32 s, s, 0x80808080; or.b32 $0, $0, s;
    and.b32 s, $2, 0x80808080; or.b32 $1, $1, s;
    }
    """)

if gluon is not None:
    # Gluon is experimental and renames things: Triton 3.6 calls the CTA barrier thread_barrier, 3.8 barrier.
    _cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

    @gluon.jit
    def _pow2(x):
        """2^x in fp32, exactly, for integer x in [-149, 128] (subnormal below -126; 128 -> inf)."""
        return gl.where(x >= -126, (x + 127) << 23, 1 << gl.maximum(x + 149, 0)).to(gl.float32, bitcast=True)

    @gluon.jit
    def _fold(packed, words):
        """packed [rows, 4, 16] uint8 in some layout L: packed byte 16 g + j of a row at [row, g, j], g its
        scale group; words [rows] int32 (4 UE8M0 bytes e_g) in SliceLayout(1, SliceLayout(2, L)) ->
        (even elements, odd elements) as e5m2 [rows, 4, 16] in L, equal to the true values x 2^(129 - emax);
        emax [rows]; ok [rows]. The tables are computed per (row, group), so a thread that holds one group
        of a row builds one table for it, however many bytes of the group it decodes."""
        e0, e1, e2, e3 = words & 0xFF, (words >> 8) & 0xFF, (words >> 16) & 0xFF, (words >> 24) & 0xFF
        emax = gl.maximum(gl.maximum(e0, e1), gl.maximum(e2, e3))
        ok = (emax - gl.minimum(gl.minimum(e0, e1), gl.minimum(e2, e3)) <= 15) & (emax < 255)
        group_l: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, packed.type.layout))
        shift = gl.expand_dims(gl.arange(0, 4, layout=group_l) * 8, 0)
        e = (gl.expand_dims(words, 1) >> shift) & 0xFF                                     # [rows, 4]
        n = gl.minimum(gl.expand_dims(emax, 1) - e, 15)
        t0, t1 = gl.inline_asm_elementwise(_TABLE_ASM, "=r,=r,r", [n], dtype=(gl.int32, gl.int32), is_pure=True,
                                           pack=1)
        t0 = gl.broadcast(gl.expand_dims(t0, 2), packed)[0]
        t1 = gl.broadcast(gl.expand_dims(t1, 2), packed)[0]
        lo, hi = gl.inline_asm_elementwise(_LOOKUP_ASM, "=r,=r,r,r,r,r,r,r,r,r,r", [packed, t0, t1],
                                           dtype=(gl.float8e5, gl.float8e5), is_pure=True, pack=4)
        return lo, hi, emax, ok

    @gluon.jit
    def _by_group(x):
        """x [rows, 64] -> [rows, 4, 16]: the 16 packed bytes of each scale group on their own axis."""
        return gl.reshape(x, [x.shape[0], 4, 16])

    @gluon.jit
    def _contraction_order(x):
        """[rows, 4, 16] in packed-byte order (16 g + 4 m + i) -> [rows, 64] in the order both wgmma
        operands use (column 16 m + 4 g + i). The order of a dot's contraction is free if both operands
        share it; this one puts a key row's 16 register bytes of a thread (columns 16 m + 4 l + i of the
        register-operand layout, l the thread's lane in its quad) into one scale group, g = l."""
        x = gl.reshape(x, [x.shape[0], 4, 4, 4])
        return gl.reshape(gl.permute(x, (0, 2, 1, 3)), [x.shape[0], 64])

    @gluon.jit
    def _element(byte, d, words):
        """Element d of rows whose packed byte d // 2 is `byte` and scale word `words`, exactly in fp32."""
        x = (byte >> (4 * (d % 2))) & 15
        c = (x & 7).to(gl.int32)
        mag = gl.where(c < 2, c.to(gl.float32) * 0.5, (1.0 + (c & 1).to(gl.float32) * 0.5) * _pow2((c >> 1) - 1))
        e = (words >> (8 * (d // 32))) & 0xFF
        return gl.where((x & 8) != 0, -mag, mag) * _pow2(e - 127)

    @gluon.jit
    def _write(s, w, sc, cols, ctx, out_row, out_stride, max_model_len, heads, NEXT_N: gl.constexpr,
               H: gl.constexpr):
        """A page's logits from scores s [BLOCK, NEXT_N * H] (layout L; w, heads in SliceLayout(0, L);
        sc, cols in SliceLayout(1, L)): relu, x weight, head sum, x the key's factor, causal mask."""
        x = gl.maximum(s, 0.0) * gl.expand_dims(w, 0)
        for i in gl.static_range(NEXT_N):
            if NEXT_N == 1:
                li = gl.sum(x, axis=1)
            else:
                li = gl.sum(gl.where(gl.expand_dims(heads // H == i, 0), x, 0.0), axis=1)
            li = gl.where(cols <= ctx - NEXT_N + i, li * sc, float("-inf"))
            # stored from the reduction's layout: the lanes that share a row store the same word (merged
            # by the memory unit); a layout conversion would cost two CTA barriers per page
            gl.store(out_row + i * out_stride + cols, li, mask=cols < max_model_len)

    @gluon.jit
    def _issue(k_desc, w_desc, blk, p, p_end, k_dst, w_dst, bar, ROWS_PER_BLOCK: gl.constexpr,
               BLOCK: gl.constexpr, WORDS_PER_ROW: gl.constexpr):
        """Start the TMA loads of logical page p, block blk (if p < p_end): its keys and its scale words
        (the cache's rows are WORDS_PER_ROW 32-bit words)."""
        pred = p < p_end
        mbarrier.expect(bar, k_desc.block_type.nbytes + w_desc.block_type.nbytes, pred=pred)
        gtma.async_copy_global_to_shared(k_desc, [blk * ROWS_PER_BLOCK, 0], bar, k_dst, pred=pred)
        gtma.async_copy_global_to_shared(w_desc, [(blk * ROWS_PER_BLOCK + BLOCK) * WORDS_PER_ROW], bar, w_dst,
                                         pred=pred)

    @gluon.jit
    def _ring_start(k_desc, w_desc, k_smem, w_smem, bars, bt_row, p0, p_end, ROWS_PER_BLOCK: gl.constexpr,
                    BLOCK: gl.constexpr, WORDS_PER_ROW: gl.constexpr):
        """The page ring's mbarriers set up and its slots' first pages (p0, p0 + 1, ...) started; returns
        the block of the page the first refill loads, read one iteration ahead (a table load right before
        the TMA issue would stall every iteration for a memory latency)."""
        NUM_STAGES: gl.constexpr = k_smem.type.shape[0]
        for i in gl.static_range(NUM_STAGES):
            mbarrier.init(bars.index(i), count=1)
        for i in gl.static_range(NUM_STAGES):
            blk = gl.load(bt_row + p0 + i, mask=p0 + i < p_end, other=0)
            _issue(k_desc, w_desc, blk, p0 + i, p_end, k_smem.index(i), w_smem.index(i), bars.index(i),
                   ROWS_PER_BLOCK, BLOCK, WORDS_PER_ROW)
        return gl.load(bt_row + p0 + NUM_STAGES, mask=p0 + NUM_STAGES < p_end, other=0)

    @gluon.jit
    def _ring_refill(k_desc, w_desc, k_smem, w_smem, bars, slot, blk_next, p, p_end, bt_row,
                     ROWS_PER_BLOCK: gl.constexpr, BLOCK: gl.constexpr, WORDS_PER_ROW: gl.constexpr):
        """Once every warp has read the slot of page p: the slot refilled with page p + NUM_STAGES (block
        blk_next); returns the block of the refill after."""
        NUM_STAGES: gl.constexpr = k_smem.type.shape[0]
        _cta_barrier()
        _issue(k_desc, w_desc, blk_next, p + NUM_STAGES, p_end, k_smem.index(slot), w_smem.index(slot),
               bars.index(slot), ROWS_PER_BLOCK, BLOCK, WORDS_PER_ROW)
        return gl.load(bt_row + p + NUM_STAGES + 1, mask=p + NUM_STAGES + 1 < p_end, other=0)

    @gluon.jit
    def _write_tail(out_row, out_stride, p_from, p0, max_model_len, CHUNK: gl.constexpr, BLOCK: gl.constexpr,
                    NEXT_N: gl.constexpr, num_warps: gl.constexpr):
        """-inf in the chunk's pages from p_from on (past the context), every query row."""
        out_l: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        neg = gl.full([BLOCK], float("-inf"), gl.float32, layout=out_l)
        tok_o = gl.arange(0, BLOCK, layout=out_l)
        for p in range(p_from, p0 + CHUNK):
            for i in gl.static_range(NEXT_N):
                gl.store(out_row + i * out_stride + p * BLOCK + tok_o, neg, mask=p * BLOCK + tok_o < max_model_len)

    @gluon.jit
    def _fp4_scores(k_slot, w_slot, q_lo_smem, q_hi_smem, acc0, keys_l: gl.constexpr, a_op: gl.constexpr):
        """One page: its packed keys and scale words read from a ring slot, folded, and the two e5m2 wgmmas
        issued (async) -> (the accumulator token, emax, ok) of the page's keys."""
        k = _by_group(k_slot.load(keys_l))                                         # packed keys
        words = w_slot.load(gl.SliceLayout(1, gl.SliceLayout(2, k.type.layout)))  # their scale words
        k_lo, k_hi, k_emax, k_ok = _fold(k, words)
        # in the operand layout without moving a byte: keys_l is a_op in packed-byte order
        k_lo = gl.convert_layout(_contraction_order(k_lo), a_op)
        k_hi = gl.convert_layout(_contraction_order(k_hi), a_op)
        acc = warpgroup_mma(k_lo, q_lo_smem.permute((1, 0)), acc0, use_acc=False, is_async=True)
        acc = warpgroup_mma(k_hi, q_hi_smem.permute((1, 0)), acc, is_async=True)
        return acc, k_emax, k_ok

    @gluon.jit
    def _fp4_write(acc, k_emax, k_ok, k_bad, w, cols, ctx, out_row, out_stride, max_model_len, NEXT_N: gl.constexpr,
                   H: gl.constexpr):
        """A page's logits from its scores; k_bad gains the page's keys that the fold could not hold."""
        rows_l: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
        k_ok = gl.convert_layout(k_ok.to(gl.int32), rows_l)
        k_bad = k_bad | ((cols < ctx) & (k_ok == 0)).to(gl.int32)
        _write_rows(acc, w, _pow2(gl.convert_layout(k_emax, rows_l) - 129), cols, ctx, out_row, out_stride,
                    max_model_len, NEXT_N, H, True)
        return k_bad

    @gluon.jit
    def _fp4_producer(k_desc, w_desc, k_smem, w_smem, ready, empty, bt_row, p0, p_end, ROWS_PER_BLOCK: gl.constexpr,
                      BLOCK: gl.constexpr, WORDS_PER_ROW: gl.constexpr):
        """The warp-specialised kernel's producer warp: each page's TMA loads into its ring slot once the
        warpgroup has freed the slot (the first round passes: an mbarrier's phase before its first is done)."""
        NUM_STAGES: gl.constexpr = k_smem.type.shape[0]
        blk = gl.load(bt_row + p0, mask=p0 < p_end, other=0)
        for j in range(0, p_end - p0):
            slot = j % NUM_STAGES
            blk_next = gl.load(bt_row + p0 + j + 1, mask=p0 + j + 1 < p_end, other=0)
            mbarrier.wait(empty.index(slot), ((j // NUM_STAGES) & 1) ^ 1)
            _issue(k_desc, w_desc, blk, p0 + j, p_end, k_smem.index(slot), w_smem.index(slot), ready.index(slot),
                   ROWS_PER_BLOCK, BLOCK, WORDS_PER_ROW)
            blk = blk_next

    @gluon.jit
    def _fp4_consumer(k_smem, w_smem, ready, empty, q_lo_smem, q_hi_smem, q_ptr, q_scale_ptr, w_ptr, b,
                      keys_l: gl.constexpr, a_op: gl.constexpr, ctx, p0, p_end, out_row, out_stride, max_model_len,
                      NEXT_N: gl.constexpr, H: gl.constexpr):
        """The warp-specialised kernel's warpgroup: q staged (while the producer's first loads are under
        way), then each page's scores and logits; a slot is freed once the page's wgmmas are done (so every
        warp has read it). Returns (bad,): the rows (or q) that the fold could not hold."""
        NUM_STAGES: gl.constexpr = k_smem.type.shape[0]
        BLOCK: gl.constexpr = k_smem.type.shape[1]
        mma: gl.constexpr = a_op.parent
        k_bad = gl.zeros([BLOCK], gl.int32, layout=gl.SliceLayout(1, mma))
        if p0 < p_end:  # a chunk past the context has no pages: no q to stage
            w, q_bad = _fp4_stage_q(q_ptr, q_scale_ptr, w_ptr, b, q_lo_smem, q_hi_smem, mma)
            _cta_barrier()  # every warp's q stores before the first wgmma reads them
            tok = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, mma))
            acc0 = gl.zeros([BLOCK, NEXT_N * H], gl.float32, layout=mma)
            for j in range(0, p_end - p0):
                slot = j % NUM_STAGES
                mbarrier.wait(ready.index(slot), (j // NUM_STAGES) & 1)
                acc, k_emax, k_ok = _fp4_scores(k_smem.index(slot), w_smem.index(slot), q_lo_smem, q_hi_smem,
                                                acc0, keys_l, a_op)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                mbarrier.arrive(empty.index(slot), count=1)
                k_bad = _fp4_write(acc, k_emax, k_ok, k_bad, w, (p0 + j) * BLOCK + tok, ctx, out_row, out_stride,
                                   max_model_len, NEXT_N, H)
            k_bad = k_bad | q_bad.to(gl.int32)
        return (k_bad,)  # a tuple: Triton 3.6's warp_specialize cannot flatten a lone tensor

    @gluon.jit
    def _fp4_stage_q(q_ptr, q_scale_ptr, w_ptr, b, q_lo_smem, q_hi_smem, mma: gl.constexpr):
        """Sequence b's q folded once into the two B operands (e5m2 [QN, 64], K contiguous, in shared
        memory; fenced for the wgmmas, not barriered) -> (the weights times q's row factors in
        SliceLayout(0, mma), whether some q row's scales span more than the fold holds)."""
        QN: gl.constexpr = q_lo_smem.type.shape[0]
        RB: gl.constexpr = q_lo_smem.type.shape[1]
        rows2d: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
        hq = gl.arange(0, QN, layout=gl.SliceLayout(1, rows2d))
        cq = gl.arange(0, RB, layout=gl.SliceLayout(0, rows2d))
        q_packed = _by_group(gl.load(q_ptr + gl.expand_dims(b * QN + hq, 1) * RB + gl.expand_dims(cq, 0)))
        q_words = gl.load(q_scale_ptr + b * QN + hq)
        q_lo, q_hi, q_emax, q_ok = _fold(q_packed, gl.convert_layout(
            q_words, gl.SliceLayout(1, gl.SliceLayout(2, q_packed.type.layout))))
        q_lo_smem.store(gl.convert_layout(_contraction_order(q_lo), rows2d))
        q_hi_smem.store(gl.convert_layout(_contraction_order(q_hi), rows2d))
        fence_async_shared()
        heads = gl.arange(0, QN, layout=gl.SliceLayout(0, mma))
        w = gl.load(w_ptr + b * QN + heads) * _pow2(gl.convert_layout(q_emax, gl.SliceLayout(0, mma)) - 129)
        return w, gl.min(q_ok.to(gl.int32), axis=0) == 0

    @gluon.jit(do_not_specialize=["bt_stride", "out_stride", "max_model_len"])
    def _fp4_wgmma_kernel(k_desc, w_desc, q_ptr, q_scale_ptr, kv_ptr, kv_word_ptr, w_ptr, ctx_ptr, bt_ptr, out_ptr,
                          bt_stride, out_stride, max_model_len,
                          NEXT_N: gl.constexpr, H: gl.constexpr, BLOCK: gl.constexpr, CHUNK: gl.constexpr,
                          NUM_STAGES: gl.constexpr, WARP_SPECIALIZE: gl.constexpr,
                          PRODUCER_REGS: gl.constexpr):
        # k_desc: the cache as uint8 rows of 64 (box [BLOCK, 64]); w_desc: as int32 words (box [BLOCK]).
        # One warpgroup (plus, warp-specialised, a producer warp); grid (page chunks, batch) as the Triton kernel.
        QN: gl.constexpr = NEXT_N * H
        RB: gl.constexpr = 64                                   # packed bytes per key
        ROWS_PER_BLOCK: gl.constexpr = BLOCK * (RB + 4) // RB   # 68
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, QN, 32])
        a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
        rows2d: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])  # the fallback's scores
        q_smem_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([QN, RB], gl.float8e5)
        # The packed keys as the threads read them: a_op with _contraction_order undone, so a thread holds
        # packed bytes 16 l .. 16 l + 15 (scale group l, l its lane in the quad) of each of its two rows.
        gl.static_assert(BLOCK == 64, "keys_l is a_op's layout for 64 keys")
        keys_l: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 2], [8, 0], [0, 4], [0, 8]], lane_bases=[[0, 16], [0, 32], [1, 0], [2, 0], [4, 0]],
            warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[BLOCK, RB])

        pid_c = gl.program_id(0)
        b = gl.program_id(1)
        ctx, n_pages, p0, p_end = _page_range(ctx_ptr, b, pid_c, CHUNK, BLOCK)
        out_row = out_ptr + (b * NEXT_N).to(gl.int64) * out_stride
        bt_row = bt_ptr + b.to(gl.int64) * bt_stride

        k_smem = gl.allocate_shared_memory(gl.uint8, [NUM_STAGES, BLOCK, RB], k_desc.layout)
        w_smem = gl.allocate_shared_memory(gl.int32, [NUM_STAGES, BLOCK], w_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())  # a slot filled
        if WARP_SPECIALIZE:  # a producer warp fills the slots; the warpgroup frees them through `empty`
            empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(NUM_STAGES):
                mbarrier.init(bars.index(i), count=1)
                mbarrier.init(empty.index(i), count=1)
        else:
            blk_next = _ring_start(k_desc, w_desc, k_smem, w_smem, bars, bt_row, p0, p_end, ROWS_PER_BLOCK, BLOCK,
                                   RB // 4)

        # q's two B operands (e5m2 [QN, 64], K contiguous), staged by _fp4_stage_q in a chunk with pages
        q_lo_smem = gl.allocate_shared_memory(gl.float8e5, [QN, RB], q_smem_l)
        q_hi_smem = gl.allocate_shared_memory(gl.float8e5, [QN, RB], q_smem_l)
        if WARP_SPECIALIZE:
            k_bad, = gl.warp_specialize(
                [(_fp4_consumer, (k_smem, w_smem, bars, empty, q_lo_smem, q_hi_smem, q_ptr, q_scale_ptr, w_ptr, b,
                                  keys_l, a_op, ctx, p0, p_end, out_row, out_stride, max_model_len, NEXT_N, H)),
                 (_fp4_producer, (k_desc, w_desc, k_smem, w_smem, bars, empty, bt_row, p0, p_end, ROWS_PER_BLOCK,
                                  BLOCK, RB // 4))], [1], [PRODUCER_REGS])
        else:
            k_bad = gl.zeros([BLOCK], gl.int32, layout=gl.SliceLayout(1, mma))
            if p0 < p_end:  # a chunk past the context has no pages: no q to stage
                w, q_bad = _fp4_stage_q(q_ptr, q_scale_ptr, w_ptr, b, q_lo_smem, q_hi_smem, mma)
                _cta_barrier()  # every warp's q stores before the first wgmma reads them
                tok = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, mma))
                acc0 = gl.zeros([BLOCK, QN], gl.float32, layout=mma)
                for j in range(0, p_end - p0):
                    p = p0 + j
                    slot = j % NUM_STAGES
                    mbarrier.wait(bars.index(slot), (j // NUM_STAGES) & 1)
                    acc, k_emax, k_ok = _fp4_scores(k_smem.index(slot), w_smem.index(slot), q_lo_smem, q_hi_smem,
                                                    acc0, keys_l, a_op)
                    blk_next = _ring_refill(k_desc, w_desc, k_smem, w_smem, bars, slot, blk_next, p, p_end, bt_row,
                                            ROWS_PER_BLOCK, BLOCK, RB // 4)
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                    k_bad = _fp4_write(acc, k_emax, k_ok, k_bad, w, p * BLOCK + tok, ctx, out_row, out_stride,
                                       max_model_len, NEXT_N, H)
                k_bad = k_bad | q_bad.to(gl.int32)
        for i in gl.static_range(NUM_STAGES):
            mbarrier.invalidate(bars.index(i))
            if WARP_SPECIALIZE:
                mbarrier.invalidate(empty.index(i))

        # rare: some scales span > 15 binades. Redo the chunk exactly in fp32, one dim at a time.
        if gl.max(k_bad, axis=0) > 0:
            _cta_barrier()  # the pages' first writes came from other threads of this program
            tb = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, rows2d))
            hb = gl.arange(0, QN, layout=gl.SliceLayout(0, rows2d))
            qw = gl.load(q_scale_ptr + b * QN + hb)
            w_exact = gl.load(w_ptr + b * QN + hb)
            for p in range(p0, p_end):
                blk = gl.load(bt_row + p)
                k_rows = kv_ptr + blk.to(gl.int64) * (ROWS_PER_BLOCK * RB) + tb * RB
                kw = gl.load(kv_word_ptr + blk.to(gl.int64) * (ROWS_PER_BLOCK * RB // 4) + BLOCK * RB // 4 + tb)
                s = gl.zeros([BLOCK, QN], gl.float32, layout=rows2d)
                for d in range(2 * RB):
                    kd = _element(gl.load(k_rows + d // 2), d, kw)
                    qd = _element(gl.load(q_ptr + (b * QN + hb) * RB + d // 2), d, qw)
                    s += gl.expand_dims(kd, 1) * gl.expand_dims(qd, 0)
                _write(s, w_exact, gl.full([BLOCK], 1.0, gl.float32, layout=gl.SliceLayout(1, rows2d)),
                       p * BLOCK + tb, ctx, out_row, out_stride, max_model_len, hb, NEXT_N, H)

        _write_tail(out_row, out_stride, gl.maximum(p0, n_pages), p0, max_model_len, CHUNK, BLOCK, NEXT_N, 4)

if gluon is not None:
    # The weighted head sum as FFMA chains. In the wgmma accumulator layout a thread holds, for each of its
    # rows, columns 8 j + 2 l + e (l: its lane in the quad, e: 0 / 1), so a query row's H heads are H / 4
    # registers of each of 4 lanes. Seen as [rows, NEXT_N, 4 lanes, H / 4 registers] and split register by
    # register, they chain in H / 4 FFMAs a thread (gl.sum of relu(s) * w costs a multiply and an add per
    # head), then the 4 lanes are summed across the quad.
    @gluon.jit
    def _halves(x):
        """x [a, b, c, 2m] -> its even and odd registers along the last dim, each [a, b, c, m]."""
        return gl.split(gl.reshape(x, [x.shape[0], x.shape[1], x.shape[2], x.shape[3] // 2, 2]))

    @gluon.jit
    def _fma2(x, w, acc):
        x0, x1 = _halves(x)
        w0, w1 = _halves(w)
        return gl.fma(x1, w1, gl.fma(x0, w0, acc))

    @gluon.jit
    def _mul2(x, w):
        x0, x1 = _halves(x)
        w0, w1 = _halves(w)
        return gl.fma(x1, w1, x0 * w0)  # starts from a product: a zeros_like accumulator has another layout

    @gluon.jit
    def _fma4(x, w, acc):
        x0, x1 = _halves(x)
        w0, w1 = _halves(w)
        return _fma2(x1, w1, _fma2(x0, w0, acc))

    @gluon.jit
    def _mul4(x, w):
        x0, x1 = _halves(x)
        w0, w1 = _halves(w)
        return _fma2(x1, w1, _mul2(x0, w0))

    @gluon.jit
    def _fma8(x, w, acc):
        x0, x1 = _halves(x)
        w0, w1 = _halves(w)
        return _fma4(x1, w1, _fma4(x0, w0, acc))

    @gluon.jit
    def _mul8(x, w):
        x0, x1 = _halves(x)
        w0, w1 = _halves(w)
        return _fma4(x1, w1, _mul4(x0, w0))

    @gluon.jit
    def _mul16(x, w):
        x0, x1 = _halves(x)
        w0, w1 = _halves(w)
        return _fma8(x1, w1, _mul8(x0, w0))

    @gluon.jit
    def _by_lane(x, NEXT_N: gl.constexpr, H: gl.constexpr):
        """x [BLOCK, NEXT_N * H] in the wgmma accumulator layout -> [BLOCK, NEXT_N, 4 lanes, H / 4]."""
        x = gl.reshape(x, [x.shape[0], NEXT_N, H // 8, 4, 2])
        return gl.reshape(gl.permute(x, (0, 1, 3, 2, 4)), [x.shape[0], NEXT_N, 4, H // 4])

    @gluon.jit
    def _head_sums(s, w, NEXT_N: gl.constexpr, H: gl.constexpr, RELU_FADD: gl.constexpr):
        """sum over h of relu(s[:, i * H + h]) * w[i * H + h] -> [BLOCK, NEXT_N], s in the wgmma accumulator
        layout, w [NEXT_N * H] in its SliceLayout(0); RELU_FADD: relu on the FMA pipe (the fp4 kernels)."""
        gl.static_assert(H == 64, "the FFMA chain is written for 16 registers a lane")
        if RELU_FADD:
            # 2 relu(s) as s + |s|: one FADD on the FMA pipe (the fp4 kernels' integer pipe, where FMNMX runs,
            # is their busy one); exact for finite s (2 s, or +0), and the scores are finite
            x = s + gl.abs(s)
        else:
            x = gl.maximum(s, 0.0)
        wx = gl.broadcast(gl.expand_dims(w, 0), x)[0]
        part = _mul16(_by_lane(x, NEXT_N, H), _by_lane(wx, NEXT_N, H))   # [BLOCK, NEXT_N, 4, 1]
        li = gl.sum(gl.reshape(part, [x.shape[0], NEXT_N, 4]), axis=2)
        return li * 0.5 if RELU_FADD else li

    @gluon.jit
    def _write_rows(s, w, sc, cols, ctx, out_row, out_stride, max_model_len, NEXT_N: gl.constexpr, H: gl.constexpr,
                    RELU_FADD: gl.constexpr):
        """A page's logits for all NEXT_N query rows from the wgmma accumulator s [BLOCK, NEXT_N * H] (w in
        its SliceLayout(0); sc, cols in SliceLayout(1)): the heads of row i are columns i * H .. i * H + H - 1,
        summed by _head_sums; x the key's factor, causal mask, one store."""
        li = _head_sums(s, w, NEXT_N, H, RELU_FADD)   # [BLOCK, NEXT_N]
        rows_l: gl.constexpr = li.type.layout
        cols2 = gl.expand_dims(gl.convert_layout(cols, gl.SliceLayout(1, rows_l)), 1)
        sc2 = gl.expand_dims(gl.convert_layout(sc, gl.SliceLayout(1, rows_l)), 1)
        nn = gl.expand_dims(gl.arange(0, NEXT_N, layout=gl.SliceLayout(0, rows_l)), 0)
        li = gl.where(cols2 <= ctx - NEXT_N + nn, li * sc2, float("-inf"))
        gl.store(out_row + nn * out_stride + cols2, li, mask=cols2 < max_model_len)

    @gluon.jit(do_not_specialize=["bt_stride", "out_stride", "max_model_len"])
    def _fp8_wgmma_kernel(k_desc, s_desc, q_ptr, q_scale_ptr, kv_ptr, kv_word_ptr, w_ptr, ctx_ptr, bt_ptr, out_ptr,
                          bt_stride, out_stride, max_model_len, NEXT_N: gl.constexpr, H: gl.constexpr, D: gl.constexpr,
                          BLOCK: gl.constexpr, CHUNK: gl.constexpr, NUM_STAGES: gl.constexpr):
        # The fp8 pair in Gluon (plan format "fp8w"). k_desc: the cache as fp8 rows of D (box [BLOCK, D]);
        # s_desc: as fp32 words (box [BLOCK], the page's key scales). q_scale_ptr, kv_ptr, kv_word_ptr:
        # unused (the fp4 kernel's parameters, so that one launch path serves both). One warpgroup, grid
        # (page chunks, batch), the page ring as the fp4 kernel's; one fp8 wgmma a page with both operands
        # in shared memory (q staged once); the logits stored from the reduction's layout (no layout
        # conversion, so no CTA barriers for one).
        QN: gl.constexpr = NEXT_N * H
        ROWS_PER_BLOCK: gl.constexpr = BLOCK * (D + 4) // D     # 66
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, QN, 32])
        q_l: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
        q_smem_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([QN, D], gl.float8e4nv)

        pid_c = gl.program_id(0)
        b = gl.program_id(1)
        ctx, n_pages, p0, p_end = _page_range(ctx_ptr, b, pid_c, CHUNK, BLOCK)
        out_row = out_ptr + (b * NEXT_N).to(gl.int64) * out_stride
        bt_row = bt_ptr + b.to(gl.int64) * bt_stride

        k_smem = gl.allocate_shared_memory(gl.float8e4nv, [NUM_STAGES, BLOCK, D], k_desc.layout)
        s_smem = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, BLOCK], s_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        blk_next = _ring_start(k_desc, s_desc, k_smem, s_smem, bars, bt_row, p0, p_end, ROWS_PER_BLOCK, BLOCK, D // 4)

        hq = gl.arange(0, QN, layout=gl.SliceLayout(1, q_l))
        cq = gl.arange(0, D, layout=gl.SliceLayout(0, q_l))
        q = gl.load(q_ptr + gl.expand_dims(b * QN + hq, 1) * D + gl.expand_dims(cq, 0))
        q_smem = gl.allocate_shared_memory(gl.float8e4nv, [QN, D], q_smem_l, q)
        fence_async_shared()
        qt = q_smem.permute((1, 0))
        heads = gl.arange(0, QN, layout=gl.SliceLayout(0, mma))
        w = gl.load(w_ptr + b * QN + heads)
        tok = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, mma))
        acc0 = gl.zeros([BLOCK, QN], gl.float32, layout=mma)
        for j in range(0, p_end - p0):
            p = p0 + j
            slot = j % NUM_STAGES
            mbarrier.wait(bars.index(slot), (j // NUM_STAGES) & 1)
            acc = warpgroup_mma(k_smem.index(slot), qt, acc0, use_acc=False, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            sc = s_smem.index(slot).load(gl.SliceLayout(1, mma))
            blk_next = _ring_refill(k_desc, s_desc, k_smem, s_smem, bars, slot, blk_next, p, p_end, bt_row,
                                    ROWS_PER_BLOCK, BLOCK, D // 4)
            _write_rows(acc, w, sc, p * BLOCK + tok, ctx, out_row, out_stride, max_model_len, NEXT_N, H, False)
        for i in gl.static_range(NUM_STAGES):
            mbarrier.invalidate(bars.index(i))

        _write_tail(out_row, out_stride, gl.maximum(p0, n_pages), p0, max_model_len, CHUNK, BLOCK, NEXT_N, 4)



def _format_tensors(data, fmt):
    """(q tensors, cache) of a plan format's pair: fp8 -> ((q,), cache); fp4 -> ((packed, scales), cache)."""
    q, kv_cache = data[0], data[1]
    pair = PAIR[fmt]
    qt = q[pair]
    return (tuple(qt) if pair == "fp4" else (qt,)), kv_cache[pair]


def can_route(data: input_t, fmt: str = "fp8", require_cuda: bool = True):
    """(use_kernel, reason): why the kernel can or cannot take this input through format pair fmt."""
    if _TRITON_ERROR is not None:
        return False, f"Triton unavailable ({_TRITON_ERROR})"
    if TensorDescriptor is None:
        return False, "this Triton has no host tensor descriptors"
    try:
        q, kv_cache, weights, context_lens, block_tables, max_model_len = data
        qts, kv = _format_tensors(data, fmt)
        qf = qts[0]
    except Exception as exc:
        return False, (f"input is not (q, kv_cache, weights, context_lens, block_tables, max_model_len) with "
                       f"a {PAIR.get(fmt, fmt)!r} pair: {type(exc).__name__}: {exc}")
    if not all(isinstance(t, torch.Tensor) for t in (*qts, kv, weights, context_lens, block_tables)):
        return False, f"an input of the {PAIR[fmt]} pair is not a tensor"
    if require_cuda:
        if not torch.cuda.is_available():
            return False, "no CUDA device"
        if not qf.is_cuda:
            return False, "inputs are not on a CUDA device"
        if torch.cuda.get_device_capability(qf.device) != (9, 0):
            return False, f"device is sm_{''.join(map(str, torch.cuda.get_device_capability(qf.device)))}, the kernel targets sm_90"
    if fmt in GLUON_FORMATS and _GLUON_ERROR is not None:
        return False, f"this Triton has no Gluon ({_GLUON_ERROR})"
    rb = ROW_BYTES[fmt]
    if PAIR[fmt] == "fp8":
        if qf.dtype != torch.float8_e4m3fn or qf.dim() != 4 or tuple(qf.shape[2:]) != (H, D):
            return False, f"q['fp8'] is {qf.dtype} {tuple(qf.shape)}, expected float8_e4m3fn (batch, next_n, {H}, {D})"
    else:
        if len(qts) != 2:
            return False, f"q['fp4'] has {len(qts)} parts, expected (packed, scales)"
        if qf.dtype != torch.uint8 or qf.dim() != 4 or tuple(qf.shape[2:]) != (H, rb):
            return False, f"q['fp4'][0] is {qf.dtype} {tuple(qf.shape)}, expected uint8 (batch, next_n, {H}, {rb})"
        qs = qts[1]
        if qs.dtype != torch.uint8 or tuple(qs.shape) != (*qf.shape[:3], D // 32):
            return False, f"q['fp4'][1] is {qs.dtype} {tuple(qs.shape)}, expected uint8 {(*qf.shape[:3], D // 32)}"
    batch, next_n = qf.shape[:2]
    if next_n not in (1, 2, 4):
        return False, f"next_n = {next_n}; the kernel handles 1, 2, 4"
    if kv.dtype != torch.uint8 or kv.dim() != 4 or tuple(kv.shape[1:]) != (BLOCK, 1, rb + 4):
        return False, f"kv_cache['{PAIR[fmt]}'] is {kv.dtype} {tuple(kv.shape)}, expected uint8 (num_blocks, {BLOCK}, 1, {rb + 4})"
    if any(t.device != qf.device for t in (*qts, kv, weights, context_lens, block_tables)):
        return False, (f"inputs on different devices (q {qf.device}, cache {kv.device}, weights {weights.device}, "
                       f"context_lens {context_lens.device}, block_tables {block_tables.device})")
    if not (all(t.is_contiguous() for t in qts) and kv.is_contiguous() and weights.is_contiguous()
            and context_lens.is_contiguous() and block_tables.stride(1) == 1):
        return False, "a tensor is not contiguous"
    if kv.data_ptr() % 16 or any(t.data_ptr() % 16 for t in qts):
        return False, "q or the cache is not 16-byte aligned (TMA)"
    if weights.dtype != torch.float32 or tuple(weights.shape) != (batch * next_n, H):
        return False, f"weights {weights.dtype} {tuple(weights.shape)}, expected float32 ({batch * next_n}, {H})"
    if context_lens.dtype != torch.int32 or tuple(context_lens.shape) != (batch,):
        return False, "context_lens is not int32 (batch,)"
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or block_tables.shape[0] != batch:
        return False, "block_tables is not int32 (batch, pages)"
    if not isinstance(max_model_len, int) or max_model_len <= 0:
        return False, f"max_model_len = {max_model_len!r}"
    if block_tables.shape[1] * BLOCK < max_model_len:
        return False, "block_tables has fewer than max_model_len / 64 pages"
    if kv.shape[0] == 0:
        return False, f"kv_cache['{PAIR[fmt]}'] has no blocks"
    if kv.shape[0] * CACHE_ROWS_PER_BLOCK[fmt] >= 2 ** 31 or qf.numel() >= 2 ** 31:
        return False, "cache or q too large for 32-bit row coordinates / offsets"
    return True, "ok"


def _cache_views(kv, fmt):
    """The cache as 2-D rows of ROW_BYTES (keys by TMA / plain loads) and as 32-bit words (scales)."""
    rows = kv.shape[0] * CACHE_ROWS_PER_BLOCK[fmt]
    if PAIR[fmt] == "fp8":
        return kv.view(torch.float8_e4m3fn).view(rows, D), kv.view(torch.float32).view(rows, D // 4)
    return kv.view(rows, D // 2), kv.view(torch.int32).view(rows, D // 8)


def _descriptors(data, fmt, next_n, q_tma=1, kv_tma=1, scale_tma=1):
    """Host TensorDescriptors (None where the plan does not use one) and the kernel's pointer arguments."""
    qts, kv = _format_tensors(data, fmt)
    batch, qn = qts[0].shape[0], next_n * H
    keys, words = _cache_views(kv, fmt)
    rows, rb = keys.shape
    q_desc = k_desc = s_desc = None
    if fmt == "fp8":
        q2 = qts[0].view(batch * qn, D)
        q_desc = TensorDescriptor(q2, [batch * qn, D], [D, 1], [qn, D]) if q_tma else None
        s_desc = (TensorDescriptor(words, [rows, D // 4], [D // 4, 1], [BLOCK * 4 // D, D // 4])
                  if scale_tma else None)
        q_args = (qts[0], qts[0])  # q_scale_ptr: unused by the fp8 kernel
    else:
        q_args = (qts[0], qts[1].view(torch.int32))
    k_desc = TensorDescriptor(keys, [rows, rb], [rb, 1], [BLOCK, rb]) if kv_tma else None
    return (q_desc, k_desc, s_desc, *q_args, keys, words)


def launch(data: input_t, plan=None) -> torch.Tensor:
    """Run the plan's kernel through Triton's JIT (no routing, no launch cache): the path that compiles,
    and what the CPU tests drive under TRITON_INTERPRET=1 (the Triton kernel; Gluon has no interpreter)."""
    q, kv_cache, weights, context_lens, block_tables, max_model_len = data
    batch, next_n, _ = _shape_of(data)
    plan = as_plan(plan or plan_for(batch, next_n, max_model_len))
    fmt, chunk, stages, warps = plan.fmt, plan.chunk, plan.stages, plan.warps
    bt_vector, scale_tma, kv_tma, q_tma = plan.bt_vector, plan.scale_tma, plan.kv_tma, plan.q_tma
    if fmt == "fp4" and (scale_tma or q_tma):
        raise ValueError(f"plan {plan}: the fp4 kernel loads q and the scales without TMA")
    out = torch.empty((batch * next_n, max_model_len), dtype=torch.float32, device=weights.device)
    pages = (max_model_len + BLOCK - 1) // BLOCK
    grid = ((pages + chunk - 1) // chunk, batch)
    if fmt in GLUON_FORMATS:
        if (warps, bt_vector, scale_tma, kv_tma, q_tma) != (4, 0, 1, 1, 0):
            raise ValueError(f"plan {plan}: a Gluon kernel is one warpgroup with TMA keys and scales, "
                             f"({fmt}, chunk, stages, 4, 0, 1, 1, 0)")
        qts, kv = _format_tensors(data, fmt)
        keys, words = _cache_views(kv, fmt)
        words = words.reshape(-1)
        k_type, w_type = (gl.float8e4nv, gl.float32) if fmt == "fp8w" else (gl.uint8, gl.int32)
        k_desc = GluonTensorDescriptor(keys, list(keys.shape), [keys.shape[1], 1], [BLOCK, keys.shape[1]],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK, keys.shape[1]], k_type))
        w_desc = GluonTensorDescriptor(words, [words.shape[0]], [1], [BLOCK],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK], w_type))
        q_scales = qts[0] if fmt == "fp8w" else qts[1].view(torch.int32)  # (unused by the fp8 kernel)
        args = (k_desc, w_desc, qts[0], q_scales, keys, words, weights, context_lens, block_tables, out,
                block_tables.stride(0), out.stride(0), max_model_len)
        kernel, row_dims = ((_fp8_wgmma_kernel, {"D": D}) if fmt == "fp8w" else
                            (_fp4_wgmma_kernel, {"WARP_SPECIALIZE": fmt == "fp4ws", "PRODUCER_REGS": PRODUCER_REGS}))
        options = {"maxnreg": ws_maxnreg(next_n)} if fmt == "fp4ws" else {}
        ck = kernel[grid](*args, NEXT_N=next_n, H=H, **row_dims, BLOCK=BLOCK, CHUNK=chunk, NUM_STAGES=stages,
                          num_warps=4, **options)
        _record_compiled((kernel.__name__, plan, out.device.index), ck)
        return out
    args = _descriptors(data, fmt, next_n, q_tma, kv_tma, scale_tma)
    ck = _paged_mqa_logits_kernel[grid](
        *args, weights, context_lens, block_tables, out,
        block_tables.stride(0), out.stride(0), max_model_len,
        FMT=FMT_IDS[fmt], NEXT_N=next_n, H=H, D=D, BLOCK=BLOCK, CHUNK=chunk,
        NUM_STAGES=stages, BT_VECTOR=bt_vector, SCALE_TMA=scale_tma, KV_TMA=kv_tma, Q_TMA=q_tma,
        num_warps=warps, num_stages=stages,
    )
    _record_compiled(("_paged_mqa_logits_kernel", plan, out.device.index), ck)
    return out


# Launch cache: input signature -> _Route (compiled kernel launched directly, grid, constexpr tail,
# descriptor parameters). A hit skips routing, Triton's argument binding, its Python launcher (which
# re-walks the arguments to encode descriptors) and its per-pointer driver check. The signature holds
# every property that routing, Triton's specialization (16-byte alignment of pointers) and the grid
# depend on, for the tensors of the format pair the shape's plan reads; never a tensor's identity or
# contents. A route is verified bitwise against Triton's own launch when it is made.
_routes = {}  # signature -> a _Route, a _TritonLaunch or a _Fallback: what its later calls run
_direct_launch_off = []  # set when a direct launch raised (Triton API drift): Triton's path from then on


def _signature(data):
    q, kv_cache, weights, context_lens, block_tables, max_model_len = data
    fmt = plan_for(*_shape_of(data))[0]
    qts, kv = _format_tensors(data, fmt)
    qf, kv_shape = qts[0], kv.shape
    # Read on every call, so kept lean: get_device() (an int) rather than .device, and the fp4 scales
    # only for fp4 (the fp8 pair has one q tensor).
    qa = ((qts[1].shape, qts[1].stride(), qts[1].dtype, qts[1].get_device(), qts[1].data_ptr() & 15)
          if PAIR[fmt] == "fp4" else None)
    # The cache's block count is left out (it follows the random context lengths, so it changes with
    # every input); only whether it fits 32-bit row coordinates counts, and _Route reads it per call.
    return (fmt, qf.shape, qf.stride(), qf.dtype, qf.get_device(), qa,
            0 < kv_shape[0] * CACHE_ROWS_PER_BLOCK[fmt] < 2 ** 31, kv_shape[1:], kv.stride(), kv.dtype,
            kv.get_device(), weights.shape, weights.stride(), weights.dtype, weights.get_device(),
            context_lens.shape, context_lens.stride(), context_lens.dtype, context_lens.get_device(),
            block_tables.shape, block_tables.stride(), block_tables.dtype, block_tables.get_device(),
            max_model_len, type(max_model_len),
            (qf.data_ptr() | kv.data_ptr() | weights.data_ptr() | context_lens.data_ptr()
             | block_tables.data_ptr()) & 15)


# --- shared block: direct launch (the same text in both submissions: tests/test_shared_blocks.py) ---
class _DirectLaunch:
    """A CompiledKernel launched through Triton's C launcher (the module its Python launcher
    wraps) with arguments the caller expands: tensor descriptors as (CUtensorMap, shape...,
    strides...) and pointers as ints, which skips the per-pointer driver check (the route's
    signature already pins device, dtype and alignment). Built from Triton 3.x internals;
    _make_route checks it bitwise against Triton's own launch before it is used."""

    def __init__(self, ck):
        from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST
        ck._init_handles()
        runner = ck.run
        if runner.global_scratch_size or runner.profile_scratch_size:
            raise RuntimeError("the kernel needs launcher-allocated scratch")
        launch = runner.launch
        closure = getattr(launch, "__closure__", None)
        if closure:  # wrap_handle_tensordesc's Python wrapper: take the C launcher it wraps
            launch = dict(zip(launch.__code__.co_freevars, closure))["launcher"].cell_contents
        self.launch = launch
        # The C launcher's fixed head: function, cooperative, pdl, global/profile scratch,
        # kernel metadata, launch metadata, enter/exit hooks (custom_kernel checks that none is set).
        self.head = (ck.function, bool(runner.launch_cooperative_grid), bool(runner.launch_pdl),
                     None, None, ck.packed_metadata, None, None, None)
        self.tma = []  # per descriptor argument: fill_tma_descriptor's leading parameters
        for m in getattr(ck.metadata, "tensordesc_meta", None) or []:
            if m.get("fp4_padded"):
                raise RuntimeError("fp4-padded descriptors are not handled")
            self.tma.append((m["swizzle"], m["elem_size"], TMA_DTYPE_DEVICE_TO_HOST[m["elem_type"]],
                             m["block_size"]))
# --- end of shared block: direct launch ---


# --- shared block: outputs ahead (the same text in both submissions: tests/test_shared_blocks.py) ---
class _OutputsAhead:
    """Allocates each call's output during the call before, right after that call's launches: the
    caching allocator's host time (docs/paged_design.md) then overlaps running kernels instead of
    delaying the next launch, and after the L2 flush of a timed call host time is what shows. Not a
    reuse: every call returns a tensor allocated for it alone and never handed out before. Kept per
    stream, since the allocator ties a block to the stream it was allocated on; bounded. With
    ahead=False (short kernels: host time after the launches would show at the end instead) each
    call allocates its own output before its launches."""

    def __init__(self, shape, ahead=True):
        self.shape, self.ahead, self.spare = shape, ahead, {}  # stream -> the next call's output

    def take(self, like, stream):
        out = self.spare.pop(stream, None)
        return like.new_empty(self.shape) if out is None else out

    def allocate_next(self, like, stream):
        if not self.ahead:
            return
        if len(self.spare) >= 4:
            self.spare.clear()
        self.spare[stream] = like.new_empty(self.shape)
# --- end of shared block: outputs ahead ---


class _Route:
    """One input signature's launch, everything but the data pointers and the cache's block count fixed."""

    def __init__(self, data, plan, ck):
        weights, max_model_len = data[2], data[5]
        batch, next_n, _ = _shape_of(data)
        self.plan = plan = as_plan(plan)
        self.fmt = fmt = plan.fmt
        chunk, stages = plan.chunk, plan.stages
        bt_vector, scale_tma, kv_tma, q_tma = plan.bt_vector, plan.scale_tma, plan.kv_tma, plan.q_tma
        self.kernel = _DirectLaunch(ck)
        self.fill_tma = triton.runtime.driver.active.utils.fill_tma_descriptor
        self.stream_of = triton.runtime.driver.active.get_current_stream
        self.device = weights.device
        pages = (max_model_len + BLOCK - 1) // BLOCK
        self.grid = ((pages + chunk - 1) // chunk, batch, 1)
        self.out_shape = (batch * next_n, max_model_len)
        self.rows_per_block = CACHE_ROWS_PER_BLOCK[fmt]
        qn, rb = next_n * H, ROW_BYTES[fmt]
        # Per descriptor parameter (None if the plan does not use it): source tensor (0 = q, 1 = the
        # cache), fill_tma_descriptor's leading parameters, row count (None: the cache's, read per
        # call) and width of the 2-D view (0: the cache as one row of 32-bit words, a 1-D descriptor).
        if fmt in GLUON_FORMATS:  # the Gluon kernels: keys [rows, row bytes] and scale words
            specs = [(1, None, rb), (1, None, 0)]
            self.tail = ((next_n, H, D, BLOCK, chunk, stages) if fmt == "fp8w"
                         else (next_n, H, BLOCK, chunk, stages, fmt == "fp4ws", PRODUCER_REGS))
        else:
            specs = [(0, batch * qn, D) if q_tma else None, (1, None, rb) if kv_tma else None,
                     (1, None, D // 4) if scale_tma else None]
            self.tail = (FMT_IDS[fmt], next_n, H, D, BLOCK, chunk, stages, bt_vector, scale_tma, kv_tma, q_tma)
        tma = iter(self.kernel.tma)
        self.descs = [None if sp is None else (sp[0], next(tma), sp[1], sp[2]) for sp in specs]
        if next(tma, None) is not None:
            raise RuntimeError("descriptor count differs from the plan")
        self.words_per_row = rb // 4
        self.scalars = (data[4].stride(0), max_model_len, max_model_len)  # bt, out strides; len
        self.descriptor_args = {}  # (q pointer, cache pointer, cache rows) -> the descriptor arguments
        self.outputs = _OutputsAhead(self.out_shape)

    def _descriptor_args(self, ptrs, cache_rows):
        """The kernel's descriptor parameters for q and a cache at these addresses, the cache of this
        many rows. Encoding is a pure function of them (box, swizzle and widths are the route's), so
        repeated inputs reuse it: a memo of addresses and a shape, never of data. Bounded, since fresh
        inputs (leaderboard mode) bring new addresses nearly every call."""
        key = (*ptrs, cache_rows)
        args = self.descriptor_args.get(key)
        if args is None:
            if len(self.descriptor_args) >= 16:
                self.descriptor_args.clear()
            args = []
            for d in self.descs:
                if d is None:
                    args.append(None)
                else:
                    src, head, rows, width = d
                    rows = rows or cache_rows
                    if width:
                        args.append(self.fill_tma(ptrs[src], *head, [rows, width], [width, 1], 0))
                        args.extend((rows, width, width, 1))
                    else:
                        words = rows * self.words_per_row
                        args.extend((self.fill_tma(ptrs[src], *head, [words], [1], 0), words, 1))
            args = self.descriptor_args[key] = tuple(args)
        return args

    def __call__(self, data):
        q, kv_cache, weights, context_lens, block_tables, max_model_len = data
        qts, kv = _format_tensors(data, self.fmt)
        stream = self.stream_of(self.device.index)
        out = self.outputs.take(weights, stream)  # float32 on the device: the signature pins both
        ptrs = (qts[0].data_ptr(), kv.data_ptr())
        args = self._descriptor_args(ptrs, kv.shape[0] * self.rows_per_block)
        k = self.kernel
        k.launch(*self.grid, stream, *k.head, *args,
                 ptrs[0], qts[-1].data_ptr(), ptrs[1], ptrs[1], weights.data_ptr(), context_lens.data_ptr(),
                 block_tables.data_ptr(), out.data_ptr(), *self.scalars, *self.tail)
        self.outputs.allocate_next(weights, stream)  # while the kernel runs
        return out


# --- shared block: launch hooks (the same text in both submissions: tests/test_shared_blocks.py) ---
def _launch_hooked():
    """A profiler's launch hook is set (or this Triton has no knobs): use Triton's launch path,
    which calls the hooks; direct launches would skip them. Triton 3.6's hooks are HookChains
    (empty when unset); older ones are None or a callable."""
    if knobs is None:
        return True
    enter, exit_ = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    return bool(getattr(enter, "calls", enter)) or bool(getattr(exit_, "calls", exit_))
# --- end of shared block: launch hooks ---


def _make_route(data, plan):
    """(route or False, this call's output): launch through Triton's JIT (compiling), then build the
    route and check that it reproduces that output bit for bit (one sync, once per signature)."""
    out = launch(data, plan)
    try:
        route = _Route(data, plan, next(reversed(_compiled.values())))
        if not torch.equal(route(data), out):
            raise RuntimeError("its output differs from Triton's launch")
    except Exception as exc:  # Triton's internals moved: Triton's own launch path for this signature
        _warn_once(f"direct launch off for this input signature ({type(exc).__name__}: {exc})")
        route = False
    return route, out


# --- shared block: route kinds (the same text in both submissions: tests/test_shared_blocks.py) ---
class _TritonLaunch(NamedTuple):  # a signature launched through Triton's own launch path
    plan: Plan


class _Fallback(NamedTuple):  # a signature whose plan cannot launch here: the reference
    reason: str
# --- end of shared block: route kinds ---


# --- shared block: fallback (the same text in both submissions: tests/test_shared_blocks.py) ---
def _warn_once(message: str) -> None:
    """The message in the log the first time it comes (a fallback's reason recurs on every call)."""
    if message not in _logged_reasons:
        _logged_reasons.add(message)
        log.warning("%s %s", LOG_PREFIX, message)


def _fall_back(data: input_t, reason: str) -> output_t:
    _warn_once(f"fast path off, using reference: {reason}")
    from reference import ref_kernel
    return ref_kernel(data)
# --- end of shared block: fallback ---


def custom_kernel(data: input_t) -> output_t:
    try:
        key = _signature(data)
    except Exception:  # not the expected types: the first call's checks say what is wrong
        key = None
    route = _routes.get(key) if key is not None else None
    if isinstance(route, _Route):
        if not _direct_launch_off and not _launch_hooked():
            try:
                return route(data)
            except Exception as exc:  # launcher API drift: Triton's own launch path from now on
                _direct_launch_off.append(f"{type(exc).__name__}: {exc}")
                log.warning("%s direct launches off: %s", LOG_PREFIX, _direct_launch_off[0])
        return launch(data, route.plan)  # a profiler's hooks (Triton's path calls them), or launches off
    if isinstance(route, _TritonLaunch):
        return launch(data, route.plan)
    if isinstance(route, _Fallback):
        return _fall_back(data, route.reason)
    return _first_call(data, key)


def _first_call(data: input_t, key) -> output_t:
    """The first call of a signature (every call while a profiler's hooks are set, and every call whose
    input is not of the expected types): check the input, launch through Triton's JIT (compiling), and
    record what the signature's later calls run."""
    try:
        plan = plan_for(*_shape_of(data))
    except Exception as exc:
        return _fall_back(data, f"input is not (q, kv_cache, weights, context_lens, block_tables, "
                                f"max_model_len): {type(exc).__name__}: {exc}")
    ok, reason = can_route(data, plan.fmt)
    if not ok:
        return _fall_back(data, reason)
    try:
        if key is None or _direct_launch_off or _launch_hooked():
            return launch(data, plan)
        route, out = _make_route(data, plan)
        _routes[key] = route or _TritonLaunch(plan)
        return out
    except Exception as exc:  # the plan's kernel cannot run here (e.g. out of shared memory)
        reason = f"the kernel failed to launch ({type(exc).__name__}: {str(exc)[:200]})"
        if key is not None:
            _routes[key] = _Fallback(reason)
        return _fall_back(data, reason)


# ----------------------------------------------------------------------------------------
# For tools (benchmarks, SASS dumps): read-only views of the host path's state, and a reset.
# ----------------------------------------------------------------------------------------
# --- shared block: tool access (the same text in both submissions: tests/test_shared_blocks.py) ---
def compiled_kernels() -> dict:
    """Every kernel compiled so far, the latest launched last: {key: Triton's CompiledKernel} (its .asm
    holds PTX and SASS); the key names the kernel, its compile-time constants and launch options."""
    return dict(_compiled)


def route_count() -> int:
    """How many input signatures have a cached route (or a recorded reason to fall back)."""
    return len(_routes)


def clear_routes() -> None:
    """Forget every route: the next call of each signature routes, compiles and checks again."""
    _routes.clear()

def _record_compiled(key, ck) -> None:
    """Keeps a launch's CompiledKernel for compiled_kernels(), re-inserted so that the latest is last."""
    _compiled.pop(key, None)
    _compiled[key] = ck
# --- end of shared block: tool access ---
