#!POPCORN leaderboard mla-decode-hopper
#!POPCORN gpu H100
"""MLA decode (DeepSeek multi-head latent attention) for Hopper (sm_90) in Triton.

custom_kernel(data) computes, for every query row of sequence b,
softmax(q . K^T * sm_scale) . V over that sequence's cache rows, with K = all 576
dims and V = the first 512 dims. The checker accepts exact attention over any of
the three caches it hands us, so the fast path reads the one its plan names and
dequantizes it in registers: fp8 (576 bytes a token) on every benchmark shape; the MXFP4
path (306 bytes) runs but is slower on Hopper (docs/mla_notes.md says why).

Layout of this file (one place per concern):
  * Plan, PLANS, plan_for() - routing: a typed plan per shape, from the table or the rule
  * Triton kernels          - _mla_split_kernel (attention over one KV split),
                              _mla_combine_kernel (exact log-sum-exp merge of splits)
  * Gluon kernel            - _mla_fp8_wgmma_kernel (every benchmark shape: fp8 cache, both
                              products on wgmma, V fed from registers; merges its own splits)
  * host path               - _fast_path_problem() (every reason to fall back to the reference),
                              _launch() (Triton's launch path), _Route (direct launches of a
                              signature), custom_kernel() / _first_call() (dispatch)
  * for tools               - compiled_kernels(), route_count(), clear_routes()

Assumptions not checked (checking would need a device sync on every call): qo_indptr is
b * q_seq_len, as the problem defines it (one program per query row: sequence = row //
q_seq_len), and kv_indptr is non-decreasing within the cache's rows.
"""
import logging
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

try:  # launch hooks (profilers) live here in Triton >= 3.4; without it, no direct launches
    from triton import knobs
except ImportError:  # pragma: no cover - depends on the installed Triton
    knobs = None

from task import input_t, output_t

try:  # host-side TMA descriptors (Triton >= 3.3)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed Triton
    TensorDescriptor = None

try:  # Gluon (Triton's explicit-layout dialect, experimental): the fp8 wgmma kernel
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma as gtma,
                                                                   warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
    _GLUON_ERROR = None
except Exception as exc:  # pragma: no cover - depends on the installed Triton
    gluon = gl = GluonTensorDescriptor = None
    _GLUON_ERROR = f"{type(exc).__name__}: {exc}"

log = logging.getLogger("mla_submission")
LOG_PREFIX = "MLA"  # what this submission's log lines start with

NUM_HEADS, QK_DIM, V_DIM, ROPE_DIM = 16, 576, 512, 64
MXFP4_ROW_BYTES, MXFP4_SCALES = QK_DIM // 2, QK_DIM // 32  # 288 packed bytes, 18 E8M0 scales

# The combine kernel: up to this many (padded) splits it loops over them; above, a program loads
# this many partial-output values (64 per thread).
COMBINE_LOOP_SPLITS = tl.constexpr(8)
COMBINE_ELEMENTS = 8192

# Under TRITON_INTERPRET=1 (the CPU tests) inline PTX cannot run: plain Triton ops instead.
_INTERPRET = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"))

# KV formats the kernel can read (constexpr FMT).
FMT_MXFP4, FMT_FP8, FMT_BF16 = 0, 1, 2
FMT_IDS = {"mxfp4": FMT_MXFP4, "fp8": FMT_FP8, "bf16": FMT_BF16}
FMT_BYTES_PER_TOKEN = {"mxfp4": MXFP4_ROW_BYTES + MXFP4_SCALES, "fp8": QK_DIM, "bf16": 2 * QK_DIM}

# ----------------------------------------------------------------------------------------
# Routing: a Plan per shape, from the table PLANS (produced offline by tools/mla/tune_mla.py on an
# H200, keyed by (batch_size, kv_seq_len, q_seq_len); nothing is timed at run time) or, for a
# shape not in it, from the rule in plan_for.
# ----------------------------------------------------------------------------------------
# The kernels a plan can name: _mla_split_kernel with its dots oriented for mma.sync (HMMA: M = the
# 16 heads) or for wgmma (M = cache rows, the TRANS constexpr), or the Gluon kernel
# _mla_fp8_wgmma_kernel (fp8 cache only, with the tile, warps and stages its layouts are written for).
KERNEL_HMMA, KERNEL_WGMMA, KERNEL_GLUON = 0, 1, 2
GLUON_BN, GLUON_WARPS, GLUON_STAGES = 64, 4, 2


class Plan(NamedTuple):
    fmt: str      # the cache it reads: "mxfp4", "fp8" or "bf16"
    block_n: int  # cache rows per tile
    splits: int   # programs per query row, each over a contiguous part of the sequence's rows
    warps: int
    stages: int   # depth of the cache-load pipeline
    kernel: int   # KERNEL_HMMA, KERNEL_WGMMA or KERNEL_GLUON


# Written by `python tools/mla/tune_mla.py` on an H200 (last: --around-plans; timings in docs/mla_notes.md).
# The Gluon kernel's split counts were re-checked once it merged its own splits, and it took 4 x 1024 too.
PLANS = {
    # (batch, kv_seq_len, q_seq_len): Plan
    (4, 1024, 1): Plan(fmt='fp8', block_n=64, splits=16, warps=4, stages=2, kernel=KERNEL_GLUON),
    (4, 8192, 1): Plan(fmt='fp8', block_n=64, splits=33, warps=4, stages=2, kernel=KERNEL_GLUON),
    (32, 1024, 1): Plan(fmt='fp8', block_n=64, splits=4, warps=4, stages=2, kernel=KERNEL_GLUON),
    (32, 8192, 1): Plan(fmt='fp8', block_n=64, splits=8, warps=4, stages=2, kernel=KERNEL_GLUON),
    (64, 1024, 1): Plan(fmt='fp8', block_n=64, splits=2, warps=4, stages=2, kernel=KERNEL_GLUON),
    (64, 8192, 1): Plan(fmt='fp8', block_n=64, splits=4, warps=4, stages=2, kernel=KERNEL_GLUON),
    (256, 1024, 1): Plan(fmt='fp8', block_n=64, splits=1, warps=4, stages=2, kernel=KERNEL_GLUON),
    (256, 8192, 1): Plan(fmt='fp8', block_n=64, splits=1, warps=4, stages=2, kernel=KERNEL_GLUON),
}

NUM_SMS = 132               # H200; the rule below only needs a rough count
MIN_TOKENS_PER_SPLIT = 128  # below this a split's fixed cost (Q load, partial store) dominates
MAX_SPLITS = 64


GLUON_MIN_TOKENS = 1 << 12  # from this many cache rows (batch * kv_seq_len) on, the Gluon fp8 kernel
BIG_MIN_TOKENS = 1 << 18    # without Gluon: from this many on the bf16 cache, which the Triton kernel
# streams at full bandwidth; below, the Triton kernel on fp8
GLUON_TWO_PER_SM_ROWS = 1024  # the Gluon kernel runs two programs per SM where each split still gets
# this many rows; on shorter splits a program's fixed cost (~13 us) outweighs the second one: one per SM.
# Its splits may be one tile (GLUON_BN rows) short: it merges them itself, without a second kernel.
# (fmt, block_n, warps, stages, kernel) the rule uses: the tuned table's winners.
RULE_KERNEL = {"gluon": ("fp8", GLUON_BN, GLUON_WARPS, GLUON_STAGES, KERNEL_GLUON),
               "bf16": ("bf16", 64, 4, 3, KERNEL_HMMA), "fp8": ("fp8", 128, 8, 3, KERNEL_HMMA)}


_gluon_off = []  # set when the Gluon kernel failed to build or launch here: Triton plans from then on


def _gluon_usable() -> bool:
    return gluon is not None and not _gluon_off


def plan_for(batch_size: int, kv_seq_len: int, q_seq_len: int) -> Plan:
    """Plan from the table (unless it names the Gluon kernel and Gluon is missing or failed), else
    from the rule: from GLUON_MIN_TOKENS rows on, the Gluon fp8 kernel with two programs per SM, or
    one where two would make splits shorter than GLUON_TWO_PER_SM_ROWS (it runs at most two per SM,
    and more splits only add partials), no split shorter than one tile; without Gluon, the bf16 cache
    from BIG_MIN_TOKENS rows on; else fp8 with enough KV splits that ~2 programs run per SM, no split
    shorter than MIN_TOKENS_PER_SPLIT rows (kv_seq_len is the nominal/average length)."""
    plan = PLANS.get((batch_size, kv_seq_len, q_seq_len))
    plan = Plan(*plan) if plan is not None else None  # (a table edited by hand may hold tuples)
    if plan is not None and (plan.kernel != KERNEL_GLUON or _gluon_usable()):
        return plan
    programs = max(1, batch_size * q_seq_len)
    cap = max(1, kv_seq_len // MIN_TOKENS_PER_SPLIT)
    rows = batch_size * kv_seq_len
    if rows >= GLUON_MIN_TOKENS and _gluon_usable():
        kind = "gluon"
        cap = max(1, kv_seq_len // GLUON_BN)
        want = (2 * NUM_SMS) // programs
        if want > 1 and kv_seq_len // want < GLUON_TWO_PER_SM_ROWS:
            want = NUM_SMS // programs
    else:
        kind = "bf16" if rows >= BIG_MIN_TOKENS else "fp8"
        want = triton.cdiv(2 * NUM_SMS, programs)
    splits = max(1, min(want, cap, MAX_SPLITS))
    fmt, block_n, warps, stages, kernel = RULE_KERNEL[kind]
    return Plan(fmt, block_n, splits, warps, stages, kernel)


# ----------------------------------------------------------------------------------------
# PTX snippets, each behind a small Triton wrapper that states its contract (inputs, outputs,
# exactness) and falls back to plain Triton ops under the interpreter.
# ----------------------------------------------------------------------------------------
# E2M1 -> bf16 on the GPU, in PTX on packed registers (Triton's per-byte integer ops and its
# fp8 conversion cost ~3x more instructions, which made the kernel ALU-bound). prmt spreads bytes
# 0/1 (then 2/3) to the two 16-bit halves, and both nibbles of the pair are decoded from that one
# word: placing sign/exponent/mantissa at bf16 bits 15 / 8-7 / 6 gives exactly value * 2^-126
# (E=0 lands on a bf16 subnormal); two exact multiplies by 2^126 and the block scale finish.
# The same text in the paged kit (tests/test_shared_blocks.py); tests/test_asm_decodes.py runs it in a PTX emulator.
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
def _mx_decode(pk, s, DOT: tl.constexpr):
    """Packed bytes and per-element scale 2^(e-127) (DOT dtype) -> (low nibble, high nibble)
    values, elementwise. DOT=bf16 uses the PTX above; other dtypes (the CPU interpreter's
    fp16) use plain Triton ops: E2M1 -> e4m3 bits is exact and equals value * 2^-6."""
    if DOT == tl.bfloat16:  # impure on purpose: see _FP8_ASM
        return tl.inline_asm_elementwise(_E2M1_ASM, "=r,=r,=r,=r,r,r,r", [pk, s],
                                         dtype=(tl.bfloat16, tl.bfloat16), is_pure=False, pack=4)
    else:
        lo = pk & 15
        hi = pk >> 4
        lo = (((lo & 8) << 4) | ((lo & 7) << 2)).to(tl.float8e4nv, bitcast=True).to(DOT)
        hi = (((hi & 8) << 4) | ((hi & 7) << 2)).to(tl.float8e4nv, bitcast=True).to(DOT)
        return lo * (s * 64.0), hi * (s * 64.0)


# e4m3 -> fp16 on the GPU: one cvt per pair. Like the MXFP4 decode, it is inline asm marked
# impure so that Triton converts in a layout with wide shared-memory loads and then moves the
# 16-bit result to the dot operand layout (ldmatrix); as a pure op Triton hoists the layout
# change above it and reads the 8-bit tile byte by byte in the operand layout (~3x the
# instructions, and spills).
_FP8_ASM = tl.constexpr("""
{
.reg .b16 lo, hi;
mov.b32 {lo, hi}, $2;
cvt.rn.f16x2.e4m3x2 $0, lo;
cvt.rn.f16x2.e4m3x2 $1, hi;
}
""")


@triton.jit
def _fp8_to(x, DOT: tl.constexpr):
    """e4m3 tile -> DOT (fp16 on the GPU via _FP8_ASM; plain conversion elsewhere)."""
    if DOT == tl.float16 and not _INTERPRET:
        return tl.inline_asm_elementwise(_FP8_ASM, "=r,=r,r", [x.to(tl.uint8, bitcast=True)],
                                         dtype=tl.float16, is_pure=False, pack=4)
    else:
        return x.to(DOT)


# ----------------------------------------------------------------------------------------
# Kernels.
# Per program: one query token (its 16 heads share every KV tile), one KV split.
# The 576 K dims are processed as 8 "groups" of 64 columns (= V dims) plus 2 rope groups of
# 32 columns, so no tile exceeds a 256-wide TMA box or needs a non-power-of-2 shape, and
# the MXFP4 nibbles never have to be interleaved: an MXFP4 group holds the even (low
# nibble) or odd (high nibble) columns of a 128-column chunk, and q/out use the same
# column map (_group_cols). Dots: S = Q.K^T (M = 16 heads) and O += P.V per group.
# The dims (16 heads, 576 = 512 + 64 columns, 18 MXFP4 scales a row) and the FMT ids (0 MXFP4,
# 1 fp8, 2 bf16: FMT_IDS) are literals here: the Triton interpreter that runs these kernels in the
# CPU tests cannot combine a global constexpr with a tensor (`C // 4 + tl.arange(...)` fails there).
# ----------------------------------------------------------------------------------------
@triton.jit
def _group_cols(base: tl.constexpr, half: tl.constexpr, W: tl.constexpr, FMT: tl.constexpr):
    """Columns of q/out (within 0..575) that group `half` of a chunk starting at `base` holds."""
    i = tl.arange(0, W)
    if FMT == 0:  # MXFP4: byte i holds columns 2i (low nibble) and 2i+1 (high nibble)
        return base + 2 * i + half
    else:
        return base + half * W + i


@triton.jit
def _scale_of(sc, DOT: tl.constexpr):
    """E8M0 bytes -> 2^(e-127) in DOT (built from fp32 exponent bits; e=0 -> 0)."""
    return (sc.to(tl.int32) << 23).to(tl.float32, bitcast=True).to(DOT)


@triton.jit
def _mx_groups(pk, sc, NB: tl.constexpr, BN: tl.constexpr, DOT: tl.constexpr):
    """pk [BN, NB*16] packed bytes, sc [BN, NB] E8M0 scales -> (even cols, odd cols) [BN, NB*16]."""
    s = _scale_of(sc, DOT)
    s = tl.reshape(tl.broadcast_to(s[:, :, None], (BN, NB, 16)), (BN, NB * 16))
    return _mx_decode(pk, s, DOT)


@triton.jit
def _mx_groups_t(pk, sc, NB: tl.constexpr, BN: tl.constexpr, DOT: tl.constexpr):
    """Same as _mx_groups, transposed: -> (even cols, odd cols) as [NB*16, BN]."""
    s = _scale_of(tl.trans(sc), DOT)
    s = tl.reshape(tl.broadcast_to(s[:, None, :], (NB, 16, BN)), (NB * 16, BN))
    return _mx_decode(tl.trans(pk), s, DOT)


@triton.jit
def _kv_chunk(desc, scale_ptr, n, rows, valid, c: tl.constexpr, FMT: tl.constexpr):
    """Raw tiles behind groups 2c, 2c+1 (V/nope columns c*128 .. c*128+127) of rows n..n+BN-1:
    MXFP4 -> (packed bytes [BN,64], scales [BN,4]); fp8/bf16 -> two [BN,64] tiles."""
    if FMT == 0:
        sc = tl.load(scale_ptr + rows[:, None] * 18 + (c * 4 + tl.arange(0, 4))[None, :],
                     mask=valid[:, None], other=0)
        return desc.load([n, c * 64]), sc
    else:
        return desc.load([n, c * 128]), desc.load([n, c * 128 + 64])


@triton.jit
def _kv_rope(rdesc, scale_ptr, n, rows, valid, FMT: tl.constexpr):
    """Raw tiles behind the two 32-column rope groups (K columns 512..575)."""
    if FMT == 0:
        sc = tl.load(scale_ptr + rows[:, None] * 18 + (16 + tl.arange(0, 2))[None, :],
                     mask=valid[:, None], other=0)
        return rdesc.load([n, 256]), sc
    else:
        return rdesc.load([n, 512]), rdesc.load([n, 544])


@triton.jit
def _groups(a, b, NB: tl.constexpr, FMT: tl.constexpr, BN: tl.constexpr, DOT: tl.constexpr):
    """Raw tiles -> the two K groups [BN, NB*16] in the dot dtype."""
    if FMT == 0:
        return _mx_groups(a, b, NB, BN, DOT)
    elif FMT == 1:
        return _fp8_to(a, DOT), _fp8_to(b, DOT)
    else:
        return a.to(DOT), b.to(DOT)


@triton.jit
def _groups_t(a, b, NB: tl.constexpr, FMT: tl.constexpr, BN: tl.constexpr, DOT: tl.constexpr):
    """Raw tiles -> the two V groups transposed, [NB*16, BN]. Dequantizing again from the raw
    bytes (rather than transposing the K groups) keeps only the 4x smaller packed tile live
    across the softmax, which is what keeps the wgmma variant from spilling."""
    if FMT == 0:
        return _mx_groups_t(a, b, NB, BN, DOT)
    elif FMT == 1:
        return tl.trans(_fp8_to(a, DOT)), tl.trans(_fp8_to(b, DOT))
    else:
        return tl.trans(a).to(DOT), tl.trans(b).to(DOT)


# TRANS picks the orientation of the two dots. TRANS=0: S[16,BN] = Q.K^T, O[16,64] += P.V
# (M = 16 heads -> mma.sync/HMMA). TRANS=1: S^T[BN,16] = K.Q^T, O^T[64,16] += V^T.P^T, so M is
# BN or 64 and Hopper's wgmma (HGMMA) applies, with the dequantized K as the register operand.
@triton.jit
def _heads_b(x, TRANS: tl.constexpr):
    """Broadcast a per-head vector against a score/output tile."""
    if TRANS:
        return x[None, :]
    else:
        return x[:, None]


@triton.jit
def _rows_b(x, TRANS: tl.constexpr):
    """Broadcast a per-KV-row vector against a score tile."""
    if TRANS:
        return x[:, None]
    else:
        return x[None, :]


@triton.jit
def _tile_offs(head_stride: tl.constexpr, cols, TRANS: tl.constexpr):
    """Offsets of a (16 heads x cols) tile of q/out, in the orientation TRANS wants."""
    heads = tl.arange(0, 16)
    if TRANS:
        return heads[None, :] * head_stride + cols[:, None]
    else:
        return heads[:, None] * head_stride + cols[None, :]


@triton.jit
def _qk_chunk(q_even, q_odd, a, b, s_even, s_odd, NB: tl.constexpr, FMT: tl.constexpr,
              BN: tl.constexpr, TRANS: tl.constexpr, DOT: tl.constexpr):
    """(s_even, s_odd) += scores of one raw chunk's two groups. Two accumulators halve the
    chain of dependent MMAs per tile. Dequantizing right before its dots keeps only one
    chunk's bf16 tiles live (all at once made the wgmma variant spill)."""
    k_even, k_odd = _groups(a, b, NB, FMT, BN, DOT)
    if TRANS:
        return tl.dot(k_even, q_even, s_even), tl.dot(k_odd, q_odd, s_odd)
    else:
        return tl.dot(q_even, tl.trans(k_even), s_even), tl.dot(q_odd, tl.trans(k_odd), s_odd)


@triton.jit
def _pv_chunk(p, a, b, o_even, o_odd, alpha, FMT: tl.constexpr, BN: tl.constexpr,
              TRANS: tl.constexpr, DOT: tl.constexpr):
    """(o_even, o_odd) rescaled by alpha plus P.V for one raw chunk."""
    if TRANS:  # O^T += V^T . P^T with V^T re-dequantized from the raw tile
        v_even, v_odd = _groups_t(a, b, 4, FMT, BN, DOT)
        return (tl.dot(v_even, p, o_even * alpha[None, :]),
                tl.dot(v_odd, p, o_odd * alpha[None, :]))
    else:
        v_even, v_odd = _groups(a, b, 4, FMT, BN, DOT)
        return (tl.dot(p, v_even, o_even * alpha[:, None]),
                tl.dot(p, v_odd, o_odd * alpha[:, None]))


@triton.jit
def _ld_q(q_row, base: tl.constexpr, half: tl.constexpr, W: tl.constexpr, FMT: tl.constexpr,
          TRANS: tl.constexpr):
    return tl.load(q_row + _tile_offs(576, _group_cols(base, half, W, FMT), TRANS)).to(tl.float32)


@triton.jit
def _amax(x):
    return tl.max(tl.max(tl.abs(x), 1), 0)


@triton.jit
def _pow2(k):
    """2^k as fp32, exactly, for integer k in [-126, 127]."""
    return ((k + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _st_o(dst, o, base: tl.constexpr, half: tl.constexpr, FMT: tl.constexpr, TRANS: tl.constexpr):
    tl.store(dst + _tile_offs(512, _group_cols(base, half, 64, FMT), TRANS),
             o.to(dst.dtype.element_ty))


@triton.jit
def _split_bounds(kv_indptr_ptr, pid_q, pid_s, q_seq_len, num_splits, BN: tl.constexpr):
    """Cache rows [start, end) of query row pid_q's KV split pid_s: its sequence's rows cut into
    num_splits whole tiles of BN (the last splits may be short or empty). Scalar code, so the
    Gluon kernel calls it too."""
    seq = pid_q // q_seq_len
    kv_lo = tl.load(kv_indptr_ptr + seq)
    kv_hi = tl.load(kv_indptr_ptr + seq + 1)
    per_split = tl.cdiv(tl.cdiv(kv_hi - kv_lo, num_splits), BN) * BN
    start = kv_lo + pid_s * per_split
    return start, tl.minimum(start + per_split, kv_hi)


@triton.jit(do_not_specialize=["q_seq_len", "num_splits"])
def _mla_split_kernel(
    q_ptr, out_ptr, kv_desc, rope_desc, scale_ptr, kv_indptr_ptr, part_o_ptr, part_lse_ptr,
    qk_scale, q_seq_len, num_splits,
    FMT: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr, STAGES: tl.constexpr,
    TRANS: tl.constexpr, DOT: tl.constexpr,
):
    pid_q = tl.program_id(0)
    pid_s = tl.program_id(1)
    start, end = _split_bounds(kv_indptr_ptr, pid_q, pid_s, q_seq_len, num_splits, BN)
    out_scale = 1.0
    if FMT == 1:  # fp8: fold the per-tensor scale into the softmax scale and the output
        out_scale = tl.load(scale_ptr)
        qk_scale = qk_scale * out_scale

    q_row = q_ptr + pid_q * (16 * 576)
    q0 = _ld_q(q_row, 0, 0, 64, FMT, TRANS)
    q1 = _ld_q(q_row, 0, 1, 64, FMT, TRANS)
    q2 = _ld_q(q_row, 128, 0, 64, FMT, TRANS)
    q3 = _ld_q(q_row, 128, 1, 64, FMT, TRANS)
    q4 = _ld_q(q_row, 256, 0, 64, FMT, TRANS)
    q5 = _ld_q(q_row, 256, 1, 64, FMT, TRANS)
    q6 = _ld_q(q_row, 384, 0, 64, FMT, TRANS)
    q7 = _ld_q(q_row, 384, 1, 64, FMT, TRANS)
    qr0 = _ld_q(q_row, 512, 0, 32, FMT, TRANS)
    qr1 = _ld_q(q_row, 512, 1, 32, FMT, TRANS)
    q_mult = 1.0
    if DOT == tl.float16:
        # fp16 dots (fp8 -> fp16 is one cvt per pair; fp8 -> bf16 is not) have bf16's
        # precision and more, but not its range: scale q by 2^k so that its largest |value|
        # lands in [2^14, 2^15), and undo it exactly in the softmax scale.
        amax = tl.maximum(tl.maximum(_amax(q0), _amax(q1)), tl.maximum(_amax(q2), _amax(q3)))
        amax = tl.maximum(amax, tl.maximum(tl.maximum(_amax(q4), _amax(q5)),
                                           tl.maximum(_amax(q6), _amax(q7))))
        amax = tl.maximum(amax, tl.maximum(_amax(qr0), _amax(qr1)))
        biased_exp = (amax.to(tl.int32, bitcast=True) >> 23) & 255  # 0 for 0 / subnormal
        k = tl.minimum(tl.maximum(141 - biased_exp, -126), 126)
        q_mult = _pow2(k)
        qk_scale = qk_scale * _pow2(-k)
    q0 = (q0 * q_mult).to(DOT)
    q1 = (q1 * q_mult).to(DOT)
    q2 = (q2 * q_mult).to(DOT)
    q3 = (q3 * q_mult).to(DOT)
    q4 = (q4 * q_mult).to(DOT)
    q5 = (q5 * q_mult).to(DOT)
    q6 = (q6 * q_mult).to(DOT)
    q7 = (q7 * q_mult).to(DOT)
    qr0 = (qr0 * q_mult).to(DOT)
    qr1 = (qr1 * q_mult).to(DOT)

    AX: tl.constexpr = 0 if TRANS else 1  # the KV-row axis of a score tile
    m_i = tl.full([16], float("-inf"), tl.float32)
    l_i = tl.zeros([16], tl.float32)
    o0 = tl.zeros([64, 16] if TRANS else [16, 64], tl.float32)
    o1 = tl.zeros_like(o0)
    o2 = tl.zeros_like(o0)
    o3 = tl.zeros_like(o0)
    o4 = tl.zeros_like(o0)
    o5 = tl.zeros_like(o0)
    o6 = tl.zeros_like(o0)
    o7 = tl.zeros_like(o0)

    for n in tl.range(start, end, BN, num_stages=STAGES):
        rows = n + tl.arange(0, BN)
        valid = rows < end  # rows past `end` may belong to the next split/sequence
        s_e = tl.zeros([BN, 16] if TRANS else [16, BN], tl.float32)
        s_o = tl.zeros_like(s_e)
        a0, b0 = _kv_chunk(kv_desc, scale_ptr, n, rows, valid, 0, FMT)
        s_e, s_o = _qk_chunk(q0, q1, a0, b0, s_e, s_o, 4, FMT, BN, TRANS, DOT)
        a1, b1 = _kv_chunk(kv_desc, scale_ptr, n, rows, valid, 1, FMT)
        s_e, s_o = _qk_chunk(q2, q3, a1, b1, s_e, s_o, 4, FMT, BN, TRANS, DOT)
        a2, b2 = _kv_chunk(kv_desc, scale_ptr, n, rows, valid, 2, FMT)
        s_e, s_o = _qk_chunk(q4, q5, a2, b2, s_e, s_o, 4, FMT, BN, TRANS, DOT)
        a3, b3 = _kv_chunk(kv_desc, scale_ptr, n, rows, valid, 3, FMT)
        s_e, s_o = _qk_chunk(q6, q7, a3, b3, s_e, s_o, 4, FMT, BN, TRANS, DOT)
        ar, br = _kv_rope(rope_desc, scale_ptr, n, rows, valid, FMT)
        s_e, s_o = _qk_chunk(qr0, qr1, ar, br, s_e, s_o, 2, FMT, BN, TRANS, DOT)
        s = s_e + s_o
        s = tl.where(_rows_b(valid, TRANS), s * qk_scale, float("-inf"))  # log2 domain

        m_new = tl.maximum(m_i, tl.max(s, AX))  # finite: every tile has a valid row
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - _heads_b(m_new, TRANS)).to(DOT)
        l_i = l_i * alpha + tl.sum(p.to(tl.float32), AX)
        m_i = m_new
        o0, o1 = _pv_chunk(p, a0, b0, o0, o1, alpha, FMT, BN, TRANS, DOT)
        o2, o3 = _pv_chunk(p, a1, b1, o2, o3, alpha, FMT, BN, TRANS, DOT)
        o4, o5 = _pv_chunk(p, a2, b2, o4, o5, alpha, FMT, BN, TRANS, DOT)
        o6, o7 = _pv_chunk(p, a3, b3, o6, o7, alpha, FMT, BN, TRANS, DOT)

    # Normalise here so partials are plain averages; an empty split has l_i = 0, lse = -inf.
    inv = _heads_b(tl.where(l_i > 0, out_scale / l_i, 0.0), TRANS)
    if SPLIT:
        dst = part_o_ptr + (pid_q * num_splits + pid_s) * (16 * 512)
        lse = tl.where(l_i > 0, m_i + tl.log2(l_i), float("-inf"))
        tl.store(part_lse_ptr + (pid_q * num_splits + pid_s) * 16 + tl.arange(0, 16), lse)
    else:
        dst = out_ptr + pid_q * (16 * 512)
    _st_o(dst, o0 * inv, 0, 0, FMT, TRANS)
    _st_o(dst, o1 * inv, 0, 1, FMT, TRANS)
    _st_o(dst, o2 * inv, 128, 0, FMT, TRANS)
    _st_o(dst, o3 * inv, 128, 1, FMT, TRANS)
    _st_o(dst, o4 * inv, 256, 0, FMT, TRANS)
    _st_o(dst, o5 * inv, 256, 1, FMT, TRANS)
    _st_o(dst, o6 * inv, 384, 0, FMT, TRANS)
    _st_o(dst, o7 * inv, 384, 1, FMT, TRANS)


@triton.jit(do_not_specialize=["num_splits"])
def _mla_combine_kernel(part_o_ptr, part_lse_ptr, out_ptr, num_splits,
                        SPLITS_P2: tl.constexpr, BD: tl.constexpr):
    """out = sum_s w_s * O_s with w_s = 2^(lse_s - max) / sum 2^(lse - max), per head, for BD
    output columns. Up to COMBINE_LOOP_SPLITS splits: a loop over them, 128 columns per program.
    More splits (few query rows, long sequences: 4 x 8192 has 33): all partials in one
    [SPLITS_P2, 16, BD] load with a narrower BD, so more programs share the row; the loop is a
    chain of dependent loads there. With few splits the one-load form is slower instead (its sum over
    splits crosses warps). Timings: docs/mla_notes.md."""
    pid_q = tl.program_id(0)
    pid_d = tl.program_id(1)
    heads = tl.arange(0, 16)
    sp = tl.arange(0, SPLITS_P2)
    lse_base = part_lse_ptr + pid_q * num_splits * 16
    lse = tl.load(lse_base + sp[:, None] * 16 + heads[None, :], mask=sp[:, None] < num_splits,
                  other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # only for an empty sequence: its output is 0
    cols = pid_d * BD + tl.arange(0, BD)
    if SPLITS_P2 <= COMBINE_LOOP_SPLITS:
        denom = tl.sum(tl.exp2(lse - m[None, :]), 0)
        denom = tl.where(denom > 0, denom, 1.0)
        acc = tl.zeros([16, BD], tl.float32)
        for s in range(num_splits):
            w = tl.exp2(tl.load(lse_base + s * 16 + heads) - m) / denom
            o = tl.load(part_o_ptr + (pid_q * num_splits + s) * (16 * 512) + heads[:, None] * 512
                        + cols[None, :])
            acc += w[:, None] * o
    else:
        w = tl.exp2(lse - m[None, :])              # [SPLITS_P2, 16]; 0 for the padding splits
        denom = tl.sum(w, 0)
        w = w / tl.where(denom > 0, denom, 1.0)[None, :]
        o = tl.load(part_o_ptr + (pid_q * num_splits + sp[:, None, None]) * (16 * 512)
                    + heads[None, :, None] * 512 + cols[None, None, :],
                    mask=sp[:, None, None] < num_splits, other=0.0)
        acc = tl.sum(w[:, :, None] * o, 0)
    tl.store(out_ptr + pid_q * (16 * 512) + heads[:, None] * 512 + cols[None, :],
             acc.to(tl.bfloat16))


# ----------------------------------------------------------------------------------------
# Gluon kernel (plan kernel KERNEL_GLUON, fp8 cache): all but the smallest shapes. Triton's dots put the 16
# heads on M (mma.sync) or re-decode V per orientation; Gluon states layouts, so this kernel runs
# both products as wgmma in the transposed orientation (M = cache rows, then M = V dims) and
# feeds V to the second one straight from registers:
#   * each ring slot holds BN = 64 cache rows as 9 tiles [64, 64] fp8 (8 nope = V, 1 rope), written
#     by two TMA ops (the nope tiles as one 3-D box);
#   * S^T[64, 32] = K . [q_hi; q_lo]^T: fp8 wgmma (QGMMA), both operands in shared memory. q (bf16)
#     is split into two e4m3 parts scaled by 2^k (together ~8 significant bits, as bf16 has) and
#     stacked on N, so K is read once;
#   * O^T[512, 16] += V^T . P^T: fp16 wgmma (HGMMA) in 4 chunks of 128 V dims, V^T as the register
#     A operand. Each thread loads 4-byte words of two consecutive cache rows and widens them to fp16
#     pairs in registers (_V_PAIRS_ASM); the operand's rows are a permutation of the V dims (_v_dim)
#     chosen so that this load lands in the wgmma operand layout with no data exchange. Chunk k + 1 is loaded while
#     chunk k's wgmma runs. No decoded copy of V goes through shared memory (that copy made the
#     kernel shared-memory bound: docs/mla_design.md).
# One warpgroup per program, 2 ring stages, ~92 KB of shared memory: two programs per SM (one on short
# splits, by the plan's split count).
# Splits: partials as the Triton kernel's, merged by the kernel itself (_combine_in_kernel): the row's
# programs wait for each other (a cooperative launch keeps them resident), then each merges a slice.
# The output and partials are stored through a layout change to 16-byte vectors (_o_by_head).
# ----------------------------------------------------------------------------------------
NOPE_TILES = 8  # the 512 nope (= V) columns as 64-column tiles


def _gluon_descriptor_views(tokens, row):
    """(shape, strides) of the Gluon kernel's two views of the (tokens, row) cache, in its parameter
    order: the nope columns as (8 tiles, tokens, 64), tile-major like the shared-memory ring (TMA's
    strides need not grow outwards), and the whole (tokens, row) matrix for the rope tile."""
    return ([NOPE_TILES, tokens, 64], [64, row, 1]), ([tokens, row], [row, 1])


if gluon is not None:
    # Gluon is experimental and renames things: Triton 3.6 calls the CTA barrier thread_barrier.
    _cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
    # [8, BN, 64] fp8 boxes, each [BN, 64] tile swizzled as the rank-2 score operands are
    _NOPE_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=3)

    @gluon.jit
    def _issue_kv(nope_desc, rope_desc, row, pred, kv3_smem, first: gl.constexpr, rope_dst, bar):
        """TMA of BN cache rows from `row` (if pred): the 8 nope (= V) column tiles, one box, into
        kv3_smem[first:first + 8], the rope tile into rope_dst, both on mbarrier bar. (Each TMA op on an
        mbarrier costs a CTA barrier, which Triton's membar pass puts between them: 2 here, not 9.)"""
        mbarrier.expect(bar, nope_desc.block_type.nbytes + rope_desc.block_type.nbytes, pred=pred)
        gtma.async_copy_global_to_shared(nope_desc, [0, row, 0], bar, kv3_smem.slice(first, 8), pred=pred)
        gtma.async_copy_global_to_shared(rope_desc, [row, 512], bar, rope_dst, pred=pred)

    # 4 values x (fp32, bf16 values times 2^k, |x| < 2^8) -> q_hi = e4m3(x) and q_lo = e4m3(x - q_hi),
    # 4 bytes each. The arithmetic is in f16x2: x is exact in f16 down to 2^-14 (8 significant bits),
    # x - q_hi is then exact too, and below 2^-14 both parts are 0 either way (e4m3's least value is
    # 2^-9), so the parts equal the fp32 computation's, in about a third of the instructions.
    _Q_SPLIT_ASM = gl.constexpr("""{
        .reg .b32 x01, x23, h01, h23;
        .reg .b16 a, b;
        cvt.rn.f16x2.f32 x01, $3, $2;
        cvt.rn.f16x2.f32 x23, $5, $4;
        cvt.rn.satfinite.e4m3x2.f16x2 a, x01;
        cvt.rn.satfinite.e4m3x2.f16x2 b, x23;
        mov.b32 $0, {a, b};
        cvt.rn.f16x2.e4m3x2 h01, a;
        cvt.rn.f16x2.e4m3x2 h23, b;
        sub.rn.f16x2 x01, x01, h01;
        sub.rn.f16x2 x23, x23, h23;
        cvt.rn.satfinite.e4m3x2.f16x2 a, x01;
        cvt.rn.satfinite.e4m3x2.f16x2 b, x23;
        mov.b32 $1, {a, b};
    }""")

    @gluon.jit
    def _prefetch_q(q_ptr, pid_q):
        """Starts bringing query row pid_q's q (16 x 576 bf16, 144 lines of 128 bytes) into L2 without
        holding registers: the loads that use it come after the split bounds and the TMA issue, which
        wait on a round trip of their own."""
        line = gl.minimum(gl.arange(0, 256, layout=gl.BlockedLayout([2], [32], [4], [0])), 143)
        gl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.b32 $0, 0;", "=r,l",
                                  [q_ptr + pid_q.to(gl.int64) * (16 * 576) + line * 64],
                                  dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _store_q_split(dst, x, q_mult):
        """x * q_mult (a [16, 64] q tile, bf16, times 2^k) as e4m3 q_hi into dst rows 0-15 and the
        remainder q_lo into rows 16-31."""
        hi, lo = gl.inline_asm_elementwise(_Q_SPLIT_ASM, "=r,=r,r,r,r,r", [x.to(gl.float32) * q_mult],
                                           dtype=(gl.float8e4nv, gl.float8e4nv), is_pure=True, pack=4)
        dst.store(gl.reshape(gl.permute(gl.join(hi, lo), (2, 0, 1)), [32, 64]))  # one store: one CTA barrier

    # Two cache rows' 4-byte words x (row r) and y (row r + 1) of one V tile -> 4 fp16 pairs, pair k =
    # (row r, row r + 1) of dim k of the word: the wgmma operand's register pairs (consecutive K). The
    # bytes are interleaved first (2 prmt), so that each cvt yields a pair as the operand holds it;
    # converting first and swapping halves after costs 4 prmt per 8 values instead of 2.
    _V_PAIRS_ASM = gl.constexpr("""{
        .reg .b32 t0, t1;
        .reg .b16 lo, hi;
        prmt.b32 t0, $4, $5, 0x5140;
        prmt.b32 t1, $4, $5, 0x7362;
        mov.b32 {lo, hi}, t0;
        cvt.rn.f16x2.e4m3x2 $0, lo;
        cvt.rn.f16x2.e4m3x2 $1, hi;
        mov.b32 {lo, hi}, t1;
        cvt.rn.f16x2.e4m3x2 $2, lo;
        cvt.rn.f16x2.e4m3x2 $3, hi;
    }""")

    @gluon.jit
    def _v_chunk(words, ld_l: gl.constexpr, a_l: gl.constexpr):
        """2 V tiles as 4-byte words [2, 64 rows, 16 words] (int32 view of the fp8 tiles in shared
        memory) -> the fp16 register A operand V^T[128, 64] of a wgmma, operand row m holding dim
        _v_dim(m) of the 2 tiles. ld_l gives each thread whole words of rows r and r + 1 (register bit 0
        = row bit 0); after _V_PAIRS_ASM, the joins and the reshape/permute (relabellings) the tensor is
        in the operand layout itself: the convert_layout moves no data."""
        x = words.load(ld_l)
        d0, d1, d2, d3 = gl.inline_asm_elementwise(_V_PAIRS_ASM, "=r,=r,=r,=r,r,r", [x],
                                                   dtype=(gl.float16,) * 4, is_pure=True, pack=2)
        v = gl.join(gl.join(d0, d1), gl.join(d2, d3))  # [.., word, k bit 0, k bit 1]
        v = gl.reshape(gl.permute(v, (0, 1, 2, 4, 3)), [2, 64, 64])  # [tile w1, row, dim 32 w0 + 4g + 2b + h]
        v = gl.reshape(v, [2, 64, 2, 8, 2, 2])
        v = gl.permute(v, (4, 0, 2, 5, 3, 1))    # [b, w1, w0, h, g, row]
        return gl.convert_layout(gl.reshape(v, [128, 64]), a_l)

    @gluon.jit
    def _v_dim(m):
        """The V dim (within a chunk of 2 tiles) of operand row m = 64b + 16w + 8h + g: 32w + 4g + 2b + h."""
        return 32 * ((m >> 4) & 3) + 4 * (m & 7) + 2 * (m >> 6) + ((m >> 3) & 1)

    @gluon.jit
    def _gluon_tile(nope_desc, rope_desc, kv_smem, kv3_smem, kv32_smem, rope_smem, q_smem, p_smem, bars, j, slot: gl.constexpr,
                    start, end, n_tiles, qk, rows, m_i, l_i, o_0, o_1, o_2, o_3, s0, mma_o: gl.constexpr,
                    ld_l: gl.constexpr, a_l: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                    NT: gl.constexpr):
        """Tile j (BN cache rows from start + j * BN) in ring slot `slot`: scores, online softmax
        (log2 domain), O^T = alpha * O^T + V^T . P^T, then the slot's refill with tile j + STAGES."""
        mbarrier.wait(bars.index(slot), (j // STAGES) & 1)
        # phase: first_tile if j == 0
        first: gl.constexpr = slot * (NT - 1)
        rope = rope_smem.index(slot)
        s = warpgroup_mma(kv_smem.index(first), q_smem.index(0).permute((1, 0)), s0, use_acc=False,
                          is_async=True)
        for i in gl.static_range(1, NT - 1):
            s = warpgroup_mma(kv_smem.index(first + i), q_smem.index(i).permute((1, 0)), s, is_async=True)
        s = warpgroup_mma(rope, q_smem.index(NT - 1).permute((1, 0)), s, is_async=True)
        v0 = _v_chunk(kv32_smem.slice(first, 2), ld_l, a_l)  # while the score wgmmas run
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        s_hi, s_lo = gl.split(gl.permute(gl.reshape(s, [BN, 2, 16]), (0, 2, 1)))  # columns h and 16 + h
        n = start + j * BN
        # rows past `end` (the next split or sequence, or TMA's zero fill) get no weight
        s = gl.where(gl.expand_dims(n + rows < end, 1), gl.convert_layout(s_hi + s_lo, mma_o) * qk,
                     float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 0))  # finite: every tile has a row before `end`
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - gl.expand_dims(m_new, 0))
        l_i = l_i * alpha + gl.sum(p, 0)
        p_smem.store(gl.permute(p.to(gl.float16), (1, 0)))
        fence_async_shared()
        _cta_barrier()
        p_b = p_smem.permute((1, 0))
        alpha = gl.expand_dims(alpha, 0)
        # 4 chunks of 2 tiles; chunk k + 1 is loaded while chunk k's wgmma runs, and a chunk's A
        # registers are free once the wgmma after it is issued and the one before has retired
        o_0 = warpgroup_mma(v0, p_b, o_0 * alpha, is_async=True)
        o_1 = warpgroup_mma(_v_chunk(kv32_smem.slice(first + 2, 2), ld_l, a_l), p_b, o_1 * alpha, is_async=True)
        o_0 = warpgroup_mma_wait(num_outstanding=1, deps=(o_0,))
        o_2 = warpgroup_mma(_v_chunk(kv32_smem.slice(first + 4, 2), ld_l, a_l), p_b, o_2 * alpha, is_async=True)
        o_1 = warpgroup_mma_wait(num_outstanding=1, deps=(o_1,))
        o_3 = warpgroup_mma(_v_chunk(kv32_smem.slice(first + 6, 2), ld_l, a_l), p_b, o_3 * alpha, is_async=True)
        _cta_barrier()  # every warp has read the slot
        _issue_kv(nope_desc, rope_desc, n + STAGES * BN, j + STAGES < n_tiles, kv3_smem, first, rope, bars.index(slot))
        o_2, o_3 = warpgroup_mma_wait(num_outstanding=0, deps=(o_2, o_3))
        return m_new, l_i, o_0, o_1, o_2, o_3

    @gluon.jit
    def _o_by_head(o, inv, st_l: gl.constexpr):
        """An O^T chunk [128 operand rows, 16 heads] (row m holds V dim _v_dim(m)) times inv -> [16 heads,
        128 dims] in dim order, in st_l (a warp per head row, 4 dims per thread: 512 contiguous bytes per
        store), where a store from the wgmma layout is 4-byte scatters (docs/mla_design.md)."""
        x = gl.reshape(o * inv, [2, 4, 2, 8, 16])  # m = 64b + 16w + 8h + g
        x = gl.permute(x, (4, 1, 3, 0, 2))          # [head, w, g, b, h]: dim 32w + 4g + 2b + h
        return gl.convert_layout(gl.reshape(x, [16, 128]), st_l)

    @gluon.jit
    def _ld_acquire(ptr):
        return gl.inline_asm_elementwise("ld.acquire.gpu.global.b64 $0, [$1];", "=l,l", [ptr], dtype=gl.int64,
                                         is_pure=False, pack=1)

    @gluon.jit
    def _combine_in_kernel(part_o_ptr, part_lse_ptr, out_ptr, sync_ptr, pid_q, pid_s, num_splits,
                           SPLITS_P2: gl.constexpr, DIMS: gl.constexpr):
        """The split-K merge inside the split kernel: this program's partial is stored; once all
        num_splits programs of query row pid_q have stored theirs, program pid_s merges the row's
        DIMS-column chunks pid_s and pid_s + num_splits (if any) (out = sum_s w_s O_s, w_s = 2^(lse_s - max) /
        sum 2^(lse - max), per head). The wait needs the row's programs resident together: the kernel
        is launched cooperatively (the launch fails rather than hang if the grid cannot be). A second
        kernel cost 3-7 us here: the launch gap, its own start, its stores' drain.
        sync_ptr[pid_q] counts arrivals and only grows (int64): call g's programs wait for
        (g + 1) * num_splits, g read from their own arrival, so it is never reset."""
        _cta_barrier()  # every thread's partial stores come before the arrival (release, gpu scope)
        ctr = sync_ptr + pid_q
        target = (gl.atomic_add(ctr, 1, sem="release", scope="gpu") // num_splits + 1) * num_splits
        seen = _ld_acquire(ctr)
        while seen < target:
            seen = _ld_acquire(ctr)
        # phase: merge_wait
        TD: gl.constexpr = 32 if DIMS >= 128 else DIMS // 4  # threads along dims, 4 dims each
        TH: gl.constexpr = 32 // TD
        WH: gl.constexpr = 4 if TH <= 4 else 16 // TH
        c_l: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, TH, TD], [4 // WH, WH, 1], [2, 1, 0])
        w_l: gl.constexpr = gl.SliceLayout(2, c_l)  # [SPLITS_P2, 16]
        o_l: gl.constexpr = gl.SliceLayout(0, c_l)  # [16, DIMS]
        sp = gl.arange(0, SPLITS_P2, layout=gl.SliceLayout(1, w_l))
        hd = gl.arange(0, 16, layout=gl.SliceLayout(0, w_l))
        first = pid_q.to(gl.int64) * num_splits
        valid = gl.expand_dims(sp < num_splits, 1)
        dims = gl.arange(0, DIMS, layout=gl.SliceLayout(0, o_l))
        part = (part_o_ptr + gl.expand_dims((first + gl.expand_dims(sp, 1)) * (16 * 512) + gl.expand_dims(hd, 0) * 512, 2)
                + gl.expand_dims(gl.expand_dims(dims, 0), 0) + pid_s * DIMS)
        # A row has 512 / DIMS = SPLITS_P2 < 2 * num_splits chunks: this program's are pid_s and maybe
        # pid_s + num_splits. Both loads and the lse load go out together (one L2 round trip, not three).
        c1 = pid_s + num_splits
        o0 = gl.load(part, mask=gl.expand_dims(valid, 2), other=0.0, cache_modifier=".cg")
        o1 = gl.load(part + num_splits * DIMS, mask=gl.expand_dims(valid, 2) & (c1 < 512 // DIMS), other=0.0,
                     cache_modifier=".cg")
        lse = gl.load(part_lse_ptr + (first + gl.expand_dims(sp, 1)) * 16 + gl.expand_dims(hd, 0), mask=valid,
                      other=float("-inf"), cache_modifier=".cg")
        m = gl.max(lse, 0)
        m = gl.where(m == float("-inf"), 0.0, m)  # only for an empty sequence: its output is 0
        w = gl.exp2(lse - gl.expand_dims(m, 0))   # 0 for the padding splits
        denom = gl.sum(w, 0)
        w = gl.expand_dims(w / gl.expand_dims(gl.where(denom > 0, denom, 1.0), 0), 2)
        oh = gl.arange(0, 16, layout=gl.SliceLayout(1, o_l))
        dst = (out_ptr + pid_q.to(gl.int64) * (16 * 512) + gl.expand_dims(oh, 1) * 512 + gl.expand_dims(dims, 0)
               + pid_s * DIMS)
        gl.store(dst, gl.sum(w * o0, 0).to(gl.bfloat16))
        if c1 < 512 // DIMS:
            gl.store(dst + num_splits * DIMS, gl.sum(w * o1, 0).to(gl.bfloat16))

    @gluon.jit(do_not_specialize=["q_seq_len", "num_splits"])
    def _mla_fp8_wgmma_kernel(nope_desc, rope_desc, q_ptr, out_ptr, scale_ptr, kv_indptr_ptr, part_o_ptr,
                              part_lse_ptr, sync_ptr, qk_scale, q_seq_len, num_splits,
                              BN: gl.constexpr, SPLIT: gl.constexpr, STAGES: gl.constexpr,
                              SPLITS_P2: gl.constexpr, COMBINE_DIMS: gl.constexpr):
        # Grid, splits, partials and outputs as _mla_split_kernel's. The fp8 cache through two views
        # (_gluon_descriptor_views): nope_desc, its 512 nope columns as (8 tiles, tokens, 64) with box
        # [8, BN, 64]; rope_desc, (tokens, 576) with box [BN, 64], read at column 512.
        NT: gl.constexpr = 9  # 64-column tiles of a cache row: 8 nope (= V) + 1 rope
        mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, 32, 32])
        mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, 16, 16])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
        # [2 tiles, BN rows, 16 words of 4 dims]: registers = rows 0, 3, 4, 5 (row bit 0 first: rows r
        # and r + 1 of a word go to one _V_PAIRS_ASM); lanes = rows 1-2 and words 0-2; warps = word 3 and
        # the tile. See _v_chunk.
        ld_l: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 1, 0], [0, 8, 0], [0, 16, 0], [0, 32, 0]],
            lane_bases=[[0, 2, 0], [0, 4, 0], [0, 0, 1], [0, 0, 2], [0, 0, 4]],
            warp_bases=[[0, 0, 8], [1, 0, 0]], block_bases=[], shape=[2, BN, 16])
        # [16, 64] q tiles, 8 consecutive values per thread, each held once (a layout wider than the
        # tile would replicate it across lanes and do the prologue twice)
        q_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([32, 64], gl.float8e4nv)
        p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([16, BN], gl.float16)

        pid_q = gl.program_id(0)
        pid_s = gl.program_id(1)
        # phase: start
        _prefetch_q(q_ptr, pid_q)
        start, end = _split_bounds(kv_indptr_ptr, pid_q, pid_s, q_seq_len, num_splits, BN)
        n_tiles = gl.cdiv(gl.maximum(end - start, 0), BN)
        kv_scale = gl.load(scale_ptr)
        # phase: bounds

        kv_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES * (NT - 1), BN, 64], rope_desc.layout)
        # the same bytes under nope_desc's rank-3 layout (the same swizzle), so that one TMA box
        # writes, and one load reads, several tiles
        kv3_smem = kv_smem._reinterpret(gl.float8e4nv, [STAGES * (NT - 1), BN, 64], nope_desc.layout)
        # and as 4-byte words (the same 64-byte swizzle), which _v_chunk reads
        kv32_smem = kv_smem._reinterpret(gl.int32, [STAGES * (NT - 1), BN, 16],
                                         gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=32, rank=3))
        rope_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, 64], rope_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=1)
        for i in gl.static_range(STAGES):
            _issue_kv(nope_desc, rope_desc, start + i * BN, i < n_tiles, kv3_smem, i * (NT - 1),
                      rope_smem.index(i), bars.index(i))
        # phase: tma_issued

        # q (prefetched to L2 above): all nine [16, 64] tiles loaded at once, under the first TMA loads
        # (a reduction between the loads serialised nine round trips: ~7 us more per program). Placed
        # after the TMA issue: loaded before it, ptxas spilled more in the split variant's tile loop.
        hq = gl.arange(0, 16, layout=gl.SliceLayout(1, q_l))
        cq = gl.arange(0, 64, layout=gl.SliceLayout(0, q_l))
        q_tile = q_ptr + pid_q.to(gl.int64) * (16 * 576) + gl.expand_dims(hq, 1) * 576 + gl.expand_dims(cq, 0)
        q0 = gl.load(q_tile)
        q1 = gl.load(q_tile + 64)
        q2 = gl.load(q_tile + 128)
        q3 = gl.load(q_tile + 192)
        q4 = gl.load(q_tile + 256)
        q5 = gl.load(q_tile + 320)
        q6 = gl.load(q_tile + 384)
        q7 = gl.load(q_tile + 448)
        q8 = gl.load(q_tile + 512)  # rope
        # q as q_hi + q_lo (e4m3) times 2^k, max|q| * 2^k in [2^7, 2^8) (no saturation; exact 2^-k
        # back in qk). Rows 0-15 of each q tile hold q_hi, rows 16-31 q_lo. The elementwise max of the
        # tiles first, so that one cross-warp reduction remains.
        amax = gl.maximum(gl.maximum(gl.maximum(gl.abs(q0), gl.abs(q1)), gl.maximum(gl.abs(q2), gl.abs(q3))),
                          gl.maximum(gl.maximum(gl.abs(q4), gl.abs(q5)), gl.maximum(gl.abs(q6), gl.abs(q7))))
        amax = gl.max(gl.max(gl.maximum(amax, gl.abs(q8)).to(gl.float32), 1), 0)
        biased_exp = (amax.to(gl.int32, bitcast=True) >> 23) & 255  # 0 for 0 / subnormal
        k = gl.minimum(gl.maximum(134 - biased_exp, -126), 126)
        q_mult = ((k + 127) << 23).to(gl.float32, bitcast=True)
        qk = qk_scale * kv_scale * ((127 - k) << 23).to(gl.float32, bitcast=True)
        q_smem = gl.allocate_shared_memory(gl.float8e4nv, [NT, 32, 64], q_sl)
        _store_q_split(q_smem.index(0), q0, q_mult)
        _store_q_split(q_smem.index(1), q1, q_mult)
        _store_q_split(q_smem.index(2), q2, q_mult)
        _store_q_split(q_smem.index(3), q3, q_mult)
        _store_q_split(q_smem.index(4), q4, q_mult)
        _store_q_split(q_smem.index(5), q5, q_mult)
        _store_q_split(q_smem.index(6), q6, q_mult)
        _store_q_split(q_smem.index(7), q7, q_mult)
        _store_q_split(q_smem.index(8), q8, q_mult)
        p_smem = gl.allocate_shared_memory(gl.float16, [16, BN], p_sl)
        fence_async_shared()
        _cta_barrier()
        # phase: q_ready

        rows = gl.arange(0, BN, layout=gl.SliceLayout(1, mma_o))
        m_i = gl.full([16], float("-inf"), gl.float32, layout=gl.SliceLayout(0, mma_o))
        l_i = gl.zeros([16], gl.float32, layout=gl.SliceLayout(0, mma_o))
        o_0 = gl.zeros([128, 16], gl.float32, layout=mma_o)  # O^T for V dims 0-127, rows in _v_dim order
        o_1 = o_0                                            # and for dims 128-255, ...
        o_2 = o_0
        o_3 = o_0
        s0 = gl.zeros([BN, 32], gl.float32, layout=mma_s)
        for j0 in range(0, n_tiles, STAGES):
            for slot in gl.static_range(STAGES):  # unrolled by slot: the V chunks are constant slices
                j = j0 + slot
                if j < n_tiles:
                    m_i, l_i, o_0, o_1, o_2, o_3 = _gluon_tile(
                        nope_desc, rope_desc, kv_smem, kv3_smem, kv32_smem, rope_smem, q_smem, p_smem, bars, j, slot, start, end, n_tiles,
                        qk, rows, m_i, l_i, o_0, o_1, o_2, o_3, s0, mma_o, ld_l, a_l, BN, STAGES, NT)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(i))
        # phase: tiles_done

        # Normalise here so partials are plain averages; an empty split has l_i = 0, lse = -inf.
        inv = gl.expand_dims(gl.where(l_i > 0, kv_scale / l_i, 0.0), 0)
        if SPLIT:
            heads = gl.arange(0, 16, layout=gl.SliceLayout(0, mma_o))
            base = part_o_ptr + (pid_q * num_splits + pid_s).to(gl.int64) * (16 * 512)
            gl.store(part_lse_ptr + (pid_q * num_splits + pid_s) * 16 + heads,
                     gl.where(l_i > 0, m_i + gl.log2(l_i), float("-inf")))
        else:
            base = out_ptr + pid_q.to(gl.int64) * (16 * 512)
        st_l: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
        offs = (gl.expand_dims(gl.arange(0, 16, layout=gl.SliceLayout(1, st_l)), 1) * 512
                + gl.expand_dims(gl.arange(0, 128, layout=gl.SliceLayout(0, st_l)), 0))
        gl.store(base + offs, _o_by_head(o_0, inv, st_l).to(base.dtype.element_ty))
        gl.store(base + 128 + offs, _o_by_head(o_1, inv, st_l).to(base.dtype.element_ty))
        gl.store(base + 256 + offs, _o_by_head(o_2, inv, st_l).to(base.dtype.element_ty))
        gl.store(base + 384 + offs, _o_by_head(o_3, inv, st_l).to(base.dtype.element_ty))
        # phase: stored
        if SPLIT:
            _combine_in_kernel(part_o_ptr, part_lse_ptr, out_ptr, sync_ptr, pid_q, pid_s, num_splits,
                               SPLITS_P2, COMBINE_DIMS)
        # phase: end


# ----------------------------------------------------------------------------------------
# Host path. Triton's own launch path (argument binding, a Python walk over the arguments to
# encode tensor descriptors, a driver call per pointer) costs tens of microseconds of host time
# per launch; the judge ranks device time, but shows host time (host/call). So:
#   * the first call of an input signature validates the input (_fast_path_problem), picks
#     the plan, launches through Triton's JIT (which compiles) and caches a _Route;
#   * later calls with that signature run the route: two C-launcher calls with arguments
#     expanded once, pointers passed as ints, descriptors encoded from stored parameters.
# The signature holds every property that the checks, Triton's specialization and the route
# depend on (shapes, strides, dtypes, devices, 16-byte alignment, config); never a tensor's
# identity or contents. A route is verified bitwise against Triton's launch when it is made.
# ----------------------------------------------------------------------------------------
_logged_reasons = set()
_capability = {}
# input signature -> what its later calls run: a _Route (direct launches), a _TritonLaunch (Triton's
# own launch path: no direct route could be built or checked), or a _Fallback (the reference: the
# plan's kernels cannot launch here, e.g. out of shared memory).
_routes = {}
_scratch = {}  # (total_q, splits, device, stream) -> (partial O, partial lse, counters); never keyed by data
_sm_count = {}  # device -> SMs
_compiled = {}  # (kernel, constexprs, warps, stages, device) -> CompiledKernel, the latest launch last: code, for tools


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


def _is_contig_on(t, device, dtype, shape):
    return (isinstance(t, torch.Tensor) and t.device == device and t.dtype == dtype
            and tuple(t.shape) == shape and t.is_contiguous() and t.data_ptr() % 16 == 0)


def _fast_path_problem(q, kv_data, qo_indptr, kv_indptr, config, fmt):
    """None if the fast path's assumptions hold, else the reason (one short line)."""
    if TensorDescriptor is None:
        return "this Triton has no tensor descriptors (triton.tools.tensor_descriptor)"
    if not isinstance(q, torch.Tensor) or not q.is_cuda:
        return "inputs are not CUDA tensors (no GPU)"
    dev = q.device
    cap = _capability.get(dev.index)
    if cap is None:
        cap = _capability[dev.index] = torch.cuda.get_device_capability(dev)
    if cap != (9, 0):
        return f"GPU capability {cap} is not sm_90"
    if dev.index != torch.cuda.current_device():
        return f"inputs are on {dev}, not on the current CUDA device"
    if config.get("num_heads") != NUM_HEADS or config.get("num_kv_heads") != 1 \
            or config.get("qk_head_dim") != QK_DIM or config.get("v_head_dim") != V_DIM \
            or config.get("kv_lora_rank") != V_DIM or config.get("qk_rope_head_dim") != ROPE_DIM:
        return "config dims differ from 16 heads / 576 qk / 512 v / 64 rope / 1 kv head"
    total_q = q.shape[0] if q.dim() == 3 else -1
    batch, q_seq = config.get("batch_size"), config.get("q_seq_len")
    if total_q <= 0 or total_q != batch * q_seq or not _is_contig_on(q, dev, torch.bfloat16,
                                                                       (total_q, 16, 576)):
        return "q is not a contiguous (batch*q_seq_len, 16, 576) bf16 tensor"
    if not _is_contig_on(kv_indptr, dev, torch.int32, (batch + 1,)):
        return "kv_indptr is not a contiguous int32 (batch+1,) tensor on q's device"
    if not isinstance(config.get("sm_scale"), (int, float)):
        return "config['sm_scale'] is not a number"
    if fmt not in kv_data:
        return f"kv_data has no {fmt} cache"
    cache = _cache_and_scales(kv_data, fmt)[0]
    if not isinstance(cache, torch.Tensor) or cache.dim() == 0 or cache.shape[0] == 0:
        return f"the {fmt} cache is empty or not a tensor"
    if fmt == "mxfp4":
        packed, scales = kv_data["mxfp4"]
        total_kv = packed.shape[0]
        if not (_is_contig_on(packed, dev, torch.uint8, (total_kv, 1, MXFP4_ROW_BYTES))
                and isinstance(scales, torch.Tensor) and scales.device == dev
                and scales.dtype == torch.uint8 and tuple(scales.shape) == (total_kv, MXFP4_SCALES)
                and scales.is_contiguous() and scales.data_ptr() % 16 == 0):
            return "mxfp4 cache is not contiguous uint8 (N,1,288) + (N,18)"
    elif fmt == "fp8":
        kv, scale = kv_data["fp8"]
        if not (_is_contig_on(kv, dev, torch.float8_e4m3fn, (kv.shape[0], 1, QK_DIM))
                and isinstance(scale, torch.Tensor) and scale.numel() == 1):
            return "fp8 cache is not a contiguous float8_e4m3fn (N,1,576) tensor + scale"
        if scale.device != dev or scale.dtype != torch.float32 or scale.data_ptr() % 16:
            return "fp8 scale is not an fp32 tensor on q's device"
    else:
        kv = kv_data["bf16"]
        if not _is_contig_on(kv, dev, torch.bfloat16, (kv.shape[0], 1, QK_DIM)):
            return "bf16 cache is not a contiguous (N,1,576) tensor"
    return None


def _cache_and_scales(kv_data, fmt):
    """(the cache tensor TMA reads, the tensor behind the kernel's scale_ptr)."""
    if fmt == "bf16":
        kv = kv_data["bf16"]
        return kv, kv  # scale_ptr unused
    return kv_data[fmt]  # mxfp4: E8M0 bytes (plain loads); fp8: the per-tensor fp32 scale


def _dot_dtype(fmt):
    """fp8 is widened to fp16 (one cvt per pair; the kernel rescales q into fp16's range);
    MXFP4 is decoded to bf16 (its block scales span fp32's range) and bf16 stays bf16."""
    return tl.float16 if fmt == "fp8" else tl.bfloat16


def _fit_to_device(plan, total_q, dev):
    """The plan with at most as many Gluon programs as the device holds at once when they split a row
    (their in-kernel merge waits for each other): fewer splits on a GPU with fewer SMs than the H200."""
    plan = Plan(*plan)
    if plan.kernel == KERNEL_GLUON and plan.splits > 1 and total_q * plan.splits > _resident_programs(dev):
        return plan._replace(splits=max(1, _resident_programs(dev) // total_q))
    return plan


def _resident_programs(dev):
    """How many Gluon-kernel programs the device holds at once: two per SM (~95 KB of shared memory
    and 255 registers x 128 threads each)."""
    sms = _sm_count.get(dev)
    if sms is None:
        sms = _sm_count[dev] = torch.cuda.get_device_properties(dev).multi_processor_count
    return 2 * sms


def _scratch_for(total_q, splits, dev, stream):
    """(partial O, partial lse, arrival counters) for split plans, allocated on `stream` (a raw CUDA stream
    handle): one set per stream, since calls on one stream run in order but calls on two may overlap, and
    sharing would mix their partials and make the Gluon kernel's merge wait on the other call's programs.
    The counters, which that merge only ever increments, start at 0 once per key."""
    key = (total_q, splits, dev, stream)
    scratch = _scratch.get(key)
    if scratch is None:
        scratch = _scratch[key] = (
            torch.empty((total_q, splits, NUM_HEADS, V_DIM), dtype=torch.float32, device=dev),
            torch.empty((total_q, splits, NUM_HEADS), dtype=torch.float32, device=dev),
            torch.zeros((total_q,), dtype=torch.int64, device=dev))
    return scratch


LOG2E = 1.4426950408889634  # the kernel's softmax runs in the log2 domain


def _qk_scale(config):
    return config["sm_scale"] * LOG2E


def _split_args(gluon, descs, q, out, scales, kv_indptr, part_o, part_lse, sync, qk_scale, q_seq_len, splits):
    """The split kernel's runtime arguments in its parameter order, _mla_fp8_wgmma_kernel's (gluon) or
    _mla_split_kernel's (which has no arrival counters): the one place both launch paths take the order
    from. Triton's launch passes tensors and descriptor objects; the direct launch passes pointers as
    ints and each descriptor expanded to (CUtensorMap, shape..., strides...)."""
    if gluon:
        return (*descs, q, out, scales, kv_indptr, part_o, part_lse, sync, qk_scale, q_seq_len, splits)
    return (q, out, *descs, scales, kv_indptr, part_o, part_lse, qk_scale, q_seq_len, splits)


def _split_constexprs(plan, dot):
    """The split kernel's constexpr arguments, in its parameter order (the direct launch relies
    on that order): _mla_split_kernel's, or _mla_fp8_wgmma_kernel's for a KERNEL_GLUON plan."""
    plan = Plan(*plan)
    if plan.kernel == KERNEL_GLUON:
        return dict(BN=plan.block_n, SPLIT=plan.splits > 1, STAGES=plan.stages,
                    **_gluon_combine_constexprs(plan.splits))
    return dict(FMT=FMT_IDS[plan.fmt], BN=plan.block_n, SPLIT=plan.splits > 1, STAGES=plan.stages,
                TRANS=int(plan.kernel == KERNEL_WGMMA), DOT=dot)


def _gluon_combine_constexprs(splits):
    """SPLITS_P2 and COMBINE_DIMS of the Gluon kernel's in-kernel merge: all (padded) splits of a
    COMBINE_DIMS-column chunk in one load of 8192 values (64 per thread); SPLITS_P2 chunks or more per
    row, so every program has one (2 splits: 256 columns each; 64: 8). Fixed values without splits."""
    splits_p2 = triton.next_power_of_2(splits) if splits > 1 else 1
    return dict(SPLITS_P2=splits_p2, COMBINE_DIMS=max(8, min(256, 8192 // (NUM_HEADS * splits_p2))))


def _combine_constexprs(splits):
    """SPLITS_P2 and BD, the output columns per combine program: 128 while it loops over the splits,
    else COMBINE_ELEMENTS / (16 * SPLITS_P2) (32 at 16 splits, 8 at 64)."""
    splits_p2 = triton.next_power_of_2(splits)
    if splits_p2 <= COMBINE_LOOP_SPLITS.value:
        return dict(SPLITS_P2=splits_p2, BD=128)
    return dict(SPLITS_P2=splits_p2, BD=max(8, COMBINE_ELEMENTS // (NUM_HEADS * splits_p2)))


def _launch_jit(q, kv_data, kv_indptr, config, plan, dot_dtype=None):
    """Runs the kernels through Triton's JIT (compiling on first use): -> (out, split kernel,
    combine kernel or None, the plan as run: fitted to the device) with the kernels as CompiledKernels.
    No syncs; no allocation besides the output.
    dot_dtype: by format on the GPU (_dot_dtype); the CPU tests pass tl.float16 because the
    Triton interpreter's bf16 dots are wrong (the MXFP4 decode then uses plain Triton ops)."""
    total_q = q.shape[0]
    dev = q.device
    plan = _fit_to_device(plan, total_q, dev)
    fmt, block_n, splits, warps, stages, kernel = (plan.fmt, plan.block_n, plan.splits, plan.warps, plan.stages,
                                                   plan.kernel)
    base, scales = _cache_and_scales(kv_data, fmt)
    row = base.shape[-1]
    total_kv = base.shape[0]
    out = torch.empty((total_q, NUM_HEADS, V_DIM), dtype=torch.bfloat16, device=dev)
    # scratch for the split partials; unused (any valid pointer) with one split
    stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0  # CPU: the interpreter
    part_o, part_lse, sync = _scratch_for(total_q, splits, dev, stream) if splits > 1 else (out, out, out)
    split_consts = _split_constexprs(plan, dot_dtype if dot_dtype is not None else _dot_dtype(fmt))
    if kernel == KERNEL_GLUON:
        if (fmt, block_n, warps, stages) != ("fp8", GLUON_BN, GLUON_WARPS, GLUON_STAGES):
            raise ValueError(f"plan {plan}: the Gluon kernel reads fp8 with block_n {GLUON_BN}, "
                             f"{GLUON_WARPS} warps and {GLUON_STAGES} stages")
        (nope_view, rope_view) = _gluon_descriptor_views(total_kv, row)
        nope_desc = GluonTensorDescriptor(base, *nope_view, [NOPE_TILES, block_n, 64], _NOPE_LAYOUT)
        rope_desc = GluonTensorDescriptor(base, *rope_view, [block_n, 64],
                                          gl.NVMMASharedLayout.get_default_for([block_n, 64], gl.float8e4nv))
        # cooperative with splits: the launch then fails, rather than hangs, if the grid cannot be resident
        split_ck = _mla_fp8_wgmma_kernel[(total_q, splits, 1)](
            *_split_args(True, (nope_desc, rope_desc), q, out, scales, kv_indptr, part_o, part_lse, sync,
                         _qk_scale(config), config["q_seq_len"], splits),
            **split_consts, num_warps=warps, launch_cooperative_grid=splits > 1)
        name = "_mla_fp8_wgmma_kernel"
    else:
        kv_desc = TensorDescriptor(base, [total_kv, row], [row, 1], [block_n, 64])
        rope_desc = TensorDescriptor(base, [total_kv, row], [row, 1], [block_n, 32])
        split_ck = _mla_split_kernel[(total_q, splits, 1)](
            *_split_args(False, (kv_desc, rope_desc), q, out, scales, kv_indptr, part_o, part_lse, sync,
                         _qk_scale(config), config["q_seq_len"], splits),
            **split_consts, num_warps=warps, num_stages=stages)
        name = "_mla_split_kernel"
    _record_compiled((name, tuple(split_consts.items()), warps, stages, dev), split_ck)
    combine_ck = None
    if splits > 1 and kernel != KERNEL_GLUON:  # the Gluon kernel merges its splits itself
        combine_consts = _combine_constexprs(splits)
        combine_ck = _mla_combine_kernel[(total_q, V_DIM // combine_consts["BD"], 1)](
            part_o, part_lse, out, splits, **combine_consts, num_warps=4, num_stages=3)
        _record_compiled(("_mla_combine_kernel", tuple(combine_consts.items()), 4, 3, dev), combine_ck)
    return out, split_ck, combine_ck, plan


def _launch(q, kv_data, kv_indptr, config, plan, dot_dtype=None):
    """Output of the plan's kernels launched through Triton's JIT (see _launch_jit)."""
    return _launch_jit(q, kv_data, kv_indptr, config, plan, dot_dtype)[0]


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


def _allocate_output_ahead(config, fmt) -> bool:
    """Below 8 MB of cache per call the kernels finish before an allocation made after their
    launches would (4 x 1024: ~11 us of GPU time), so the output is allocated before them instead."""
    return config["batch_size"] * config["kv_seq_len"] * FMT_BYTES_PER_TOKEN[fmt] >= 8 << 20


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
    """One input signature's launch: direct launches of its compiled kernels, the descriptor
    parameters, grids and split scratch, all fixed by the signature."""

    def __init__(self, q, kv_data, config, plan, split_ck, combine_ck):
        self.plan = plan
        self.fmt, self.splits, self.gluon = plan.fmt, plan.splits, plan.kernel == KERNEL_GLUON
        fmt, splits = self.fmt, self.splits
        base, _ = _cache_and_scales(kv_data, fmt)
        self.total_q = q.shape[0]
        self.device = q.device
        self.stream_of = triton.runtime.driver.active.get_current_stream
        self.fill_tma = triton.runtime.driver.active.utils.fill_tma_descriptor
        self.split = _DirectLaunch(split_ck)
        if len(self.split.tma) != 2:
            raise RuntimeError("the split kernel's descriptors were not lowered to TMA")
        self.row = base.shape[-1]
        self.qk_scale, self.q_seq_len = _qk_scale(config), config["q_seq_len"]
        self.split_consts = tuple(_split_constexprs(plan, _dot_dtype(fmt)).values())
        self.part_ptrs = {}  # stream -> the split scratch's pointers (_scratch_for), (0, 0, 0) without splits
        self.combine = _DirectLaunch(combine_ck) if combine_ck is not None else None
        combine_consts = _combine_constexprs(splits)
        self.combine_programs = V_DIM // combine_consts["BD"]
        self.combine_consts = tuple(combine_consts.values())
        self.descriptors = {}  # (cache pointer, token count) -> the encoded TMA descriptors
        self.outputs = _OutputsAhead((self.total_q, NUM_HEADS, V_DIM), ahead=_allocate_output_ahead(config, fmt))

    def _descriptors(self, ptr, tokens):
        """The split kernel's two descriptor arguments for a cache at ptr with this many tokens, as the
        C launcher takes them: (CUtensorMap, shape..., strides...) each. Encoding is a pure function of
        those two (the box, swizzle and row width are the route's), so a repeated cache reuses it: a
        memo of an address and a shape, never of data. Bounded, since fresh inputs (leaderboard mode)
        bring a new address nearly every call."""
        key = (ptr, tokens)
        args = self.descriptors.get(key)
        if args is None:
            if len(self.descriptors) >= 16:
                self.descriptors.clear()
            # The token count is not in the signature (ragged batches change it): it shapes the
            # descriptors here.
            whole = ([tokens, self.row], [self.row, 1])
            views = _gluon_descriptor_views(tokens, self.row) if self.gluon else (whole, whole)
            args = self.descriptors[key] = tuple(
                x for tma, (shape, strides) in zip(self.split.tma, views)
                for x in (self.fill_tma(ptr, *tma, shape, strides, 0), *shape, *strides))
        return args

    def __call__(self, q, kv_data, kv_indptr):
        base, scales = _cache_and_scales(kv_data, self.fmt)
        stream = self.stream_of(self.device.index)
        out = self.outputs.take(q, stream)  # bf16 on q's device (the signature pins both)
        out_ptr, tokens = out.data_ptr(), base.shape[0]
        descs = self._descriptors(base.data_ptr(), tokens)
        ptrs = self.part_ptrs.get(stream)
        if ptrs is None:  # first call on this stream
            ptrs = self.part_ptrs[stream] = (tuple(t.data_ptr() for t in _scratch_for(
                self.total_q, self.splits, self.device, stream)) if self.splits > 1 else (0, 0, 0))
        split, (part_o, part_lse, sync) = self.split, ptrs
        split.launch(self.total_q, self.splits, 1, stream, *split.head,
                     *_split_args(self.gluon, descs, q.data_ptr(), out_ptr, scales.data_ptr(), kv_indptr.data_ptr(),
                                  part_o, part_lse, sync, self.qk_scale, self.q_seq_len, self.splits),
                     *self.split_consts)
        combine = self.combine
        if combine is not None:
            combine.launch(self.total_q, self.combine_programs, 1, stream, *combine.head,
                           part_o, part_lse, out_ptr, self.splits, *self.combine_consts)
        self.outputs.allocate_next(q, stream)  # while the kernels run
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


def _signature(q, kv_data, kv_indptr, config, fmt):
    """Everything the checks, Triton's specialization and a route depend on, except the cache's
    token count (a route reads it per call): a ragged batch's total length changes per input."""
    base, scales = _cache_and_scales(kv_data, fmt)
    if fmt == "mxfp4":  # (N, 18) E8M0 bytes: N must match the packed cache's
        scale_layout = (scales.shape[0] == base.shape[0], scales.shape[1:])
    elif fmt == "fp8":  # the per-tensor scale
        scale_layout = scales.shape
    else:
        scale_layout = None
    return (fmt, tuple(config.items()),
            q.shape, q.stride(), q.dtype, q.get_device(),  # get_device(): an int, cheaper than .device
            kv_indptr.shape, kv_indptr.stride(), kv_indptr.dtype, kv_indptr.get_device(),
            base.shape[0] > 0, base.shape[1:], base.stride(), base.dtype, base.get_device(),
            scale_layout, scales.stride(), scales.dtype, scales.get_device(),
            (q.data_ptr() | kv_indptr.data_ptr() | base.data_ptr() | scales.data_ptr()) & 15)


def _make_route(q, kv_data, kv_indptr, config, plan):
    """(route or False, this call's output): launch through Triton's JIT, then build the route
    and check that it reproduces that output bit for bit (one sync, once per signature)."""
    out, split_ck, combine_ck, plan = _launch_jit(q, kv_data, kv_indptr, config, plan)
    try:
        route = _Route(q, kv_data, config, plan, split_ck, combine_ck)
        if not torch.equal(route(q, kv_data, kv_indptr), out):
            raise RuntimeError("its output differs from Triton's launch")
    except Exception as exc:  # Triton's internals moved: Triton's own launch path from now on
        _warn_once(f"direct launch off for this input signature ({type(exc).__name__}: {exc})")
        route = False
    return route, out


def _plan_and_key(data: input_t):
    """(plan, input signature) of a call; (None, None) if the input is not of the expected types (the
    first call's checks then say what is wrong)."""
    q, kv_data, qo_indptr, kv_indptr, config = data
    try:
        plan = plan_for(config["batch_size"], config["kv_seq_len"], config["q_seq_len"])
        return plan, _signature(q, kv_data, kv_indptr, config, plan.fmt)
    except Exception:
        return None, None


def custom_kernel(data: input_t) -> output_t:
    q, kv_data, qo_indptr, kv_indptr, config = data
    plan, key = _plan_and_key(data)
    route = _routes.get(key) if key is not None else None
    if isinstance(route, _Route):
        if not _launch_hooked():
            return route(q, kv_data, kv_indptr)
        return _launch(q, kv_data, kv_indptr, config, route.plan)  # a profiler's hooks: Triton's path calls them
    if isinstance(route, _TritonLaunch):
        return _launch(q, kv_data, kv_indptr, config, route.plan)
    if isinstance(route, _Fallback):
        return _fall_back(data, route.reason)
    return _first_call(data, plan, key)


def _first_call(data: input_t, plan, key) -> output_t:
    """The first call of a signature (every call while a profiler's hooks are set, and every call whose
    input is not of the expected types): check the input, launch through Triton's JIT (compiling), and
    record what the signature's later calls run. The Gluon kernel is experimental (its API moves between
    Triton versions): if it fails to build or launch, it is off for good, the call is planned again on
    the Triton kernels, and so is every later one."""
    q, kv_data, qo_indptr, kv_indptr, config = data
    while True:
        if plan is None:
            plan = plan_for(config.get("batch_size", 0), config.get("kv_seq_len", 0), config.get("q_seq_len", 0))
        reason = _fast_path_problem(q, kv_data, qo_indptr, kv_indptr, config, plan.fmt)
        if reason is not None:
            return _fall_back(data, reason)
        try:
            if key is None or _launch_hooked():
                return _launch(q, kv_data, kv_indptr, config, plan)
            route, out = _make_route(q, kv_data, kv_indptr, config, plan)
            _routes[key] = route or _TritonLaunch(plan)
            return out
        except Exception as exc:  # the plan's kernels cannot run here (e.g. out of shared memory)
            reason = f"plan {tuple(plan)} failed to launch ({type(exc).__name__}: {str(exc)[:200]})"
            if plan.kernel != KERNEL_GLUON or _gluon_off:
                if key is not None:
                    _routes[key] = _Fallback(reason)
                return _fall_back(data, reason)
            _gluon_off.append(reason)
            log.warning("%s %s; the Gluon kernel is off, Triton plans from now on", LOG_PREFIX, reason)
            plan, key = _plan_and_key(data)


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
