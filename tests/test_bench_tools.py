"""What the bench tools share, on the CPU. tools/lib/peers.py: the conversions of each problem's input into its
peer's arguments. The peers themselves (FlashMLA, DeepGEMM) run on a GPU only; here each is replaced by a
small stand-in that computes what the peer's interface documents from the arguments it is given, so a
wrong argument (a page table, a length, a scale, a context length in the wrong form) gives a wrong
answer. tools/lib/results_plot.py: the picture, where matplotlib imports."""
import contextlib
import importlib
import sys
import types

import pytest
import torch

from conftest import PAGED, ROOT, problem_modules

sys.path[:0] = [str(ROOT / "tools" / group) for group in ("lib", "judge", "kits")]
import peers  # noqa: E402
import results_plot  # noqa: E402


@pytest.mark.parametrize("lengths", [[128, 64, 192], [70, 1, 129, 64]])
def test_pages_of_sequences_hold_each_sequence_in_order(lengths):
    rows = torch.randn(sum(lengths), 1, 8)
    indptr = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    cache, table, got_lengths = peers.pages_of_sequences(rows, indptr, page=64)
    assert got_lengths.tolist() == lengths
    for b, length in enumerate(lengths):
        pages = cache[table[b, :(length + 63) // 64].long()].reshape(-1, 1, 8)[:length]
        assert torch.equal(pages, rows[int(indptr[b]):int(indptr[b + 1])])
    aligned = all(n % 64 == 0 for n in lengths)
    assert (cache.data_ptr() == rows.data_ptr()) == aligned  # a view where the pages line up, else a copy


def tool_module(group: str, name: str):
    """tools/<group>/<name>.py imported afresh, with sys.path as it was before (tools put their folders
    first, which would shadow another problem's modules for later tests)."""
    saved = list(sys.path)
    sys.path.insert(0, str(ROOT / "tools" / group))
    try:
        return importlib.import_module(name)
    finally:
        sys.path[:] = saved
        sys.modules.pop(name, None)


def fake_flash_mla():
    """FlashMLA's dense decode as its interface documents it: q (b, s_q, h, 576), a paged cache
    (pages, 64, 1, 576) read through block_table for cache_seqlens[b] rows, V the first head_dim_v dims."""
    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, metadata, splits,
                               softmax_scale=None, causal=False):
        assert metadata == "meta" and splits is None and not causal
        out = torch.empty(*q.shape[:3], head_dim_v)
        for b in range(q.shape[0]):
            n = int(cache_seqlens[b])
            k = k_cache[block_table[b].long()].reshape(-1, k_cache.shape[-1])[:n].float()
            p = torch.softmax(q[b].float() @ k.T * softmax_scale, dim=-1)
            out[b] = p @ k[:, :head_dim_v]
        return out.to(q.dtype), None

    return types.SimpleNamespace(get_mla_metadata=lambda *args: ("meta", None),
                                 flash_mla_with_kvcache=flash_mla_with_kvcache)


@pytest.mark.parametrize("ragged", [0, 1])
def test_the_mla_peer_is_given_the_problems_attention(monkeypatch, ragged):
    monkeypatch.setitem(sys.modules, "flash_mla", fake_flash_mla())
    with problem_modules(ROOT, ("reference",)) as (R,):  # the MLA kit's, whatever ran before
        data = R.generate_input(3, 2, 100, 5, ragged=ragged)
        peer, why = peers.mla_peer(data)
        assert peer is not None, why
        got = peer.call()
        assert got.shape == (6, 16, 512) and got.dtype == torch.bfloat16
        assert R.compare(got, R.ref_kernel(data).float())["rel_l2"] < 0.01


def fake_flashmla_fp8_ops(calls):
    """The fork's dense fp8 decode as its interface documents it: q (b, s_q, h, 576) and the paged cache
    (pages, 64, 1, 576) in e4m3, each times its descale (shape (1,)), read through block_table for
    cache_seqlens[b] rows; V the first head_dim_v dims; out (b, s_q, h, head_dim_v) bf16."""
    def metadata(seqlens, q_tokens_per_head_k, heads_k):
        assert seqlens.dtype == torch.int32 and heads_k == 1
        calls.append(q_tokens_per_head_k)
        return "meta", "splits"

    def fwd(q, k_cache, head_dim_v, seqlens, block_table, softmax_scale, causal, meta, splits, descale_q, descale_k):
        assert (meta, splits) == ("meta", "splits") and not causal
        assert q.dtype == k_cache.dtype == torch.float8_e4m3fn and descale_q.shape == descale_k.shape == (1,)
        out = torch.empty(*q.shape[:3], head_dim_v)
        for b in range(q.shape[0]):
            n = int(seqlens[b])
            k = k_cache[block_table[b].long()].reshape(-1, k_cache.shape[-1])[:n].float() * descale_k
            p = torch.softmax(q[b].float() * descale_q @ k.T * softmax_scale, dim=-1)
            out[b] = p @ k[:, :head_dim_v]
        return out.to(torch.bfloat16), None

    return types.SimpleNamespace(get_mla_decoding_metadata_dense_fp8=metadata, fwd_kvcache_mla_fp8=fwd)


@pytest.mark.parametrize("ragged", [0, 1])
def test_the_fp8_peer_is_given_the_problems_fp8_cache_and_scales(monkeypatch, ragged):
    calls = []
    monkeypatch.setattr(peers, "flashmla_fp8_ops", lambda: (fake_flashmla_fp8_ops(calls), ""))
    with problem_modules(ROOT, ("reference",)) as (R,):
        data = R.generate_input(3, 2, 100, 5, ragged=ragged)
        peer, why = peers.mla_fp8_peer(data)
        assert peer is not None, why
        got = peer.call()
        assert got.shape == (6, 16, 512) and got.dtype == torch.bfloat16 and calls == [2 * 16]
        # against the exact attention of what the peer is meant to be given: q as the fp8 it is quantized
        # to, the problem's fp8 cache (a row left out, or a scale, shows; the bf16 output rounds ~0.2 %)
        q, kv_data, qo_indptr, kv_indptr, config = data
        q8, q_scale = peers.quantize_per_tensor_fp8(q)
        exact = R.exact_attention(q8.float() * q_scale, R.dequantize_cache(kv_data, "fp8"), qo_indptr, kv_indptr,
                                  config["sm_scale"])
        assert R.compare(got, exact)["rel_l2"] < 0.005


def test_the_fp8_peers_q_is_quantized_as_the_problem_quantizes_its_cache():
    with problem_modules(ROOT, ("reference",)) as (R,):
        x = R.generate_input(3, 2, 100, 5)[0]
        values, scale = peers.quantize_per_tensor_fp8(x)
        want_values, want_scale = R.quantize_fp8(x)
    assert torch.equal(scale, want_scale) and torch.equal(values.view(torch.uint8), want_values.view(torch.uint8))


def test_without_the_fp8_peers_library_the_tools_say_why(monkeypatch):
    import reference as R

    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.delenv(peers.FP8_PEER_LIBRARY, raising=False)
    peer, why = peers.mla_fp8_peer(R.generate_input(1, 1, 64, 1))
    assert peer is None and peers.FP8_PEER_LIBRARY in why
    monkeypatch.setenv(peers.FP8_PEER_LIBRARY, "/nonexistent/_flashmla_extension_C.so")
    peer, why = peers.mla_fp8_peer(R.generate_input(1, 1, 64, 1))
    assert peer is None and "does not load" in why


def test_the_mla_results_file_has_both_peers_columns_and_says_why_one_is_missing(monkeypatch, tmp_path):
    """bench_mla's table on the CPU: the submission's row from stand-ins for its GPU timing, the fp8 peer
    through its stand-in, FlashMLA not there; every row has the header's columns."""
    with problem_modules(ROOT, ("reference", "submission")) as (R, S):
        bench = tool_module("mla", "bench_mla")
        monkeypatch.setitem(sys.modules, "flash_mla", None)
        monkeypatch.setattr(peers, "flashmla_fp8_ops", lambda: (fake_flashmla_fp8_ops([]), ""))
        monkeypatch.setattr(bench, "SHAPES", [(2, 100, 1), (3, 70, 1)])
        monkeypatch.setattr(bench, "ragged_checks", lambda: [])
        monkeypatch.setattr(bench, "host_breakdown", lambda: [])
        monkeypatch.setattr(bench, "sass_counts", lambda path: {})
        monkeypatch.setattr(bench, "time_call", lambda fn, reps=20, warmup=3: 0.01)

        def run_shape(batch, kv, qlen, reps):
            data = R.generate_input(batch, qlen, kv, 1)
            out = R.ref_kernel(data)
            return data, S.plan_for(batch, kv, qlen), bench.rel_err(data, out, "bf16"), True, 0.01
        monkeypatch.setattr(bench, "run_shape", run_shape)
        out = tmp_path / "mla.md"
        monkeypatch.setattr(sys, "argv", ["bench_mla.py", "--out", str(out), "--plot", str(tmp_path / "mla.png"),
                                          "--no-ref"])
        bench.main()
    lines = out.read_text().splitlines()
    header = next(line for line in lines if line.startswith("| batch"))
    rows = [line for line in lines if line.startswith("| 2 | 100") or line.startswith("| 3 | 70")]
    assert len(rows) == 2 and all(row.count("|") == header.count("|") for row in rows)
    assert all("| nan | nan |" in row and "| 0.0100 |" in row for row in rows)  # FlashMLA missing, fp8 peer timed
    assert any("FlashMLA (bf16 cache): not timed, flash_mla does not import" in line for line in lines)
    assert any("fp8 peer 0.0100 ms" in line for line in lines)


def test_the_phase_tool_stamps_every_phase_of_the_gluon_kernel_and_it_compiles_for_sm90():
    """tools/mla/phase_times.py's stamped copy of submission.py: a stamp per phase comment, the kernel with
    its stamp buffer after its runtime arguments, compiled for sm_90 here (Gluon has no interpreter)."""
    with problem_modules(ROOT, ("submission",)):  # the tool's SASS helper imports the MLA kit's
        tool = tool_module("mla", "phase_times")
        text = tool.stamped_source((ROOT / "submission.py").read_text())
        assert all(f"_phase_stamp(stamp_at, {k})" in text for k in range(len(tool.PHASES)))
        with pytest.raises(ValueError, match="no `# phase:` comment"):
            tool.stamped_source((ROOT / "submission.py").read_text().replace("# phase: bounds", "# bounds"))
        module = tool.load_stamped()
        if module.gluon is None:
            pytest.skip("this Triton has no Gluon")
        for split, stamps in ((True, len(tool.PHASES)), (False, len(tool.PHASES) - 1)):  # no merge unsplit
            assert tool.compile_stamped(module, split).asm["ptx"].count("%globaltimer") == stamps


def test_the_phase_tool_times_each_phase_from_the_calls_first_program():
    with problem_modules(ROOT, ("submission",)):
        tool = tool_module("mla", "phase_times")
    stamps = torch.zeros(3, len(tool.PHASES), dtype=torch.int64)
    stamps[:, 0] = torch.tensor([5_000, 4_000, 6_000])
    stamps[:, 5] = torch.tensor([9_000, 10_000, 16_000])
    phases = tool.call_phases(stamps, 3)
    assert phases[0] == (1.0, 2.0) and phases[5] == (6.0, 12.0) and phases[7] is None


def fake_deep_gemm(two_d_only: bool):
    """DeepGEMM's fp8 paged MQA logits as its interface documents it: 1-D lengths (row b * next_n + i
    sees t <= len_b - next_n + i) or 2-D ones (row (b, i) sees t < lens[b, i]). A build that takes only
    2-D lengths refuses 1-D ones in its metadata, and cleaning with 2-D ones."""
    def metadata(lens, block_kv, sms):
        if two_d_only and lens.dim() != 2:
            raise RuntimeError("Only 2D context lens is supported")
        return "meta"

    def logits(q, kv, weights, lens, block_table, meta, max_len, clean):
        assert meta == "meta" and not (clean and lens.dim() == 2)
        batch, next_n = q.shape[:2]
        values = kv.view(kv.shape[0], -1)[:, :64 * 128].contiguous().view(torch.float8_e4m3fn)
        scales = kv.view(kv.shape[0], -1)[:, 64 * 128:].contiguous().view(torch.float32)
        keys = values.float().view(-1, 64, 128) * scales.view(-1, 64, 1)
        out = torch.full((batch * next_n, max_len), float("nan"))
        t = torch.arange(max_len)
        for b in range(batch):
            k = keys[block_table[b].long()].reshape(-1, 128)[:max_len]
            for i in range(next_n):
                r = b * next_n + i
                seen = t < lens[b, i] if lens.dim() == 2 else t <= lens[b] - next_n + i
                score = (torch.relu(q[b, i].float() @ k.T) * weights[r].unsqueeze(1)).sum(0)
                out[r, seen] = score[seen]
                if clean:
                    out[r, ~seen] = float("-inf")
        return out

    return types.SimpleNamespace(get_num_sms=lambda: 132, get_paged_mqa_logits_metadata=metadata,
                                 fp8_paged_mqa_logits=logits)


@pytest.mark.parametrize("two_d_only", [False, True])
def test_the_paged_peer_is_given_the_problems_logits(monkeypatch, two_d_only):
    monkeypatch.setitem(sys.modules, "deep_gemm", fake_deep_gemm(two_d_only))
    with problem_modules(PAGED, ("reference",)) as (R,):
        data = R.generate_input(batch=3, next_n=2, context=150, seed=7)
        peer, why = peers.paged_peer(data)
        assert peer is not None, why
        assert bool(peer.note) == two_d_only
        got = peer.call()
        ref = R.logits_for_format(data, "fp8")
        valid = R.valid_mask(data[3], 2, data[5])
        assert torch.allclose(got[valid], ref[valid], rtol=1e-4, atol=1e-4)
        if not two_d_only:
            assert torch.isneginf(got[~valid]).all()


def test_the_paged_peers_first_call_runs_in_a_child():
    """The child's code itself runs (without deep_gemm it finds no peer and exits 0): an error in it would
    read as a first call that survived."""
    import subprocess

    run = subprocess.run([sys.executable, "-c", peers.PAGED_FIRST_CALL], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_a_peer_that_kills_its_process_costs_only_its_column(monkeypatch):
    monkeypatch.setitem(sys.modules, "deep_gemm", fake_deep_gemm(False))
    monkeypatch.setattr(peers, "PAGED_FIRST_CALL", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    with problem_modules(PAGED, ("reference",)) as (R,):
        peer, why = peers.paged_peer(R.generate_input(batch=2, next_n=1, context=150, seed=7))
    assert peer is None and "deep_gemm killed its process" in why and "SIGSEGV" in why


def test_without_the_peers_package_the_tools_say_why(monkeypatch):
    import reference as R

    monkeypatch.setitem(sys.modules, "flash_mla", None)  # import fails
    peer, why = peers.mla_peer(R.generate_input(1, 1, 64, 1))
    assert peer is None and "flash_mla" in why


def test_the_picture_is_drawn_with_a_gap_for_a_peer_not_timed(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "results.png"
    line = results_plot.draw(str(path), "title", ["4 x 1024", "256 x 8192"],
                             {"submission.py": ([0.0143, 0.301], [0.002, 0.29]),
                              "peer": ([float("nan"), 0.6], [0.004, 0.58])}, [0.001, 0.15], "stamp")
    assert line == f"picture: {path}" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_the_picture_is_skipped_and_said_so(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = tmp_path / "results.png"
    line = results_plot.draw(str(path), "title", ["a"], {"s": ([1.0], [0.5])}, [0.2], "stamp")
    assert "skipped" in line and "matplotlib" in line and not path.exists()


@contextlib.contextmanager
def paged_bench():
    """tools/paged/bench_paged.py, imported with that problem's reference and submission."""
    with problem_modules(PAGED, ("reference", "submission")):
        yield tool_module("paged", "bench_paged")


def test_the_paged_results_file_has_a_row_per_shape_and_the_peers_geomean(tmp_path):
    with paged_bench() as bench:
        results = [dict(spec={"batch": b, "next_n": 1, "context": 1024, "seed": 1}, plan=("fp8", 2, 4, 4, 1, 1, 1, 1),
                        gpu=gpu, host=5.0, host_jit=9.0, bytes=4_200_000, good=True, worst=0.01,
                        peer_name="DeepGEMM 2.3.0+local (fp8)", peer_us=peer,
                        peer_worst=0.02, note=note, fp8_bytes=4_200_000, min_bytes=2_000_000)
                   for b, gpu, peer, note in ((64, 10.0, 20.0, ""), (256, 40.0, 20.0, "2-D context lengths"))]
        out = tmp_path / "results.md"
        bench.write_results(str(out), str(tmp_path / "results.png"), "stamp", results, 20)
    text = out.read_text()
    assert "| 64 | 1 | 1024 | ('fp8', 2, 4, 4, 1, 1, 1, 1) | ok | 10.0 | 1.0 | 0.10 | 5.0 | 20.0 | 0.02 | 0.50 |" in text
    assert "geometric mean: 20.0 us, DeepGEMM 20.0 us" in text and "DeepGEMM: 2-D context lengths" in text
    assert "the peer as it names itself: DeepGEMM 2.3.0+local (fp8)" in text


def test_the_paged_sweep_times_each_plan_through_the_route_and_restores_the_plans(monkeypatch):
    """bench_paged.py's sweep installs a plan, times custom_kernel (the route's launches, which eval.py times; the
    JIT launch path's host time can leak into a queued GPU time), and puts PLANS back; a route that does not
    reproduce the plan's launch (a fallback) is an error, not a time."""
    with paged_bench() as bench:
        S = bench.S
        key, plan = (256, 1, 5376), ("fp8", 16, 4, 4, 1, 0, 1, 0)
        shipped = dict(S.PLANS)
        seen = []

        def custom_kernel(data):  # what the route would run: the plan custom_kernel finds for the shape
            seen.append(S.plan_for(*key))
            return torch.full((2,), float(seen[-1] == S.as_plan(plan)))
        monkeypatch.setattr(S, "custom_kernel", custom_kernel)
        monkeypatch.setattr(bench, "gpu_time", lambda fn, iters: (fn(), 7.5)[1])
        assert bench.route_gpu_time(None, key, plan, 10, torch.ones(2)) == 7.5
        assert set(seen) == {S.as_plan(plan)} and S.PLANS == shipped and S.route_count() == 0
        with pytest.raises(RuntimeError, match="does not reproduce"):
            bench.route_gpu_time(None, key, plan, 10, torch.zeros(2))
        assert S.PLANS == shipped
        new_key = (1, 1, 64)
        bench.route_gpu_time(None, new_key, plan, 10, torch.zeros(2))  # a shape PLANS lacks: removed after
        assert new_key not in S.PLANS


def test_the_judge_clock_summary_gives_each_runs_score_and_their_agreement():
    import judge_clock

    def run(problem, mode, means_us):
        return ("x.json", {"problem": problem, "mode": mode,
                           "cases": [{"stats": {"mean": m * 1e3}} for m in means_us]})

    lines = judge_clock.summary([run("/r", "benchmark", [10, 40]), run("/r", "benchmark", [10, 44.1]),
                                 run("/r", "leaderboard", [21, 21]),
                                 run("/r/problems/paged_mqa_logits", "benchmark", [5])])
    assert "| repository root (MLA) | benchmark | 20.00 / 21.00 | 5.00% |  |" in lines
    assert "| repository root (MLA) | leaderboard | 21.00 | 0.00% | 1.0244 |" in lines
    assert "| paged_mqa_logits | benchmark | 5.00 | 0.00% |  |" in lines


def test_the_paged_sweep_tries_every_plan_format_and_checks_every_fp4_kernels_fallback():
    """The tuning sweep's default formats are all the submission's plan formats, so routing is chosen from
    every kernel; the correctness pass runs each format, and the widened-scale check each fp4 Gluon kernel."""
    with paged_bench() as bench:
        S = bench.S
        assert bench.parse_args([]).formats.split(",") == list(S.FMT_IDS)
        assert {p[0] for p in bench.CHECK_PLANS} == set(S.FMT_IDS)
        assert {p[0] for p in bench.FALLBACK_PLANS} == {f for f in S.GLUON_FORMATS if S.PAIR[f] == "fp4"}


def _ncu_raw(units, rows):
    import fp4_issue_bound as bound
    names = ["ID", "Kernel Name"] + list(bound.METRICS.values())
    lines = ["==PROF== Connected to process 1", ",".join(f'"{n}"' for n in names),
             ",".join(f'"{u}"' for u in ["", ""] + units)]
    lines += [",".join(f'"{v}"' for v in row) for row in rows]
    return "\n".join(lines) + "\n"


def test_the_issue_bound_tool_reads_ncus_raw_csv_in_its_units():
    import fp4_issue_bound as bound
    units = ["inst", "cycle", "Ghz", "us", "", "register/thread"]
    first = ["0", "k", "1", "1", "1", "1", "132", "1"]
    last = ["1", "k", "99,494,912", "511,865.83", "1.70", "301.25", "132", "255"]
    got = bound.parse_raw_csv(_ncu_raw(units, [first, last]))
    assert got == {"inst": 99494912, "cycles": 511865.83, "clock": pytest.approx(1.7e9), "ns": pytest.approx(301250),
                   "sms": 132, "regs": 255}
    with pytest.raises(ValueError, match="furlong"):
        bound.parse_raw_csv(_ncu_raw(["inst", "cycle", "Ghz", "furlong", "", ""], [last]))
    with pytest.raises(ValueError, match="no profiled launch"):
        bound.parse_raw_csv("==PROF== No kernels were profiled.\n")


def test_the_check_calibration_tail_reports_each_answer_against_both_results(capsys):
    calibrate = tool_module("mla", "calibrate_check")
    calibrate.tail(2, seed=0)
    out = capsys.readouterr().out
    assert "a8w8 (q fp8 per tensor)  passes 2/2" in out and "sm_scale 1/sqrt(512)     passes 0/2" in out.split("1024")[1]
    assert out.count("a8w8 L2 p99.9 0.00") == 2  # a8w8 against its own result: the bf16 rounding only
