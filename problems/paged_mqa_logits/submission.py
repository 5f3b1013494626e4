#!POPCORN leaderboard paged-mqa-logits
#!POPCORN gpu H100
"""
Paged MQA logits on Hopper: one Triton kernel over the fp8 pair (fp8 q x fp8 cache).

Grid (page chunks, batch). A program loads its sequence's q rows ([next_n * 64, 128] fp8, into shared
memory for the whole page loop) and weights once, then walks CHUNK logical pages: each page's 64 x 128
fp8 keys come in by TMA (the cache viewed as a 2-D fp8 matrix of 128-byte rows: block blk's tokens are
rows 66 blk .. 66 blk + 63, its fp32 scales the next two rows), the page loop software-pipelined
NUM_STAGES deep; the scores S[64 tokens, next_n * 64 heads] = K_page . q^T come from one fp8
tensor-core dot (wgmma, both operands K-major), and the epilogue (relu, x weight, sum over heads,
x per-token scale, causal mask) writes each row's 64 logits once. Pages past the context are written
-inf by the same program, so the whole (rows, max_model_len) output is written exactly once, by this
one kernel. Per-shape plans (PLANS) pick the chunk, pipeline depth and which loads use TMA.

Host path: the first call of an input signature routes, compiles through Triton's JIT and caches an
_Entry; later calls launch the compiled kernel through Triton's C launcher with pre-expanded arguments
(_DirectLaunch), since host time the benchmark's L2 flush does not hide is counted.

Falls back to the reference (one log line with the reason) without CUDA, off sm_90, when Triton
lacks tensor descriptors, or when the input breaks a layout assumption.
Assumptions not checked (checking needs a device sync): 0 <= context_lens <= max_model_len and
block_tables entries of pages in use are valid block ids.
"""
import sys

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

H, D, BLOCK = 64, 128, 64
ROWS_PER_BLOCK = (BLOCK * (D + 4)) // D  # 66 rows of 128 bytes per physical block
_LOGGED = set()
LAST_COMPILED = [None]  # the CompiledKernel of the latest launch (bench reads its SASS)

# Per-shape plans, keyed by (batch, next_n, max_model_len): (chunk pages per program, pipeline stages,
# warps, bt_vector, scale_tma, kv_tma, q_tma). bt_vector: the chunk's block-table entries loaded once
# as a vector (a scalar load per page stalls the pipeliner); *_tma: TMA for the scales / keys / q
# (else plain loads). Host time matters as much as GPU time at these sizes (the benchmark's L2
# flush hides only ~35 us of it), and each host tensor descriptor costs an encode per launch, so
# the plans keep one (the keys'). Chunk and stages from a sweep on an H200 (bench.py).
PLANS = {
    (256, 1, 1344): (8, 3, 4, 1, 0, 1, 0),
    (256, 1, 5376): (8, 3, 4, 1, 0, 1, 0),
    (256, 1, 10688): (16, 3, 4, 1, 0, 1, 0),
    (256, 2, 10688): (16, 4, 4, 1, 0, 1, 0),
    (128, 1, 21312): (8, 3, 4, 1, 0, 1, 0),
    (64, 1, 42624): (8, 3, 4, 1, 0, 1, 0),
    (32, 1, 85248): (8, 3, 4, 1, 0, 1, 0),
}


def _default_plan(batch: int, next_n: int, max_model_len: int):
    pages = (max_model_len + BLOCK - 1) // BLOCK
    chunk = 8 if next_n == 1 else 16
    while chunk > 1 and batch * ((pages + chunk - 1) // chunk) < 132 * 4:
        chunk //= 2
    return (chunk, 3 if next_n == 1 else 4, 4, 1, 0, 1, 0)


def plan_for(batch: int, next_n: int, max_model_len: int):
    return PLANS.get((batch, next_n, max_model_len)) or _default_plan(batch, next_n, max_model_len)


if triton is not None:

    @triton.jit(do_not_specialize=["bt_stride", "out_stride", "max_model_len"])
    def _paged_mqa_logits_fp8_kernel(
        q_desc, k_desc, s_desc, q_ptr, kv8_ptr, kv_f32_ptr, w_ptr, ctx_ptr, bt_ptr, out_ptr,
        bt_stride, out_stride, max_model_len,
        NEXT_N: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
        ROWS_PER_BLOCK: tl.constexpr, CHUNK: tl.constexpr, NUM_STAGES: tl.constexpr,
        BT_VECTOR: tl.constexpr, SCALE_TMA: tl.constexpr, KV_TMA: tl.constexpr, Q_TMA: tl.constexpr,
    ):
        QN: tl.constexpr = NEXT_N * H
        pid_c = tl.program_id(0)
        b = tl.program_id(1)
        ctx = tl.load(ctx_ptr + b)
        n_pages = tl.cdiv(ctx, BLOCK)
        p0 = pid_c * CHUNK
        p_end = tl.minimum(p0 + CHUNK, n_pages)
        tok = tl.arange(0, BLOCK)
        hcol = tl.arange(0, QN)
        dcol = tl.arange(0, D)
        out_row = out_ptr + (b * NEXT_N).to(tl.int64) * out_stride
        bt_row = bt_ptr + b.to(tl.int64) * bt_stride

        if Q_TMA:
            q = q_desc.load([b * QN, 0])                      # [QN, D] fp8, resident in smem
        else:
            q = tl.load(q_ptr + (b * QN + hcol)[:, None] * D + dcol[None, :])  # < 2^31: route checks
        w = tl.load(w_ptr + b * QN + hcol)                    # [QN] fp32
        if BT_VECTOR:
            jj = tl.arange(0, CHUNK)
            btv = tl.load(bt_row + p0 + jj, mask=p0 + jj < p_end, other=0)
        for p in tl.range(p0, p_end, num_stages=NUM_STAGES):
            if BT_VECTOR:
                blk = tl.sum(tl.where(jj == p - p0, btv, 0))
            else:
                blk = tl.load(bt_row + p)
            if KV_TMA:
                k = k_desc.load([blk * ROWS_PER_BLOCK, 0])    # [BLOCK, D] fp8 (TMA)
            else:
                k = tl.load(kv8_ptr + blk.to(tl.int64) * (ROWS_PER_BLOCK * D) + tok[:, None] * D + dcol[None, :])
            if SCALE_TMA:
                sc = tl.reshape(s_desc.load([blk * ROWS_PER_BLOCK + BLOCK, 0]), [BLOCK])
            else:
                sc = tl.load(kv_f32_ptr + blk.to(tl.int64) * (ROWS_PER_BLOCK * D // 4) + BLOCK * D // 4 + tok)
            s = tl.dot(k, tl.trans(q))                        # [BLOCK, QN] fp32 (wgmma)
            x = tl.maximum(s, 0.0) * w[None, :]
            cols = p * BLOCK + tok
            for i in tl.static_range(NEXT_N):
                if NEXT_N == 1:
                    li = tl.sum(x, axis=1)
                else:
                    li = tl.sum(tl.where((hcol // H == i)[None, :], x, 0.0), axis=1)
                li = tl.where(cols <= ctx - NEXT_N + i, li * sc, float("-inf"))
                tl.store(out_row + i * out_stride + cols, li, mask=cols < max_model_len)

        neg = tl.full([BLOCK], float("-inf"), tl.float32)
        for p in range(tl.maximum(p0, n_pages), p0 + CHUNK):
            cols = p * BLOCK + tok
            for i in tl.static_range(NEXT_N):
                tl.store(out_row + i * out_stride + cols, neg, mask=cols < max_model_len)


def _log_fallback(reason: str) -> None:
    if reason not in _LOGGED:
        _LOGGED.add(reason)
        print(f"[paged_mqa_logits] reference fallback: {reason}", file=sys.stderr)


def route(data: input_t, require_cuda: bool = True):
    """(use_kernel, reason): why the kernel can or cannot take this input."""
    if _TRITON_ERROR is not None:
        return False, f"Triton unavailable ({_TRITON_ERROR})"
    if TensorDescriptor is None:
        return False, "this Triton has no host tensor descriptors"
    try:
        q, kv_cache, weights, context_lens, block_tables, max_model_len = data
        qf, kv = q["fp8"], kv_cache["fp8"]
    except Exception as exc:
        return False, f"input is not (q, kv_cache, weights, context_lens, block_tables, max_model_len): {exc}"
    if require_cuda:
        if not torch.cuda.is_available():
            return False, "no CUDA device"
        if not qf.is_cuda:
            return False, "inputs are not on a CUDA device"
        if torch.cuda.get_device_capability(qf.device) != (9, 0):
            return False, f"device is sm_{''.join(map(str, torch.cuda.get_device_capability(qf.device)))}, the kernel targets sm_90"
    if qf.dtype != torch.float8_e4m3fn or qf.dim() != 4 or tuple(qf.shape[2:]) != (H, D):
        return False, f"q['fp8'] is {qf.dtype} {tuple(qf.shape)}, expected float8_e4m3fn (batch, next_n, {H}, {D})"
    batch, next_n = qf.shape[:2]
    if next_n not in (1, 2, 4):
        return False, f"next_n = {next_n}; the kernel handles 1, 2, 4"
    if kv.dtype != torch.uint8 or kv.dim() != 4 or tuple(kv.shape[1:]) != (BLOCK, 1, D + 4):
        return False, f"kv_cache['fp8'] is {kv.dtype} {tuple(kv.shape)}, expected uint8 (num_blocks, {BLOCK}, 1, {D + 4})"
    if not (qf.is_contiguous() and kv.is_contiguous() and weights.is_contiguous() and block_tables.stride(1) == 1):
        return False, "a tensor is not contiguous"
    if kv.data_ptr() % 16 or qf.data_ptr() % 16:
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
        return False, "kv_cache['fp8'] has no blocks"
    if kv.shape[0] * ROWS_PER_BLOCK >= 2 ** 31 or qf.numel() >= 2 ** 31:
        return False, "cache or q too large for 32-bit row coordinates / offsets"
    return True, "ok"


def _descriptors(data, next_n, q_tma=1, kv_tma=1, scale_tma=1):
    """Host TensorDescriptors (None where the plan does not use one) and the cache's two views."""
    q, kv_cache = data[0], data[1]
    qf, kv = q["fp8"], kv_cache["fp8"]
    batch, qn, nb = qf.shape[0], next_n * H, kv.shape[0]
    kv8 = kv.view(torch.float8_e4m3fn).view(nb * ROWS_PER_BLOCK, D)
    kv32 = kv.view(torch.float32).view(nb * ROWS_PER_BLOCK, D // 4)
    q_desc = TensorDescriptor(qf.view(batch * qn, D), [batch * qn, D], [D, 1], [qn, D]) if q_tma else None
    k_desc = TensorDescriptor(kv8, [nb * ROWS_PER_BLOCK, D], [D, 1], [BLOCK, D]) if kv_tma else None
    s_desc = (TensorDescriptor(kv32, [nb * ROWS_PER_BLOCK, D // 4], [D // 4, 1], [BLOCK * 4 // D, D // 4])
              if scale_tma else None)
    return q_desc, k_desc, s_desc, kv8, kv32


def launch_fp8(data: input_t, plan=None) -> torch.Tensor:
    """Run the Triton kernel through Triton's JIT (no routing, no launch cache): the path that compiles,
    and what the CPU tests drive under TRITON_INTERPRET=1."""
    q, kv_cache, weights, context_lens, block_tables, max_model_len = data
    qf = q["fp8"]
    batch, next_n = qf.shape[0], qf.shape[1]
    chunk, stages, warps, bt_vector, scale_tma, kv_tma, q_tma = plan or plan_for(batch, next_n, max_model_len)
    q_desc, k_desc, s_desc, kv8, kv32 = _descriptors(data, next_n, q_tma, kv_tma, scale_tma)
    out = torch.empty((batch * next_n, max_model_len), dtype=torch.float32, device=qf.device)
    pages = (max_model_len + BLOCK - 1) // BLOCK
    grid = ((pages + chunk - 1) // chunk, batch)
    LAST_COMPILED[0] = _paged_mqa_logits_fp8_kernel[grid](
        q_desc, k_desc, s_desc, qf, kv8, kv32, weights, context_lens, block_tables, out,
        block_tables.stride(0), out.stride(0), max_model_len,
        NEXT_N=next_n, H=H, D=D, BLOCK=BLOCK, ROWS_PER_BLOCK=ROWS_PER_BLOCK, CHUNK=chunk,
        NUM_STAGES=stages, BT_VECTOR=bt_vector, SCALE_TMA=scale_tma, KV_TMA=kv_tma, Q_TMA=q_tma,
        num_warps=warps, num_stages=stages,
    )
    return out


# Launch cache: input signature -> _Entry (compiled kernel launched directly, grid, constexpr tail,
# descriptor parameters). A hit skips routing, Triton's argument binding, its Python launcher (which
# re-walks the arguments to encode descriptors) and its per-pointer driver check: host time per call
# is what the L2 flush has to hide in the benchmark. The signature holds every property that routing,
# Triton's specialization (16-byte alignment of pointers) and the grid depend on; never a tensor's
# identity or contents. An entry is verified bitwise against Triton's own launch when it is made.
_FAST = {}       # signature -> _Entry; False: routed, use Triton's launch path; str: why the reference runs
_FAST_OFF = []   # set when a direct launch raised (Triton API drift): Triton's path from then on


def _signature(data):
    q, kv_cache, weights, context_lens, block_tables, max_model_len = data
    qf, kv = q["fp8"], kv_cache["fp8"]
    # The cache's block count is left out (it follows the random context lengths, so it changes with
    # every input); only whether it fits 32-bit row coordinates counts, and _Entry reads it per call.
    return (qf.shape, qf.stride(), qf.dtype, qf.device,
            0 < kv.shape[0] * ROWS_PER_BLOCK < 2 ** 31, kv.shape[1:], kv.stride(), kv.dtype, kv.device,
            weights.shape, weights.stride(), weights.dtype, weights.device,
            context_lens.shape, context_lens.dtype, context_lens.device,
            block_tables.shape, block_tables.stride(), block_tables.dtype, block_tables.device,
            max_model_len, type(max_model_len),
            (qf.data_ptr() | kv.data_ptr() | weights.data_ptr() | context_lens.data_ptr()
             | block_tables.data_ptr()) & 15)


class _DirectLaunch:
    """A CompiledKernel launched through Triton's C launcher (the module its Python launcher wraps)
    with arguments the caller expands: tensor descriptors as (CUtensorMap, shape..., strides...) and
    pointers as ints, which skips the per-pointer driver check (the signature pins device, dtype and
    alignment). Built from Triton 3.x internals; _make_entry verifies it bitwise before use."""

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
        # The C launcher's fixed head: function, cooperative, pdl, global/profile scratch, kernel
        # metadata, launch metadata, enter/exit hooks (custom_kernel checks that no hook is set).
        self.head = (ck.function, bool(runner.launch_cooperative_grid), bool(runner.launch_pdl),
                     None, None, ck.packed_metadata, None, None, None)
        self.tma = []  # per descriptor argument: fill_tma_descriptor's leading parameters
        for m in getattr(ck.metadata, "tensordesc_meta", None) or []:
            if m.get("fp4_padded"):
                raise RuntimeError("fp4-padded descriptors are not handled")
            self.tma.append((m["swizzle"], m["elem_size"], TMA_DTYPE_DEVICE_TO_HOST[m["elem_type"]],
                             m["block_size"]))


class _Entry:
    """One input signature's launch, everything but the data pointers fixed."""

    def __init__(self, data, plan, ck):
        q, kv_cache, weights, context_lens, block_tables, max_model_len = data
        qf, kv = q["fp8"], kv_cache["fp8"]
        batch, next_n = qf.shape[0], qf.shape[1]
        chunk, stages, warps, bt_vector, scale_tma, kv_tma, q_tma = plan
        self.kernel = _DirectLaunch(ck)
        self.fill_tma = triton.runtime.driver.active.utils.fill_tma_descriptor
        self.stream_of = triton.runtime.driver.active.get_current_stream
        self.device = qf.device
        pages = (max_model_len + BLOCK - 1) // BLOCK
        self.grid = ((pages + chunk - 1) // chunk, batch, 1)
        self.out_shape = (batch * next_n, max_model_len)
        qn = next_n * H
        # Per descriptor parameter (None if the plan does not use it): source tensor (0 = q, 1 = the
        # cache), fill_tma_descriptor's leading parameters, row count (None: the cache's, read per
        # call) and width of the 2-D view.
        specs = [(0, batch * qn, D) if q_tma else None, (1, None, D) if kv_tma else None,
                 (1, None, D // 4) if scale_tma else None]
        tma = iter(self.kernel.tma)
        self.descs = [None if sp is None else (sp[0], next(tma), sp[1], sp[2]) for sp in specs]
        if next(tma, None) is not None:
            raise RuntimeError("descriptor count differs from the plan")
        self.scalars = (block_tables.stride(0), max_model_len, max_model_len)  # bt, out strides; len
        self.tail = (next_n, H, D, BLOCK, ROWS_PER_BLOCK, chunk, stages, bt_vector, scale_tma, kv_tma, q_tma)

    def __call__(self, data):
        q, kv_cache, weights, context_lens, block_tables, max_model_len = data
        qf, kv = q["fp8"], kv_cache["fp8"]
        out = torch.empty(self.out_shape, dtype=torch.float32, device=self.device)
        ptrs = (qf.data_ptr(), kv.data_ptr())
        cache_rows = kv.shape[0] * ROWS_PER_BLOCK
        args = []
        for d in self.descs:
            if d is None:
                args.append(None)
            else:
                src, head, rows, width = d
                rows = rows or cache_rows
                args.append(self.fill_tma(ptrs[src], *head, [rows, width], [width, 1], 0))
                args.extend((rows, width, width, 1))
        k = self.kernel
        k.launch(*self.grid, self.stream_of(self.device.index), *k.head, *args,
                 ptrs[0], ptrs[1], ptrs[1], weights.data_ptr(), context_lens.data_ptr(),
                 block_tables.data_ptr(), out.data_ptr(), *self.scalars, *self.tail)
        return out


def _launch_hooked():
    """A profiler's launch hook is set (or this Triton has no knobs): use Triton's launch path,
    which calls the hooks; direct launches would skip them. Triton 3.6's hooks are HookChains
    (empty when unset); older ones are None or a callable."""
    if knobs is None:
        return True
    enter, exit_ = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    return bool(getattr(enter, "calls", enter)) or bool(getattr(exit_, "calls", exit_))


def _make_entry(data):
    """(entry or False, this call's output): launch through Triton's JIT (compiling), then build the
    direct entry and check it reproduces that output bit for bit (one sync, once per signature)."""
    q, kv_cache, weights, context_lens, block_tables, max_model_len = data
    plan = plan_for(q["fp8"].shape[0], q["fp8"].shape[1], max_model_len)
    out = launch_fp8(data, plan)
    try:
        entry = _Entry(data, plan, LAST_COMPILED[0])
        if not torch.equal(entry(data), out):
            raise RuntimeError("its output differs from Triton's launch")
    except Exception as exc:
        print(f"[paged_mqa_logits] direct launch off for this signature: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        entry = False
    return entry, out


def _reference(data, reason):
    _log_fallback(reason)
    from reference import ref_kernel
    return ref_kernel(data)


def custom_kernel(data: input_t) -> output_t:
    try:
        sig = _signature(data)
        entry = _FAST.get(sig)
    except Exception:  # not the expected types: route() says what is wrong
        sig = entry = None
    if isinstance(entry, _Entry) and not _FAST_OFF and not _launch_hooked():
        try:
            return entry(data)
        except Exception as exc:  # launcher API drift: Triton's own launch path from now on
            _FAST_OFF.append(f"{type(exc).__name__}: {exc}")
            print(f"[paged_mqa_logits] direct launches off: {_FAST_OFF[0]}", file=sys.stderr)
    if isinstance(entry, str):  # this signature's plan cannot launch here
        return _reference(data, entry)
    if entry is None:
        ok, reason = route(data)
        if not ok:
            return _reference(data, reason)
    try:
        if entry is None and sig is not None and not _FAST_OFF and not _launch_hooked():
            _FAST[sig], out = _make_entry(data)
            return out
        return launch_fp8(data)  # routed: a profiler hook, no direct entry, or direct launches off
    except Exception as exc:  # the plan's kernel cannot run here (e.g. out of shared memory)
        reason = f"the kernel failed to launch ({type(exc).__name__}: {str(exc)[:200]})"
        if sig is not None:
            _FAST[sig] = reason
        return _reference(data, reason)
