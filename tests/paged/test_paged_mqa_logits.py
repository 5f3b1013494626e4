"""CPU tests of the paged MQA logits problem (problems/paged_mqa_logits): reference, layouts, check, routing,
and the Triton kernel under TRITON_INTERPRET=1 (in a subprocess, since the variable must be set before
Triton is imported)."""
import importlib.util
import json
import re
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
from conftest import problem_modules

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "problems" / "paged_mqa_logits"


@pytest.fixture(scope="module")
def mods():
    """reference and submission of this problem, imported under their own names (conftest's
    problem_modules) for this module's tests."""
    with problem_modules(PROBLEM) as (ref, sub):
        yield ref, sub


def naive_logits(data, fmt, ref):
    """Loop-by-loop definition: one (row, t) at a time, keys looked up block by block."""
    q, kv_cache, weights, context_lens, block_tables, max_model_len = data
    qf, kf = ref.dequantize_pair(data, fmt)
    batch, next_n = qf.shape[:2]
    out = torch.full((batch * next_n, max_model_len), float("-inf"), dtype=torch.float64)
    for b in range(batch):
        length = int(context_lens[b])
        for i in range(next_n):
            r = b * next_n + i
            for t in range(max_model_len):
                if t > length - next_n + i:
                    continue
                k = kf[int(block_tables[b, t // 64]), t % 64].double()
                s = qf[b, i].double() @ k  # (H,)
                out[r, t] = (weights[r].double() * s.clamp(min=0)).sum()
    return out


# ----------------------------------------------------------------------------------------------------
# reference and layouts
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [dict(batch=2, next_n=1, context=70), dict(batch=2, next_n=2, context=65, random=0),
                                  dict(batch=1, next_n=4, context=10)])
def test_reference_matches_naive_loop(mods, spec):
    ref, _ = mods
    data = ref.generate_input(seed=11, **spec)
    for fmt in ref.FORMATS:
        exact = naive_logits(data, fmt, ref)
        got = ref.logits_for_format(data, fmt)
        assert torch.equal(torch.isneginf(got), torch.isneginf(exact))
        fin = torch.isfinite(exact)
        assert torch.allclose(got[fin].double(), exact[fin], rtol=1e-5, atol=1e-3)
    assert torch.equal(ref.ref_kernel(data), ref.logits_for_format(data, "fp8"))


def test_generate_input_shapes_and_properties(mods):
    ref, _ = mods
    data = ref.generate_input(batch=6, next_n=2, context=300, seed=5)
    q, kv, w, cl, bt, L = data
    assert q["fp8"].dtype == torch.float8_e4m3fn and q["fp8"].shape == (6, 2, 64, 128)
    assert q["fp4"][0].shape == (6, 2, 64, 64) and q["fp4"][1].shape == (6, 2, 64, 4)
    assert kv["fp8"].dtype == torch.uint8 and kv["fp8"].shape[1:] == (64, 1, 132)
    assert kv["fp4"].dtype == torch.uint8 and kv["fp4"].shape[1:] == (64, 1, 68)
    assert kv["fp8"].shape[0] == kv["fp4"].shape[0]
    assert w.shape == (12, 64) and w.dtype == torch.float32
    assert cl.dtype == torch.int32 and bt.dtype == torch.int32 and bt.shape == (6, L // 64)
    assert L % 64 == 0 and L >= int(cl.max()) and int(cl.min()) >= 210 and int(cl.max()) <= 390
    assert len(set(cl.tolist())) > 1  # random lengths
    # block tables: the pages in use are distinct physical blocks, not the identity
    used = torch.cat([bt[b, : (int(cl[b]) + 63) // 64] for b in range(6)])
    assert len(set(used.tolist())) == used.numel()
    assert not torch.equal(used.sort().values, used)
    # weights both signs, spread over decades; scores both signs
    assert (w > 0).any() and (w < 0).any() and w.abs().max() / w.abs().median() > 10
    qf, kf = ref.dequantize_pair(data, "fp8")
    s = qf[0, 0] @ kf[int(bt[0, 0])].t()
    assert (s > 0).float().mean() > 0.2 and (s < 0).float().mean() > 0.2
    # deterministic from the seed
    again = ref.generate_input(batch=6, next_n=2, context=300, seed=5)
    assert torch.equal(again[1]["fp8"], kv["fp8"]) and torch.equal(again[4], bt)
    assert not torch.equal(ref.generate_input(batch=6, next_n=2, context=300, seed=6)[4], bt)


def test_fp8_cache_layout(mods):
    ref, _ = mods
    k = torch.randn(3, 64, 128) * 5
    vals, scales = ref.quantize_fp8_tokens(k)
    cache = ref.pack_fp8_cache(vals, scales)
    assert cache.shape == (3, 64, 1, 132)
    flat = cache.reshape(3, -1)
    # block-major: 64 x 128 fp8 values token-major, then 64 fp32 scales
    assert torch.equal(flat[1, 128 * 5: 128 * 6], vals[1, 5].view(torch.uint8))
    assert torch.equal(flat[2, 8192 + 4 * 7: 8192 + 4 * 8].view(torch.float32), scales[2, 7:8])
    v2, s2 = ref.unpack_fp8_cache(cache)
    assert torch.equal(v2.view(torch.uint8), vals.view(torch.uint8)) and torch.equal(s2, scales)
    deq = ref.dequantize_fp8_cache(cache)
    assert ((deq - k).abs() <= k.abs().amax(-1, keepdim=True) / 16).all()  # e4m3: 3 mantissa bits


def test_fp4_codes_and_cache_layout(mods):
    ref, _ = mods
    # exact codes: E2M1 magnitudes round-trip; ties go to the even code
    x = torch.tensor([[0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
                      + [0.0] * 15])
    packed, sc = ref.quantize_fp4(x)
    assert int(sc[0, 0]) == 127  # amax 6 -> scale 2^0
    y = ref.dequantize_fp4(packed, sc)[0]
    assert y[:10].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -6.0]
    assert y[10:17].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    # low nibble = even element
    assert int(packed[0, 0]) == (0x0 | (0x1 << 4)) and int(packed[0, 4]) == (0x9 | (0xF << 4))
    # dequantized values are fixed points; error bounded by half a step of the group's scale
    k = torch.randn(4, 64, 128) * torch.exp(torch.randn(4, 64, 1))
    p, s = ref.quantize_fp4(k)
    d = ref.dequantize_fp4(p, s)
    assert torch.equal(ref.dequantize_fp4(*ref.quantize_fp4(d)), d)
    step = torch.exp2(s.float() - 127).repeat_interleave(32, dim=-1)
    assert ((d - k).abs() <= step + 1e-12).all()
    cache = ref.pack_fp4_cache(p, s)
    assert cache.shape == (4, 64, 1, 68)
    flat = cache.reshape(4, -1)
    assert torch.equal(flat[3, 64 * 9: 64 * 10], p[3, 9]) and torch.equal(flat[3, 4096 + 4 * 9: 4096 + 4 * 10], s[3, 9])
    p2, s2 = ref.unpack_fp4_cache(cache)
    assert torch.equal(p2, p) and torch.equal(s2, s)


# ----------------------------------------------------------------------------------------------------
# the check: accepts exact results over either format pair, rejects the classic wrong answers
# ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def case(mods):
    ref, _ = mods
    return ref.generate_input(batch=4, next_n=2, context=150, seed=21)


def _wrong(ref, data, **changes):
    q, kv, w, cl, bt, L = data
    qf, kf = ref.dequantize_pair(data, "fp8")
    if changes.get("no_weights"):
        w = torch.ones_like(w)
    if changes.get("identity_tables"):
        bt = torch.arange(bt.numel(), dtype=torch.int32).reshape(bt.shape) % kf.shape[0]
    if changes.get("no_scales"):
        kf = ref.unpack_fp8_cache(kv["fp8"])[0].float()
    return ref.exact_logits(qf, kf, w, cl, bt, L, relu=not changes.get("no_relu"))


def test_check_accepts_exact_over_each_format(mods, case):
    ref, _ = mods
    for fmt in ref.FORMATS:
        ok, msg = ref.check_implementation(case, ref.logits_for_format(case, fmt))
        assert ok, msg
        assert fmt in msg


def test_check_accepts_small_accumulation_error(mods, case):
    """An fp32 result in another summation order, perturbed by 0.3 x the tolerance, passes."""
    ref, _ = mods
    exact, bound = ref.logits_for_format(case, "fp8", with_bound=True)
    sign = torch.where(torch.rand(exact.shape) < 0.5, -1.0, 1.0)
    ok, msg = ref.check_implementation(case, exact + sign * 0.3 * (ref.RTOL * bound + ref.ATOL))
    assert ok, msg


@pytest.mark.parametrize("wrong, words", [
    (dict(no_relu=True), "exceed"),
    (dict(no_weights=True), "exceed"),
    (dict(identity_tables=True), "exceed"),
    (dict(no_scales=True), "exceed"),
])
def test_check_rejects_wrong_answers(mods, case, wrong, words):
    ref, _ = mods
    ok, msg = ref.check_implementation(case, _wrong(ref, case, **wrong))
    assert not ok and words in msg, msg


def test_check_rejects_mask_errors(mods, case):
    ref, _ = mods
    good = ref.ref_kernel(case)
    q, kv, w, cl, bt, L = case
    # positions past the context left at 0 instead of -inf
    bad = good.clone()
    bad[torch.isneginf(bad)] = 0.0
    ok, msg = ref.check_implementation(case, bad)
    assert not ok and "not -inf" in msg, msg
    # causal rule ignored for next_n = 2: row i = 0 also scores t = context_len - 1
    r, t = 0, int(cl[0]) - 1
    bad = good.clone()
    bad[r, t] = 1.0
    ok, msg = ref.check_implementation(case, bad)
    assert not ok and "(row 0, t" in msg, msg
    # a valid position set to -inf, and NaN
    bad = good.clone()
    bad[1, 0] = float("-inf")
    ok, msg = ref.check_implementation(case, bad)
    assert not ok and "NaN or +-inf" in msg, msg
    bad = good.clone()
    bad[2, 3] = float("nan")
    ok, msg = ref.check_implementation(case, bad)
    assert not ok and "NaN" in msg, msg


def test_check_never_raises_on_bad_output(mods, case):
    ref, _ = mods
    good = ref.ref_kernel(case)
    for out, words in [(None, "expected a torch.Tensor"), ("x", "expected a torch.Tensor"),
                       (good[:, :-1], "shape"), (good.double(), "dtype"), (good.to(torch.bfloat16), "dtype"),
                       (good.reshape(-1), "shape"), ([good], "expected a torch.Tensor")]:
        ok, msg = ref.check_implementation(case, out)
        assert not ok and words in msg, msg


# ----------------------------------------------------------------------------------------------------
# submission: routing and fallback
# ----------------------------------------------------------------------------------------------------
def test_routing_reasons(mods, case):
    ref, sub = mods
    ok, reason = sub.can_route(case)
    assert not ok and ("CUDA" in reason or "Triton" in reason)
    ok, reason = sub.can_route(case, require_cuda=False)
    assert ok, reason
    q, kv, w, cl, bt, L = case
    bad_n = ({"fp8": torch.zeros(4, 3, 64, 128, dtype=torch.float8_e4m3fn), "fp4": q["fp4"]}, kv, w, cl, bt, L)
    assert "next_n = 3" in sub.can_route(bad_n, require_cuda=False)[1]
    bad_h = ({"fp8": q["fp8"][:, :, :32].contiguous(), "fp4": q["fp4"]}, kv, w, cl, bt, L)
    assert "expected float8_e4m3fn" in sub.can_route(bad_h, require_cuda=False)[1]
    bad_bt = (q, kv, w, cl, bt[:, :1].contiguous(), L)
    assert "max_model_len / 64" in sub.can_route(bad_bt, require_cuda=False)[1]
    bad_w = (q, kv, w.double(), cl, bt, L)
    assert "weights" in sub.can_route(bad_w, require_cuda=False)[1]
    bad_kv = (q, {"fp8": kv["fp8"][:, :, :, :128].contiguous(), "fp4": kv["fp4"]}, w, cl, bt, L)
    assert "kv_cache" in sub.can_route(bad_kv, require_cuda=False)[1]
    assert "not (q, kv_cache" in sub.can_route((1, 2), require_cuda=False)[1]
    bad_dev = (q, kv, w.to("meta"), cl, bt, L)  # a kernel would get a pointer it cannot read
    assert "different devices" in sub.can_route(bad_dev, require_cuda=False)[1]
    bad_cl = (q, kv, w, torch.stack([cl, cl], 1)[:, 0], bt, L)  # int32 (batch,) but strided
    assert "not contiguous" in sub.can_route(bad_cl, require_cuda=False)[1]
    assert sub._signature(bad_cl) != sub._signature(case)
    # the fp4 pair's own layout checks
    assert sub.can_route(case, "fp4", require_cuda=False)[0]
    bad_q4 = ({"fp8": q["fp8"], "fp4": (q["fp4"][0][..., :32].contiguous(), q["fp4"][1])}, kv, w, cl, bt, L)
    assert "q['fp4'][0]" in sub.can_route(bad_q4, "fp4", require_cuda=False)[1]
    bad_s4 = ({"fp8": q["fp8"], "fp4": (q["fp4"][0], q["fp4"][1].float())}, kv, w, cl, bt, L)
    assert "q['fp4'][1]" in sub.can_route(bad_s4, "fp4", require_cuda=False)[1]
    bad_kv4 = (q, {"fp8": kv["fp8"], "fp4": kv["fp4"][:, :, :, :64].contiguous()}, w, cl, bt, L)
    assert "kv_cache['fp4']" in sub.can_route(bad_kv4, "fp4", require_cuda=False)[1]
    assert sub.can_route(bad_kv4, "fp8", require_cuda=False)[0]  # a pair the plan does not read is not checked
    # the Gluon kernel reads the fp4 pair: the same checks, and Gluon itself
    assert sub.can_route(case, "fp4w", require_cuda=False)[0]
    assert "kv_cache['fp4']" in sub.can_route(bad_kv4, "fp4w", require_cuda=False)[1]
    # the Gluon fp8 kernel reads the fp8 pair
    assert sub.can_route(case, "fp8w", require_cuda=False)[0]
    assert "kv_cache['fp8']" in sub.can_route(bad_kv, "fp8w", require_cuda=False)[1]
    assert sub.can_route(bad_kv4, "fp8w", require_cuda=False)[0]


def test_gluon_plans_route_to_the_reference_without_gluon(mods, case, monkeypatch):
    ref, sub = mods
    monkeypatch.setattr(sub, "_GLUON_ERROR", "ImportError: no gluon")
    for fmt in sub.GLUON_FORMATS:
        ok, reason = sub.can_route(case, fmt, require_cuda=False)
        assert not ok and "Gluon" in reason, fmt
    # a shape planned on a Gluon kernel gets the Triton kernel's plan instead
    monkeypatch.setitem(sub.PLANS, (2, 1, 640), sub.Plan(pair="fp8", kernel=sub.GLUON, chunk=4, stages=3, warps=4, bt_vector=0, scale_tma=1, kv_tma=1, q_tma=0))
    assert sub.plan_for(2, 1, 640).fmt == "fp8"
    assert sub.can_route(case, "fp4", require_cuda=False)[0]  # the Triton kernels do not need it


def test_fallback_logs_once_and_is_exact(mods, case, caplog):
    ref, sub = mods
    sub._logged_reasons.clear()
    with caplog.at_level("WARNING", logger="paged_submission"):
        out = sub.custom_kernel(case)
        out2 = sub.custom_kernel(case)
    lines = [r.getMessage() for r in caplog.records if "fast path off" in r.getMessage()]
    assert len(lines) == 1 and "CUDA" in lines[0]
    assert torch.equal(out, ref.ref_kernel(case)) and torch.equal(out2, out)


def test_signature_ignores_identity_and_values_but_not_layout(mods):
    ref, sub = mods
    a = ref.generate_input(batch=4, next_n=1, context=300, seed=1, random=1)
    b = ref.generate_input(batch=4, next_n=1, context=300, seed=2, random=1)
    assert a[1]["fp8"].shape[0] != b[1]["fp8"].shape[0]  # random lengths: other block counts
    assert sub._signature(a) == sub._signature(b)  # which the launch reads per call
    q, kv, w, cl, bt, L = a
    assert sub._signature((q, kv, w, cl, bt, L + 64)) != sub._signature(a)
    wt = w.t().contiguous().t()  # same shape, other strides
    assert sub._signature((q, kv, wt, cl, bt, L)) != sub._signature(a)


def test_dispatch_and_launch_failures(mods, monkeypatch, caplog):
    """Dispatch alone (GPU parts faked): a route per signature, reused for other tensors of that
    signature; a kernel that cannot launch falls back to the reference, once per signature."""
    ref, sub = mods

    class FakeRoute(sub._Route):
        def __init__(self):
            pass

        def __call__(self, data):
            return "route"
    made = []
    monkeypatch.setattr(sub, "_routes", {})
    monkeypatch.setattr(sub, "can_route", lambda data, fmt: (True, "ok"))
    monkeypatch.setattr(sub, "_make_route", lambda data, plan: made.append(1) or (FakeRoute(), "first call"))
    a = ref.generate_input(batch=2, next_n=1, context=100, seed=1, random=0)
    b = ref.generate_input(batch=2, next_n=1, context=100, seed=2, random=0)
    assert sub.custom_kernel(a) == "first call" and sub.custom_kernel(b) == "route" and len(made) == 1

    def out_of_smem(data, plan):
        made.append(1)
        raise RuntimeError("out of resource: shared memory")
    monkeypatch.setattr(sub, "_routes", {})
    monkeypatch.setattr(sub, "_make_route", out_of_smem)
    sub._logged_reasons.clear()
    with caplog.at_level("WARNING", logger="paged_submission"):
        out1, out2 = sub.custom_kernel(a), sub.custom_kernel(a)
    assert torch.equal(out1, ref.ref_kernel(a)) and torch.equal(out2, out1) and len(made) == 2
    assert sum("shared memory" in r.getMessage() for r in caplog.records) == 1


def test_plans_cover_benchmarks(mods):
    """Every benchmark shape has a plan; plans are well formed."""
    import yaml
    ref, sub = mods
    spec = yaml.safe_load(open(PROBLEM / "task.yml"))
    for b in spec["benchmarks"]:
        L = ref._round_up(int(1.3 * b["context"]), 64)
        plan = sub.plan_for(b["batch"], b["next_n"], L)
        assert plan.fmt in sub.FMT_IDS and plan.chunk in (1, 2, 4, 8, 16, 32, 64) and plan.warps in (4, 8)
        if plan.fmt == "fp4":  # the Triton fp4 kernel loads q and the scales plainly
            assert plan.scale_tma == plan.q_tma == 0
        if plan.fmt in sub.GLUON_FORMATS:  # the only tail the Gluon kernels take
            assert (plan.warps, plan.bt_vector, plan.scale_tma, plan.kv_tma, plan.q_tma) == (4, 0, 1, 1, 0)


# ----------------------------------------------------------------------------------------------------
# the Triton kernel under the interpreter
# ----------------------------------------------------------------------------------------------------
_INTERP = textwrap.dedent("""
    import json, sys
    import triton.runtime.interpreter as I
    # numpy >= 2.4 refuses int() of a 1-element array, which the interpreter's loop bounds are
    _orig = I._patch_lang_tensor
    def _patched(tensor, scope):
        _orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
    I._patch_lang_tensor = _patched
    sys.path.insert(0, sys.argv[1])
    import reference as R, submission as S
    import torch
    res = []
    for spec, plan in json.loads(sys.argv[2]):
        poison = spec.pop("poison", False)
        data = R.generate_input(**spec)
        if poison:  # table entries past each context: a block id far outside the cache
            bt, pages = data[4], (data[3] + 63) // 64
            bt[torch.arange(bt.shape[1])[None, :] >= pages[:, None]] = 1 << 30
        out = S.launch(data, tuple(plan) if plan else None)
        ok, msg = R.check_implementation(data, out)
        pair = S.as_plan(plan).pair if plan else S.plan_for(*S._shape_of(data)).pair
        res.append([ok and msg.startswith(f"matches the {pair} pair"), msg])  # and through the pair it read
    print(json.dumps(res))
""")


def test_kernel_under_interpreter():
    pytest.importorskip("triton")
    cases = [
        (dict(batch=3, next_n=1, context=150, seed=1), ["fp8", 2, 3, 4, 1, 1, 1, 1]),  # ragged, tails not multiples of 64
        (dict(batch=2, next_n=2, context=100, seed=2), ["fp8", 4, 2, 4, 1, 1, 1, 0]),  # causal next_n = 2
        (dict(batch=2, next_n=4, context=70, seed=3), ["fp8", 2, 2, 4, 1, 0, 1, 0]),   # next_n = 4, plain loads of scales and q
        (dict(batch=2, next_n=1, context=1, random=0, seed=4), None),                  # context length 1
        (dict(batch=2, next_n=2, context=64, random=0, seed=5), ["fp8", 1, 2, 4, 0, 1, 0, 1]),  # scalar table loads, plain keys
        (dict(batch=3, next_n=1, context=150, seed=6), ["fp4", 2, 3, 4, 1, 0, 1, 0]),  # fp4 pair: ragged, TMA keys
        (dict(batch=2, next_n=2, context=100, seed=7), ["fp4", 4, 2, 4, 0, 0, 0, 0]),  # fp4, causal, plain loads
        (dict(batch=2, next_n=4, context=65, random=0, seed=8), ["fp4", 1, 2, 4, 1, 0, 1, 0]),  # fp4, next_n = 4
        # table entries past the context point far outside the cache: never followed (plain loads would fault)
        (dict(batch=3, next_n=1, context=150, seed=9, poison=True), ["fp8", 4, 2, 4, 1, 0, 0, 0]),
        (dict(batch=3, next_n=2, context=100, seed=10, poison=True), ["fp8", 2, 2, 4, 0, 0, 0, 0]),
    ]
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _INTERP, str(PROBLEM), json.dumps(cases)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    for (spec, plan), (ok, msg) in zip(cases, res):
        assert ok, f"{spec} {plan}: {msg}"


def test_route_allocates_the_next_output_after_its_launch(mods):
    """Each call returns a tensor of its own, the one its kernel wrote; the next call's output is
    allocated after this call's launch (host time that then overlaps the kernel), per stream."""
    ref, sub = mods
    data = ref.generate_input(batch=2, next_n=1, context=100, seed=3)
    launched = []
    route = sub._Route.__new__(sub._Route)
    route.fmt, route.device, route.grid = "fp8", torch.device("cpu"), (1, 2, 1)
    route.stream_of = lambda index: current_stream[0]
    route.out_shape, route.rows_per_block = (2, data[5]), 66
    route.fill_tma, route.descriptor_args, route.descs = (lambda *a: "desc"), {}, [None, None, None]
    route.scalars, route.tail = (), ()
    route.outputs = sub._OutputsAhead(route.out_shape)

    def launch(*args):
        stream, out_ptr = args[3], args[14]
        assert stream not in route.outputs.spare  # nothing allocated ahead before this launch
        launched.append(out_ptr)
    route.kernel = types.SimpleNamespace(head=(), launch=launch)
    current_stream = [7]
    outs = [route(data) for _ in range(3)]
    assert [o.data_ptr() for o in outs] == launched
    assert len({o.data_ptr() for o in outs}) == 3  # alive together, never the same storage
    assert all(o.shape == (2, data[5]) and o.dtype == torch.float32 for o in outs)
    spare = route.outputs.spare[7]
    current_stream[0] = 9  # another stream: not handed the spare allocated on stream 7
    other = route(data)
    assert other is not spare and route.outputs.spare[7] is spare and 9 in route.outputs.spare


def test_route_memoizes_descriptors_by_addresses_and_cache_rows(mods):
    """The route's descriptor memo is keyed by what the encodes read (q's and the cache's addresses,
    the cache's rows), reuses nothing across different ones, and stays bounded."""
    ref, sub = mods
    calls = []

    def fill_tma(ptr, tag, shape, strides, pad):
        calls.append(ptr)
        return (ptr, tag, tuple(shape))
    route = sub._Route.__new__(sub._Route)
    route.fill_tma, route.descriptor_args = fill_tma, {}
    route.descs = [(0, ("q box",), 128, 128), (1, ("key box",), None, 128), None]  # q, keys by TMA; scales plain
    first = route._descriptor_args((1 << 20, 2 << 20), 660)
    assert first == ((1 << 20, "q box", (128, 128)), 128, 128, 128, 1,
                     (2 << 20, "key box", (660, 128)), 660, 128, 128, 1, None)
    assert route._descriptor_args((1 << 20, 2 << 20), 660) is first and len(calls) == 2
    assert route._descriptor_args((1 << 20, 2 << 20), 330)[5][2] == (330, 128)  # fewer blocks: re-encoded
    assert route._descriptor_args((1 << 20, 3 << 20), 660)[5][0] == 3 << 20 and len(calls) == 6
    for i in range(100):
        route._descriptor_args((1 << 20, (4 << 20) + 4096 * i), 660)
    assert len(route.descriptor_args) <= 16


def _sass_tool(sub):
    """tools/paged/sass_offline_paged.py, compiling this test's submission module. The tool puts its
    directory first on sys.path; that is undone, or a later test's `import reference` would get this kit's."""
    spec = importlib.util.spec_from_file_location("paged_sass_offline", PROBLEM.parents[1] / "tools" / "paged" / "sass_offline_paged.py")
    tool = importlib.util.module_from_spec(spec)
    path = list(sys.path)
    try:
        spec.loader.exec_module(tool)
    finally:
        sys.path[:] = path
    tool.S = sub
    return tool


@pytest.mark.parametrize("fmt", ["fp4w", "fp4ws"])
def test_gluon_fp4_kernel_compiles_for_sm90_with_register_keys(mods, fmt):
    """The Gluon fp4 kernel (plan formats fp4w, and fp4ws warp-specialised) compiles for sm_90 on this CPU
    machine (Gluon has no interpreter; the GPU run is bench_paged.py's), and does what it is for: keys by TMA,
    fp8 wgmma, and the decoded keys fed to the wgmma from registers (the only fp8 tiles put in shared
    memory are q's two), read as 16-byte words (one scale group of a row a thread), no spills."""
    ref, sub = mods
    pytest.importorskip("triton.experimental.gluon")
    tool = _sass_tool(sub)
    k = tool.compile_gluon(fmt, chunk=8, stages=3, next_n=1)
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    assert "cp.async.bulk.tensor" in ptx and "wgmma.mma_async" in ptx and "e5m2.e5m2" in ptx
    assert ttgir.count("warp_group_dot ") >= 2 and "dot_op<{opIdx = 0" in ttgir
    # q's two operands are the only fp8 buffers in shared memory, and the only fp8 tiles stored there
    assert len(re.findall(r"local_alloc[^\n]*-> !ttg.memdesc<\d+x\d+xf8E5M2", ttgir)) == 2
    assert len(re.findall(r"local_store %\S+, %\S+ : tensor<\d+x\d+xf8E5M2", ttgir)) == 2
    sass = tool.sass_of(k)
    ops = tool.opcode_counts(sass)
    assert not ops["LDL"] and not ops["STL"] and not ops["HMMA"]
    # It is issue-bound: a page's instructions are its cost. With one table per (row, scale group) a
    # page-loop iteration is ~300 SASS instructions a thread (~250 for the warp-specialised warpgroup);
    # the decode that built a table per 4 packed bytes took 335.
    loop = tool.mma_loop(sass)
    assert sum(text.startswith("QGMMA") for text in loop) == 4
    assert sum(text.startswith("LDS.128") for text in loop) == 2, "keys not read as one group a thread"
    assert len(loop) < (265 if fmt == "fp4ws" else 320), len(loop)
    if fmt == "fp4ws":
        assert "setmaxnreg.dec" in ptx and not any(t.startswith("UTMALDG") for t in loop)  # TMA: the producer's


@pytest.mark.parametrize("next_n", [1, 2])
def test_gluon_fp8_kernel_compiles_for_sm90(mods, next_n):
    """The Gluon fp8 kernel (plan format fp8w) compiles for sm_90 on this CPU machine: keys and key scales
    by TMA, 4 fp8 wgmmas a page (QGMMA, no HMMA), no spills, and the logits stored without a layout
    conversion (no shared-memory round trip in the page loop but the key scales' read)."""
    ref, sub = mods
    pytest.importorskip("triton.experimental.gluon")
    tool = _sass_tool(sub)
    k = tool.compile_gluon("fp8w", chunk=16, stages=3, next_n=next_n)
    assert "cp.async.bulk.tensor" in k.asm["ptx"] and "e4m3.e4m3" in k.asm["ptx"]
    sass = tool.sass_of(k)
    ops = tool.opcode_counts(sass)
    assert ops["UTMALDG"] > 0 and ops["QGMMA"] > 0 and not ops["HMMA"] and not ops["LDL"] and not ops["STL"]
    loop = tool.mma_loop(sass)
    count = lambda op: sum(text.split()[0].split(".")[0] == op for text in loop)  # noqa: E731
    assert count("QGMMA") == 4 and count("FMNMX") == 64 * 64 * next_n // 128  # a thread's scores a page
    assert count("STS") == 0 and count("LDS") <= 2, (count("STS"), count("LDS"))
    # the head sums as FFMA chains: a thread's 16 heads of a row in 1 FMUL + 15 FFMA, then only the quad's
    # two FADDs a row (gl.sum's in-thread tree would add 15 more)
    assert count("FADD") <= 4 * next_n and count("FFMA") >= 30 * next_n, (count("FADD"), count("FFMA"))
    assert len(loop) < {1: 180, 2: 280}[next_n], len(loop)
