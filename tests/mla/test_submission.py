"""CPU tests of submission.py: routing (plan table + rule), fallback to the reference, and the
Triton kernels under the interpreter (TRITON_INTERPRET=1, run in a subprocess because the
variable must be set before triton is imported) on small ragged shapes against an
independent fp32 reference."""
import json
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import reference  # noqa: E402
import submission as S  # noqa: E402


# ---------------------------------------------------------------------------- routing
def test_plan_table_entries_are_used_and_well_formed():
    for key, plan in S.PLANS.items():
        assert isinstance(plan, S.Plan) and S.plan_for(*key) == plan
        fmt, bn, splits, warps, stages, kernel = plan
        assert fmt in S.FMT_IDS and bn in (32, 64, 128) and splits >= 1
        assert warps in (4, 8) and stages >= 2 and kernel in (S.KERNEL_HMMA, S.KERNEL_WGMMA, S.KERNEL_GLUON)
        if kernel == S.KERNEL_GLUON:  # the one configuration its layouts are written for
            assert (fmt, bn, warps, stages) == ("fp8", S.GLUON_BN, S.GLUON_WARPS, S.GLUON_STAGES)


def test_benchmark_shapes_are_all_planned():
    for b in (4, 32, 64, 256):
        for kv in (1024, 8192):
            assert (b, kv, 1) in S.PLANS


def _check_rule(batch, kv, q, gluon):
    assert isinstance(S.plan_for(batch, kv, q), S.Plan)
    fmt, bn, splits, warps, stages, kernel = S.plan_for(batch, kv, q)
    if gluon and batch * kv >= S.GLUON_MIN_TOKENS:
        kind = "gluon"
    else:
        kind = "bf16" if batch * kv >= S.BIG_MIN_TOKENS else "fp8"
    assert (fmt, bn, warps, stages, kernel) == S.RULE_KERNEL[kind]
    assert 1 <= splits <= S.MAX_SPLITS
    shortest = S.GLUON_BN if kind == "gluon" else S.MIN_TOKENS_PER_SPLIT
    assert splits <= max(1, kv // shortest)  # no split shorter than the minimum
    if splits > 1:  # splits only while the grid is not yet ~2 programs per SM
        assert batch * q * (splits - 1) < 2 * S.NUM_SMS
        if kind == "gluon":  # which runs at most two programs per SM, one where splits would be short
            per_sm = 2 if kv // splits >= S.GLUON_TWO_PER_SM_ROWS else 1
            assert batch * q * splits <= per_sm * S.NUM_SMS


RULE_SHAPES = [(1, 16, 1), (8, 4096, 1), (128, 4096, 1), (2, 100, 2), (1000, 64, 1), (3, 1 << 20, 1),
               (16, 2048, 1), (100, 512, 1)]


@pytest.mark.parametrize("batch,kv,q", RULE_SHAPES)
def test_rule_for_unplanned_shapes(batch, kv, q):
    assert (batch, kv, q) not in S.PLANS
    _check_rule(batch, kv, q, S.gluon is not None)


def test_rule_gives_the_gluon_kernel_the_tuned_split_counts():
    """The rule, applied to the tuned shapes, picks the tuned table's Gluon split counts (one program
    per SM on short splits, two on long ones)."""
    if S.gluon is None:
        pytest.skip("this Triton has no Gluon")
    for key, plan in list(S.PLANS.items()):
        if plan[5] == S.KERNEL_GLUON:
            saved = S.PLANS.pop(key)
            try:
                assert S.plan_for(*key) == plan, key
            finally:
                S.PLANS[key] = saved


def test_without_gluon_the_big_shapes_read_bf16(monkeypatch):
    """A Triton without Gluon: table plans that name the Gluon kernel and the rule's big plans both
    become the Triton kernel on the bf16 cache; nothing routes to a kernel that cannot be built."""
    monkeypatch.setattr(S, "gluon", None)
    for batch, kv, q in RULE_SHAPES:
        _check_rule(batch, kv, q, False)
    for key, plan in S.PLANS.items():
        if plan[5] == S.KERNEL_GLUON:
            assert S.plan_for(*key).kernel != S.KERNEL_GLUON
            _check_rule(*key, False)


def test_split_programs_fit_on_the_device_together(monkeypatch):
    """The Gluon kernel's in-kernel merge waits for the other splits of its row, so a split plan never
    launches more programs than the device holds at once (two per SM): fewer splits on a smaller GPU,
    other plans unchanged."""
    monkeypatch.setattr(S, "_resident_programs", lambda dev: 2 * 114)  # an H100 PCIe
    gluon = ("fp8", 64, 8, 4, 2, S.KERNEL_GLUON)
    assert S._fit_to_device(gluon, 32, "cuda") == ("fp8", 64, 7, 4, 2, S.KERNEL_GLUON)
    assert S._fit_to_device(gluon, 16, "cuda") == gluon
    assert S._fit_to_device(gluon, 300, "cuda")[2] == 1  # more rows than programs fit: no split
    triton_plan = ("bf16", 64, 16, 4, 2, S.KERNEL_HMMA)  # a separate combine kernel: no waiting
    assert S._fit_to_device(triton_plan, 64, "cuda") == triton_plan
    monkeypatch.setattr(S, "_resident_programs", lambda dev: 2 * 132)  # the H200: the table as tuned
    for (batch, kv, q_seq), plan in S.PLANS.items():
        assert S._fit_to_device(plan, batch * q_seq, "cuda") == plan


def test_gluon_merge_chunks_give_each_split_program_one_or_two():
    """_combine_in_kernel merges a row in 512 / COMBINE_DIMS chunks, program s taking chunks s and
    s + splits: that covers every chunk, once, for every split count, in loads of at most 64 values
    per thread."""
    for splits in range(2, S.MAX_SPLITS + 1):
        c = S._gluon_combine_constexprs(splits)
        chunks = 512 // c["COMBINE_DIMS"]
        assert chunks * c["COMBINE_DIMS"] == 512 and c["COMBINE_DIMS"] % 8 == 0
        assert c["SPLITS_P2"] >= splits and c["SPLITS_P2"] * S.NUM_HEADS * c["COMBINE_DIMS"] <= 64 * 128
        taken = sorted(x for s in range(splits) for x in (s, s + splits) if x < chunks)
        assert taken == list(range(chunks))


def test_gluon_operand_rows_cover_the_v_dims_once():
    """_v_dim(m), the V dim held in row m of the Gluon kernel's register operand, is a permutation of
    0..127 and matches the reshape/permute _v_chunk applies to the [2 tiles, rows, 64 dims] load."""
    if S.gluon is None:
        pytest.skip("this Triton has no Gluon")
    import numpy as np
    m = np.arange(128)
    dims = S._v_dim.fn(m)
    assert sorted(dims.tolist()) == list(range(128))
    # _v_chunk's relabelling, applied to each element's dim within the 2 tiles (tile * 64 + dim)
    loaded = np.broadcast_to((np.arange(2)[:, None, None] * 64 + np.arange(64)[None, None, :]), (2, 64, 64))
    operand = loaded.reshape(2, 64, 2, 8, 2, 2).transpose(4, 0, 2, 5, 3, 1).reshape(128, 64)
    assert (operand == dims[:, None]).all()


# ---------------------------------------------------------------------------- fallback
def test_no_cuda_falls_back_to_reference_once(caplog):
    data = reference.generate_input(2, 1, 37, seed=3, ragged=1)
    assert not data[0].is_cuda
    S._logged_reasons.clear()
    with caplog.at_level("WARNING", logger="mla_submission"):
        out1 = S.custom_kernel(data)
        out2 = S.custom_kernel(data)
    assert torch.equal(out1, out2)
    ok, msg = reference.check_implementation(data, out1)
    assert ok, msg
    lines = [r for r in caplog.records if "fast path off" in r.getMessage()]
    assert len(lines) == 1 and "CUDA" in lines[0].getMessage()


def test_fast_path_reasons():
    data = reference.generate_input(2, 1, 16, seed=1)
    q, kv_data, qo, kvp, cfg = data
    assert "CUDA" in S._fast_path_problem(q, kv_data, qo, kvp, cfg, "mxfp4")
    saved = S.TensorDescriptor
    try:
        S.TensorDescriptor = None
        assert "tensor descriptors" in S._fast_path_problem(q, kv_data, qo, kvp, cfg, "mxfp4")
    finally:
        S.TensorDescriptor = saved


# ---------------------------------------------------------------------------- launch cache
def test_signature_ignores_identity_and_values_but_not_layout():
    a = reference.generate_input(4, 1, 64, 1, ragged=1)
    b = reference.generate_input(4, 1, 64, 2, ragged=1)  # other tensors, values and total length
    assert a[3][-1] != b[3][-1]
    plan = S.plan_for(4, 64, 1)
    sig = S._signature(a[0], a[1], a[3], a[4], plan[0])
    assert sig == S._signature(b[0], b[1], b[3], b[4], plan[0])
    for fmt in ("mxfp4", "fp8", "bf16"):
        assert S._signature(a[0], a[1], a[3], a[4], fmt) == S._signature(b[0], b[1], b[3], b[4], fmt)
    q_t = a[0].transpose(0, 1).contiguous().transpose(0, 1)  # same shape, other strides
    assert S._signature(q_t, a[1], a[3], a[4], plan[0]) != sig
    cfg = dict(a[4], sm_scale=0.5)
    assert S._signature(a[0], a[1], a[3], cfg, plan[0]) != sig
    assert S._signature(a[0].to(torch.float16), a[1], a[3], a[4], plan[0]) != sig


def test_dispatch_uses_the_route_of_the_signature(monkeypatch):
    """First call of a signature builds a route; later calls with other tensors of that
    signature run it (the GPU parts are faked: this is the dispatch logic alone)."""
    class FakeRoute(S._Route):
        def __init__(self):
            pass

        def __call__(self, q, kv_data, kv_indptr):
            return "routed"
    made = []
    monkeypatch.setattr(S, "_routes", {})
    monkeypatch.setattr(S, "_fast_path_problem", lambda *a: None)
    monkeypatch.setattr(S, "_make_route", lambda *a: made.append(1) or (FakeRoute(), "first call"))
    assert S.custom_kernel(reference.generate_input(2, 1, 64, 3)) == "first call"
    assert S.custom_kernel(reference.generate_input(2, 1, 64, 4)) == "routed"
    assert S.custom_kernel(reference.generate_input(2, 1, 128, 4)) == "first call"  # new shape
    assert len(made) == 2


def test_a_plan_that_cannot_launch_falls_back_once(monkeypatch, caplog):
    tries = []

    def out_of_smem(*args):
        tries.append(1)
        raise RuntimeError("out of resource: shared memory")
    monkeypatch.setattr(S, "_routes", {})
    monkeypatch.setattr(S, "_fast_path_problem", lambda *a: None)
    monkeypatch.setattr(S, "_make_route", out_of_smem)
    S._logged_reasons.clear()
    data = reference.generate_input(2, 1, 64, 3)
    with caplog.at_level("WARNING", logger="mla_submission"):
        out1 = S.custom_kernel(data)
        out2 = S.custom_kernel(data)
    expected = reference.ref_kernel(data)
    assert torch.equal(out1, expected) and torch.equal(out2, expected)
    assert len(tries) == 1  # the failure is remembered for the signature
    assert sum("shared memory" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("which", ["launch_enter_hook", "launch_exit_hook"])
def test_launch_hooks_turn_direct_launches_off(which):
    """(_launch_hooked is a block both submissions share: tests/test_shared_blocks.py.)"""
    knobs = pytest.importorskip("triton").knobs
    assert not S._launch_hooked()  # Triton 3.6: empty HookChains

    def hook(*args):
        pass
    getattr(knobs.runtime, which).add(hook)
    try:
        assert S._launch_hooked()
    finally:
        getattr(knobs.runtime, which).remove(hook)
    assert not S._launch_hooked()


# ---------------------------------------------------------------------------- kernels (interpreter)
_INTERP_SCRIPT = textwrap.dedent(r'''
    import json, math, os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, sys.argv[1])
    import torch
    import triton.language as tl
    import triton.runtime.interpreter as interp
    # Triton 3.6's interpreter turns scalars into 1-element arrays, and int() of those fails on
    # NumPy >= 2.4 (data-dependent loop bounds hit it): take the element explicitly.
    _orig = interp._patch_lang_tensor
    def _patched(tensor, scope):
        _orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
    interp._patch_lang_tensor = _patched
    import submission as S
    import reference as R

    E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64)
    def deq_mxfp4(packed, scales):  # independent of reference.dequantize_mxfp4
        p = packed.reshape(packed.shape[0], -1).long()
        codes = torch.empty(p.shape[0], 2 * p.shape[1], dtype=torch.long)
        codes[:, 0::2], codes[:, 1::2] = p & 15, p >> 4
        val = E2M1[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
        scale = torch.pow(2.0, scales.double() - 127).repeat_interleave(32, dim=1)
        return val * scale
    def cache(kv, fmt):
        if fmt == "mxfp4":
            return deq_mxfp4(*kv["mxfp4"])
        if fmt == "fp8":
            return kv["fp8"][0].reshape(kv["fp8"][0].shape[0], -1).double() * kv["fp8"][1].double()
        return kv["bf16"].reshape(kv["bf16"].shape[0], -1).double()
    def attention(q, K, kvp, qlen, sm):
        out = torch.empty(q.shape[0], 16, 512, dtype=torch.float64)
        for r in range(q.shape[0]):
            b = r // qlen
            k = K[kvp[b]:kvp[b + 1]]
            p = torch.softmax(q[r].double() @ k.T * sm, dim=-1)
            out[r] = p @ k[:, :512]
        return out

    results = []
    for batch, qlen, kv, ragged, seed, plan, q_gain in json.loads(sys.argv[2]):
        data = R.generate_input(batch, qlen, kv, seed, ragged)
        q, kvd, qo, kvp, cfg = data
        q = q * q_gain  # a power of two: exact in bf16
        out = S._launch(q, kvd, kvp, cfg, tuple(plan), dot_dtype=tl.float16)
        ref = attention(q, cache(kvd, plan[0]), kvp.tolist(), qlen, cfg["sm_scale"])
        err = ((out.double() - ref).norm() / ref.norm()).item()
        results.append([batch, qlen, kvp.tolist(), plan, err, bool(torch.isfinite(out).all())])
    print(json.dumps(results))
''')

# (batch, q_seq_len, kv_seq_len, ragged, seed, plan, q gain). Ragged lengths start with a
# length-1 sequence and are rarely multiples of BLOCK_N; splits > 1 exercise the combine kernel,
# also with empty splits (a length-1 sequence split 3 ways). The q gains 2^20 and 2^-20 put q
# outside fp16's range: the kernel must rescale it (fp8 reads use fp16 dots).
_CASES = [
    (3, 1, 40, 1, 0, ("mxfp4", 16, 1, 4, 2, 0), 1),
    (3, 2, 30, 1, 1, ("mxfp4", 16, 3, 4, 2, 1), 1),
    (2, 1, 50, 0, 2, ("mxfp4", 32, 2, 4, 2, 0), 1),
    (3, 1, 30, 1, 3, ("fp8", 16, 2, 4, 2, 0), 1),
    (2, 4, 20, 1, 4, ("fp8", 16, 1, 4, 2, 1), 1),
    (2, 1, 30, 1, 7, ("fp8", 16, 2, 4, 2, 0), 2.0 ** 20),
    (2, 1, 30, 1, 8, ("fp8", 16, 1, 4, 2, 1), 2.0 ** -20),
    (3, 1, 25, 1, 5, ("bf16", 16, 3, 4, 2, 0), 1),
    (2, 1, 45, 0, 6, ("bf16", 16, 2, 4, 2, 1), 1),
    (2, 1, 300, 1, 9, ("bf16", 16, 9, 4, 2, 0), 1),    # 9 splits: the combine's 32-column programs
    (1, 1, 600, 0, 10, ("fp8", 16, 33, 4, 2, 0), 1),  # 33 splits (padded to 64): 8-column programs
]


@pytest.fixture(scope="module")
def interp_results():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _INTERP_SCRIPT, ROOT, json.dumps(_CASES)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("i", range(len(_CASES)))
def test_kernel_under_interpreter(interp_results, i):
    batch, qlen, lens, plan, err, finite = interp_results[i]
    assert finite
    # bf16 output of fp16 dots on exactly representable operands: ~1e-3 relative error.
    assert err < 5e-3, (batch, qlen, lens, plan, err)


def test_interpreter_cases_cover_ragged_edges(interp_results):
    lens = [b - a for _, _, p, _, _, _ in interp_results for a, b in zip(p, p[1:])]
    assert 1 in lens and any(n % 16 for n in lens)


def test_route_allocates_the_next_output_after_its_launches():
    """Each call returns a tensor of its own, the one its kernel wrote; the next call's output is
    allocated after this call's launches (host time that then overlaps the kernels), per stream."""
    launched = []
    route = S._Route.__new__(S._Route)
    route.fmt, route.total_q, route.splits, route.row, route.gluon = "bf16", 3, 1, 576, False
    route.device, route.stream_of = torch.device("cpu"), lambda index: current_stream[0]
    route.descriptors, route.fill_tma = {}, lambda *a: "desc"
    route.part_ptrs, route.combine, route.split_consts = {}, None, ()
    route.qk_scale, route.q_seq_len = 0.1, 1
    route.outputs = S._OutputsAhead((3, S.NUM_HEADS, S.V_DIM))

    def launch(*args):
        stream, out_ptr = args[3], args[5]
        assert stream not in route.outputs.spare  # nothing allocated ahead before this launch
        launched.append((stream, out_ptr))
    route.split = types.SimpleNamespace(tma=[(), ()], head=(), launch=launch)
    current_stream = [7]
    q = torch.zeros(3, S.NUM_HEADS, S.QK_DIM, dtype=torch.bfloat16)
    kv = {"bf16": torch.zeros(10, 1, S.QK_DIM, dtype=torch.bfloat16)}
    indptr = torch.tensor([0, 4, 7, 10], dtype=torch.int32)
    outs = [route(q, kv, indptr) for _ in range(3)]
    assert [o.data_ptr() for o in outs] == [ptr for _, ptr in launched]
    assert len({o.data_ptr() for o in outs}) == 3  # alive together, never the same storage
    assert all(o.shape == (3, S.NUM_HEADS, S.V_DIM) and o.dtype == torch.bfloat16 for o in outs)
    spare = route.outputs.spare[7]
    current_stream[0] = 9  # another stream: not handed the spare allocated on stream 7
    other = route(q, kv, indptr)
    assert other is not spare and route.outputs.spare[7] is spare and 9 in route.outputs.spare
    # short kernels (small caches): each call allocates its own output before its launches
    route.outputs, launched[:] = S._OutputsAhead((3, S.NUM_HEADS, S.V_DIM), ahead=False), []
    small = [route(q, kv, indptr) for _ in range(2)]
    assert [o.data_ptr() for o in small] == [ptr for _, ptr in launched] and not route.outputs.spare
    # which benchmark shapes allocate ahead: all but 4 x 1024, whose kernels take ~11 us
    ahead = {(b, kv): S._allocate_output_ahead({"batch_size": b, "kv_seq_len": kv}, S.plan_for(b, kv, 1).fmt)
             for b in (4, 32, 64, 256) for kv in (1024, 8192)}
    assert [shape for shape, yes in ahead.items() if not yes] == [(4, 1024)]


def test_split_scratch_is_one_set_per_stream():
    """Split partials and the merge's arrival counters belong to one stream: calls on one stream run in
    order and may share them; calls on two may overlap and must not (mixed partials, and a merge that
    would wait on the other call's programs). The counters start at 0."""
    cpu = torch.device("cpu")
    first = S._scratch_for(2, 3, cpu, 7)
    assert S._scratch_for(2, 3, cpu, 7) is first
    other = S._scratch_for(2, 3, cpu, 8)
    assert {t.data_ptr() for t in first}.isdisjoint(t.data_ptr() for t in other)
    assert first[2].dtype == torch.int64 and first[2].shape == (2,) and not first[2].any()
    # the route takes the scratch of the stream it launches on
    got, current = [], [7]
    route = S._Route.__new__(S._Route)
    route.fmt, route.total_q, route.splits, route.row, route.gluon = "fp8", 2, 3, 576, True
    route.device, route.stream_of = cpu, lambda index: current[0]
    route.descriptors, route.fill_tma, route.part_ptrs, route.combine = {}, lambda *a: "desc", {}, None
    route.split_consts, route.qk_scale, route.q_seq_len = (), 0.25, 1
    route.outputs = S._OutputsAhead((2, S.NUM_HEADS, S.V_DIM), ahead=False)
    route.split = types.SimpleNamespace(tma=[(), ()], head=(), launch=lambda *a: got.append(a[20:23]))  # the three scratch pointers
    q = torch.zeros(2, S.NUM_HEADS, S.QK_DIM, dtype=torch.bfloat16)
    kv = {"fp8": (torch.zeros(10, 1, S.QK_DIM, dtype=torch.float8_e4m3fn), torch.ones(1))}
    indptr = torch.tensor([0, 4, 10], dtype=torch.int32)
    route(q, kv, indptr)
    current[0] = 8
    route(q, kv, indptr)
    assert got == [tuple(t.data_ptr() for t in first), tuple(t.data_ptr() for t in other)]


def test_route_memoizes_descriptors_by_cache_address_and_length():
    """The route's descriptor memo is keyed by what the encode reads (the cache's address and token
    count), reuses nothing across different ones, and stays bounded under ever-new inputs."""
    calls = []

    def fill_tma(ptr, tag, shape, strides, pad):
        calls.append((ptr, tag))
        return (ptr, tag, tuple(shape), tuple(strides))
    route = S._Route.__new__(S._Route)
    route.row, route.descriptors, route.fill_tma, route.gluon = 576, {}, fill_tma, False
    route.split = types.SimpleNamespace(tma=[("kv box",), ("rope box",)])
    first = route._descriptors(1 << 20, 100)  # as the C launcher takes them: map, shape, strides
    assert first == ((1 << 20, "kv box", (100, 576), (576, 1)), 100, 576, 576, 1,
                     (1 << 20, "rope box", (100, 576), (576, 1)), 100, 576, 576, 1)
    assert route._descriptors(1 << 20, 100) is first and len(calls) == 2  # repeated cache: no encode
    assert route._descriptors(1 << 20, 60)[0][2] == (60, 576)  # same address, other length: encoded
    assert route._descriptors(2 << 20, 100)[5][0] == 2 << 20 and len(calls) == 6
    for i in range(100):
        route._descriptors((3 << 20) + 1024 * i, 100)
    assert len(route.descriptors) <= 16
    # the Gluon kernel's views: the nope columns as (8 tiles, tokens, 64), then the whole rows
    route.gluon, route.descriptors = True, {}
    assert route._descriptors(1 << 20, 100) == ((1 << 20, "kv box", (8, 100, 64), (64, 576, 1)), 8, 100, 64, 64, 576, 1,
                                                (1 << 20, "rope box", (100, 576), (576, 1)), 100, 576, 576, 1)


def test_gluon_route_passes_the_kernels_parameters_in_order():
    """The direct launch of the Gluon kernel hands the C launcher its parameters in the kernel's order
    (the descriptor expanded to CUtensorMap, shape, strides; pointers as ints; constexprs last).
    On the GPU the route is also checked bitwise against Triton's launch when it is made."""
    if S.gluon is None:
        pytest.skip("this Triton has no Gluon")
    got = []
    route = S._Route.__new__(S._Route)
    route.fmt, route.total_q, route.splits, route.row, route.gluon = "fp8", 2, 3, 576, True
    route.device, route.stream_of = torch.device("cpu"), lambda index: 5
    route.descriptors, route.fill_tma = {}, lambda *a: "desc"
    route.part_ptrs, route.combine = {5: (111, 222, 333)}, None  # the scratch of stream 5
    route.split_consts = tuple(S._split_constexprs(S.Plan("fp8", 64, 3, 4, 2, S.KERNEL_GLUON), None).values())
    route.qk_scale, route.q_seq_len = 0.25, 1
    route.outputs = S._OutputsAhead((2, S.NUM_HEADS, S.V_DIM), ahead=False)
    route.split = types.SimpleNamespace(tma=[(), ()], head=("h",), launch=lambda *a: got.append(a))
    q = torch.zeros(2, S.NUM_HEADS, S.QK_DIM, dtype=torch.bfloat16)
    kv = {"fp8": (torch.zeros(10, 1, S.QK_DIM, dtype=torch.float8_e4m3fn), torch.ones(1))}
    indptr = torch.tensor([0, 4, 10], dtype=torch.int32)
    out = route(q, kv, indptr)
    grid, args = got[0][:3], got[0][5:]  # after the grid, the stream and the launcher's head
    assert grid == (2, 3, 1)
    names = S._mla_fp8_wgmma_kernel.arg_names
    assert names == ["nope_desc", "rope_desc", "q_ptr", "out_ptr", "scale_ptr", "kv_indptr_ptr", "part_o_ptr",
                     "part_lse_ptr", "sync_ptr", "qk_scale", "q_seq_len", "num_splits", "BN", "SPLIT", "STAGES",
                     "SPLITS_P2", "COMBINE_DIMS"]
    # the descriptors with their views: the nope columns as (8 tiles, rows, 64), the (rows, 576) cache
    assert args[:12] == ("desc", 8, 10, 64, 64, 576, 1, "desc", 10, 576, 576, 1)
    assert args[12:] == (q.data_ptr(), out.data_ptr(), kv["fp8"][1].data_ptr(), indptr.data_ptr(), 111, 222, 333,
                        0.25, 1, 3, 64, True, 2, 4, 128)
    assert len(got) == 1  # the kernel merges its splits itself: no combine launch


def test_triton_route_passes_the_kernels_parameters_in_order():
    """As above, for _mla_split_kernel's direct launch (descriptors before the scale pointer, no
    arrival counters) and the combine kernel that merges its splits."""
    got = []
    route = S._Route.__new__(S._Route)
    route.fmt, route.total_q, route.splits, route.row, route.gluon = "fp8", 2, 3, 576, False
    route.device, route.stream_of = torch.device("cpu"), lambda index: 5
    route.descriptors, route.fill_tma = {}, lambda *a: "desc"
    route.part_ptrs = {5: (111, 222, 333)}
    plan = S.Plan("fp8", 64, 3, 4, 2, S.KERNEL_HMMA)
    route.split_consts = tuple(S._split_constexprs(plan, "dot").values())
    route.qk_scale, route.q_seq_len = 0.25, 1
    route.outputs = S._OutputsAhead((2, S.NUM_HEADS, S.V_DIM), ahead=False)
    route.split = types.SimpleNamespace(tma=[(), ()], head=("h",), launch=lambda *a: got.append(a))
    route.combine = types.SimpleNamespace(head=("c",), launch=lambda *a: got.append(a))
    route.combine_programs, route.combine_consts = 4, (4, 128)
    q = torch.zeros(2, S.NUM_HEADS, S.QK_DIM, dtype=torch.bfloat16)
    kv = {"fp8": (torch.zeros(10, 1, S.QK_DIM, dtype=torch.float8_e4m3fn), torch.ones(1))}
    indptr = torch.tensor([0, 4, 10], dtype=torch.int32)
    out = route(q, kv, indptr)
    names = S._mla_split_kernel.arg_names
    assert names[:11] == ["q_ptr", "out_ptr", "kv_desc", "rope_desc", "scale_ptr", "kv_indptr_ptr", "part_o_ptr",
                          "part_lse_ptr", "qk_scale", "q_seq_len", "num_splits"]
    assert got[0][:3] == (2, 3, 1) and got[0][5:] == (
        q.data_ptr(), out.data_ptr(), "desc", 10, 576, 576, 1, "desc", 10, 576, 576, 1, kv["fp8"][1].data_ptr(),
        indptr.data_ptr(), 111, 222, 0.25, 1, 3, *route.split_consts)
    assert tuple(names[11:]) == tuple(S._split_constexprs(plan, "dot"))
    assert got[1][:3] == (2, 4, 1) and got[1][5:] == (111, 222, out.data_ptr(), 3, 4, 128)


def test_gluon_kernel_compiles_for_sm90_to_tma_and_wgmma():
    """The Gluon kernel compiles for sm_90 on this CPU machine (Gluon has no interpreter: its GPU
    checks are eval.py's and tools/mla/bench_mla.py's) and runs what it is for: TMA loads (UTMALDG), the
    scores as fp8 wgmma (QGMMA), P.V as fp16 wgmma (HGMMA) with V from registers, no mma.sync."""
    if S.gluon is None:
        pytest.skip("this Triton has no Gluon")
    sys.path[:0] = [os.path.join(ROOT, "tools", "mla"), os.path.join(ROOT, "tools", "lib")]
    import re
    import sass_offline
    for split, splits in ((True, 4), (False, 1), (True, 2), (True, 33)):  # the merge's layouts at both ends
        k = sass_offline.compile_gluon(split, splits)
        ttgir = k.asm["ttgir"]
        # split: one release add per program on its row's counter, then acquire loads (the in-kernel merge)
        assert k.asm["ptx"].count("atom.global.gpu.release.add.u64") == int(split)
        assert ("ld.acquire.gpu.global.b64" in k.asm["ptx"]) == split
        assert k.metadata.shared <= 113 * 1024  # two programs per SM
        assert re.search(r"warp_group_dot %\S+, %\S+, .*tensor<128x64xf16, #ttg.dot_op<\{opIdx = 0", ttgir)
        assert not re.search(r"local_(alloc|store) .*tensor<64x64xf16", ttgir)  # no fp16 copy of V
        sass = sass_offline.sass_of(k)
        ops = re.findall(r"\b(UTMALDG|QGMMA|HGMMA|HMMA)\b", sass)
        assert {"UTMALDG", "QGMMA", "HGMMA"} <= set(ops) and "HMMA" not in ops
        # a ring slot is two TMA ops (the 8 nope tiles as one 3-D box, the rope tile): Triton puts a
        # CTA barrier between TMA ops on one mbarrier, so 9 separate tiles cost 9 barriers per tile
        assert sass.count("UTMALDG.3D") == sass.count("UTMALDG.2D") == 2 * S.GLUON_STAGES


def test_a_gluon_kernel_that_fails_hands_over_to_the_triton_plans(monkeypatch, caplog):
    """Gluon is experimental: if its kernel fails to build or launch, that call and every later one
    runs the Triton plans (the rule without Gluon), logged once; the reference is not the fallback."""
    data = reference.generate_input(2, 1, 37, seed=4)
    tried = []

    def make_route(q, kv_data, kv_indptr, config, plan):
        tried.append(plan)
        if plan[5] == S.KERNEL_GLUON:
            raise RuntimeError("gluon API moved")
        return False, "triton output"
    monkeypatch.setattr(S, "PLANS", {(2, 37, 1): S.Plan("fp8", 64, 1, 4, 2, S.KERNEL_GLUON)})
    monkeypatch.setattr(S, "gluon", S.gluon or object())
    monkeypatch.setattr(S, "_gluon_off", [])
    monkeypatch.setattr(S, "_routes", {})
    monkeypatch.setattr(S, "_fast_path_problem", lambda *a: None)
    monkeypatch.setattr(S, "_launch_hooked", lambda: False)
    monkeypatch.setattr(S, "_make_route", make_route)
    monkeypatch.setattr(S, "_launch", lambda *a: "triton output")
    with caplog.at_level("WARNING", logger="mla_submission"):
        assert S.custom_kernel(data) == "triton output"
        assert S.custom_kernel(data) == "triton output"
    assert [p[5] for p in tried] == [S.KERNEL_GLUON, S.KERNEL_HMMA]  # Gluon tried once, then Triton
    assert S.plan_for(2, 37, 1)[5] != S.KERNEL_GLUON and S.plan_for(256, 8192, 1)[5] != S.KERNEL_GLUON
    assert sum("Gluon kernel is off" in r.message for r in caplog.records) == 1


def test_gluon_q_split_in_f16_equals_the_fp32_split():
    """_Q_SPLIT_ASM splits q (bf16 values times 2^k, |x| < 2^8) into e4m3 q_hi + q_lo with f16x2
    arithmetic. Its claim, checked for every such bf16 value: the parts equal those of the fp32
    computation (x exact in f16 where it matters, x - q_hi exact, both parts 0 below 2^-14)."""
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    x = bits.float()
    x = x[torch.isfinite(x) & (x.abs() < 256)]
    hi32 = x.to(torch.float8_e4m3fn)
    lo32 = (x - hi32.float()).to(torch.float8_e4m3fn)
    xh = x.half()  # cvt.rn.f16x2.f32
    hi16 = xh.float().to(torch.float8_e4m3fn)  # cvt.rn.satfinite.e4m3x2.f16x2
    lo16 = (xh - hi16.half()).float().to(torch.float8_e4m3fn)  # sub.rn.f16x2, then the same cvt
    assert torch.equal(hi16.float(), hi32.float())  # equal values (a zero's sign may differ)
    assert torch.equal(lo16.float(), lo32.float())
    big = x.abs() >= 4  # within 6 binades of the largest |x| the parts keep ~8 significant bits
    assert ((hi32.float() + lo32.float() - x).abs()[big] <= x.abs()[big] / 128).all()


# ---------------------------------------------------------------------------- on the GPU
_MERGE_CASES = [  # (batch, q_seq_len, kv_seq_len, ragged, empty sequence): Gluon plans with 33, 4, 2, 8 splits
    (4, 1, 8192, 0, None), (32, 1, 1024, 0, None), (64, 1, 1024, 0, None), (32, 1, 8192, 1, None),
    (32, 1, 8192, 1, 5), (16, 2, 4096, 1, 0)]  # ... one sequence empty; the rule's plan for q_seq_len 2


@pytest.mark.skipif(not torch.cuda.is_available() or S.gluon is None, reason="needs a GPU and Gluon")
@pytest.mark.parametrize("batch, q_seq, kv, ragged, empty", _MERGE_CASES)
def test_gluon_in_kernel_merge_on_the_gpu(batch, q_seq, kv, ragged, empty):
    """The Gluon kernel's in-kernel split merge: within tolerance of exact attention over the fp8 cache,
    an empty sequence gives zeros, and repeated calls (the arrival counters only grow) are bitwise equal."""
    q, kv_data, qo_indptr, kv_indptr, config = reference.generate_input(batch, q_seq, kv, seed=77, ragged=ragged)
    if empty is not None:  # sequence `empty` loses its rows to the next one
        kv_indptr[empty + 1] = kv_indptr[empty]
    data = (q, kv_data, qo_indptr, kv_indptr, config)
    plan = S._fit_to_device(S.plan_for(batch, kv, q_seq), q.shape[0], q.device)
    assert plan[5] == S.KERNEL_GLUON and plan[2] > 1, plan
    outs = [S.custom_kernel(data).clone() for _ in range(4)]
    routes = [r for r in S._routes.values() if isinstance(r, S._Route) and r.gluon and r.total_q == q.shape[0]]
    assert routes and all(r.split.head[1] for r in routes)  # launched cooperatively: all resident, or an error
    ok, message = reference.check_implementation(data, outs[0])
    assert ok and "fp8" in message, message
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    if empty is not None:
        assert not outs[0][empty * q_seq:(empty + 1) * q_seq].any()
