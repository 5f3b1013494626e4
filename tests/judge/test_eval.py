"""eval.py end to end, in subprocesses, on small shapes: every mode, human and POPCORN_FD output,
malformed definitions and arguments, bad submissions, memory and time limits. The hostile submissions are
in test_eval_timing.py and test_eval_confinement.py; the judge's modules have their own tests beside these
(test_worker.py, test_process.py, test_timing.py, test_stats.py, test_modes.py, test_report.py)."""
import base64
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import judge_modes
import judge_process
import judge_timing
from eval_runs import CUDA, ROOT, run_eval
from eval_runs import one_case_fixture, problem_fixture  # noqa: F401  (fixtures)


# ---------------------------------------------------------------------------------------------
# Modes and output
# ---------------------------------------------------------------------------------------------
def test_test_mode_passes_human_and_popcorn(problem):
    code, out, err, log, _ = run_eval(problem, "test", popcorn=True)
    assert code == 0, out + err
    assert "2/2 tests passed" in out and "[PASS] test 1" in out
    assert log["check"] == "pass" and log["test-count"] == "2"
    assert log["test.1.spec"] == "batchsize: 3; qseqlen: 2; kvseqlen: 20; ragged: 1; seed: 12"
    assert log["test.0.status"] == "pass" and "bf16 cache" in log["test.0.message"]
    assert "worker:" in out  # the header says how the submission's process is confined


def test_tests_file_argument_and_seed(problem, tmp_path):
    tests = tmp_path / "tests.txt"
    tests.write_text("batchsize: 1; qseqlen: 1; kvseqlen: 1; seed: 5\nbatchsize: 2; qseqlen: 1; kvseqlen: 7; seed: 6\n")
    code, out, err, log, _ = run_eval(problem, "test", extra=[str(tests)], popcorn=True, env={"POPCORN_SEED": "123"})
    assert code == 0, out + err
    assert log["test-count"] == "2" and log["test.0.spec"] == "batchsize: 1; qseqlen: 1; kvseqlen: 1; seed: 5"
    assert "seed 123" in out


@pytest.mark.parametrize("submission,needle", [
    ("raises", "kernel exploded"),
    ("garbage", "none of the caches"),
    ("wrong_shape", "shape (3,)"),
    ("not_a_tensor", "must be a torch.Tensor, got 'list'"),
    ("crashes", "exit code 3"),
    ("killed", "killed by signal SIGKILL (killed: most often the machine ran out of memory)"),
    ("no_kernel", "custom_kernel"),
])
def test_bad_submissions_fail_each_case_and_harness_goes_on(problem, submission, needle):
    code, out, err, log, _ = run_eval(problem, "test", submission=submission, popcorn=True)
    assert code == 112, out + err
    assert log["check"] == "fail"
    assert log["test.0.status"] == "fail" and log["test.1.status"] == "fail"  # the run went on after case 0
    assert needle in log["test.0.error"] and needle in out


def with_input_bytes(problem, tmp_path, kvseqlen: int, nbytes: int):
    """A copy of the problem whose reference says the case of this kvseqlen has an input of nbytes."""
    d = tmp_path / "p"
    shutil.copytree(problem, d)
    with open(d / "reference.py", "a") as f:
        f.write(f"\n_sized = input_bytes\ndef input_bytes(**case):\n"
                f"    return {nbytes} if case['kvseqlen'] == {kvseqlen} else _sized(**case)\n")
    return d


def test_a_case_too_large_for_the_machine_is_skipped_before_it_is_generated(problem, tmp_path):
    """Every case is weighed before any runs: test and leaderboard (which cover every case) end at once, saying
    what to do instead; benchmark skips the case and says so up front."""
    d = with_input_bytes(problem, tmp_path, 65, 10**15)  # this machine's memory against an input of a petabyte
    for mode in ("test", "benchmark", "leaderboard"):
        code, out, err, log, _ = run_eval(d, mode, popcorn=True)
        key = "test" if mode == "test" else "benchmark"
        assert log[f"{key}.0.status"] == "skip" and "more than the" in log[f"{key}.0.message"], out + err
        assert "generate" not in err  # skipped before its input existed
        if mode == "benchmark":  # unranked: the other cases' times, saying so
            assert code == 0 and "covers the other cases only" in out and "ranking score" in out, out + err
        else:  # a check and a ranked score cover every case: said before any case runs
            assert code == 112 and log["check"] == "fail" and "ranking score" not in out, out + err
            assert "so no case was run" in out and log[f"{key}.1.message"].startswith("not run"), out + err


def test_memory_the_submission_takes_cannot_get_a_case_skipped(problem, tmp_path):
    """Cases are weighed against the memory the machine had before the submission ran: a submission that
    takes 4 GB in its first case cannot have a later case, one it gets wrong, skipped (the run passed so)."""
    if CUDA:
        pytest.skip("cases are weighed against memory on the CPU only")
    available = judge_process.available_memory()
    if available is None or available < 10e9:
        pytest.skip("needs 10 GB of memory available")
    # the second case's input weighs what fits with 2.5 GB to spare, against the memory read now
    d = with_input_bytes(problem, tmp_path, 66, int((available - 2.5e9) / judge_timing.HARNESS_MEMORY_FACTOR))
    cases = tmp_path / "two.txt"
    cases.write_text("batchsize: 2; qseqlen: 1; kvseqlen: 65; seed: 11\nbatchsize: 2; qseqlen: 1; kvseqlen: 66; seed: 12\n")
    code, out, err, log, _ = run_eval(d, "test", submission="takes_memory_to_skip_cases", extra=[str(cases)],
                                      popcorn=True)
    assert code == 112 and log["check"] == "fail", out + err
    assert log["test.0.status"] == "pass" and log["test.1.status"] == "fail", out + err


def test_memory_an_earlier_run_left_behind_cannot_pass_a_case(problem, tmp_path):
    """Memory left in /dev/shm by an earlier run outlives it and is missing when the next run weighs its
    cases: the case it gets wrong cannot run, and a run with a case that cannot run does not pass."""
    ballast = Path("/dev/shm/eval-hostile-ballast")
    if CUDA:
        pytest.skip("cases are weighed against memory on the CPU only")
    available = judge_process.available_memory()
    shm = os.statvfs("/dev/shm") if Path("/dev/shm").is_dir() else None
    if available is None or available < 12e9 or shm is None or shm.f_bavail * shm.f_frsize < 6e9:
        pytest.skip("needs 12 GB of memory available and 6 GB free in /dev/shm")
    first, later = tmp_path / "first.txt", tmp_path / "later.txt"
    first.write_text("batchsize: 2; qseqlen: 1; kvseqlen: 65; seed: 11\n")
    later.write_text("batchsize: 2; qseqlen: 1; kvseqlen: 65; seed: 11\nbatchsize: 2; qseqlen: 1; kvseqlen: 66; seed: 12\n")
    ballast.unlink(missing_ok=True)
    try:
        code, out, err, log, _ = run_eval(problem, "test", submission="leaves_memory_in_dev_shm", extra=[str(first)])
        assert code == 0 and ballast.exists(), out + err
        # Read with the leftover in place, just before the run it is meant to sway: the case needs 2 GB more
        # than that, so it fits without the 4 GB leftover and not with it, whatever the machine's memory did
        # since this test began (a reading taken then drifts with what earlier tests' processes release).
        with_leftover = judge_process.available_memory()
        d = with_input_bytes(problem, tmp_path, 66, int((with_leftover + 2e9) / judge_timing.HARNESS_MEMORY_FACTOR))
        code, out, err, log, _ = run_eval(d, "test", submission="leaves_memory_in_dev_shm", extra=[str(later)],
                                          popcorn=True)
        assert log["test.1.status"] == "skip" and log["test.0.message"].startswith("not run"), out + err  # weighed first
        assert code == 112 and log["check"] == "fail" and "so no case was run" in out, out + err
    finally:
        ballast.unlink(missing_ok=True)


def with_test_timeout(problem, tmp_path, seconds: int):
    """A copy of the problem whose test mode has a time limit of `seconds`."""
    d = tmp_path / "p"
    shutil.copytree(problem, d)
    (d / "task.yml").write_text((problem / "task.yml").read_text().replace("test_timeout: 60", f"test_timeout: {seconds}"))
    return d


@pytest.fixture(scope="module")
def time_limits(problem, one_case):
    """(a test-mode time limit, in whole seconds, that this machine starts a worker well within; the
    judge's own time around a run of two cases beside the limits; the measured run). 8 s and 20 s, or
    three and two times a whole one-case run of an honest submission where the machine is slower than
    that: a loaded machine, where the worker, at nice 19, starts slowest."""
    start = time.monotonic()
    code, out, err, _, _ = run_eval(problem, "test", extra=[one_case])
    assert code == 0, out + err
    took = time.monotonic() - start
    return max(8, math.ceil(3 * took)), max(20.0, 2 * took), took


def test_a_hang_fails_within_the_time_limit(problem, tmp_path, time_limits):
    short_limit, slack, one_run = time_limits
    d = with_test_timeout(problem, tmp_path, short_limit)
    start = time.monotonic()
    code, out, err, log, _ = run_eval(d, "test", submission="hangs", popcorn=True, timeout=4 * short_limit + 60)
    took = time.monotonic() - start
    assert code == 112 and log["check"] == "fail", out + err
    assert log["test.0.status"] == "fail" and "timed out" in log["test.0.error"], out + err
    if CUDA:  # the limit is the whole run's, as kernelbot applies it
        assert took < short_limit + max(3, one_run)
        assert log["test.1.status"] == "fail"
        assert f"not run: the run's time limit ({short_limit} s" in log["test.1.error"]
    else:  # each case's
        assert took < 2 * short_limit + slack and "timed out" in log["test.1.error"]  # two limits, two worker starts


def test_a_message_dripped_byte_by_byte_fails_within_the_time_limit(problem, tmp_path, time_limits):
    short_limit, slack, _ = time_limits
    d = with_test_timeout(problem, tmp_path, short_limit)
    start = time.monotonic()
    code, out, err, log, _ = run_eval(d, "test", submission="drips_a_message", popcorn=True,
                                      timeout=4 * short_limit + 60)
    took = time.monotonic() - start
    assert code == 112 and log["check"] == "fail", out + err
    assert "timed out in the middle of a message" in log["test.0.error"], out + err
    assert took < 2 * short_limit + slack, out + err


def test_benchmark_mode_reports_stats(problem):
    code, out, err, log, _ = run_eval(problem, "benchmark", popcorn=True)
    assert code == 0, out + err
    assert log["benchmark-count"] == "2" and log["check"] == "pass"
    for i in range(2):
        assert int(log[f"benchmark.{i}.runs"]) >= judge_modes.MIN_RUNS
        assert 0 < float(log[f"benchmark.{i}.best"]) <= float(log[f"benchmark.{i}.mean"]) <= float(log[f"benchmark.{i}.worst"])
        assert float(log[f"benchmark.{i}.judge"]) > 0  # the judge's own estimate of the mean
        assert log[f"benchmark.{i}.late_holds"] == "0"
    assert "geometric mean of the means (ranking score)" in out
    assert "geometric mean of the best calls (not ranked)" in out
    assert "agree with the judge's clock" in out
    assert ("CPU wall-clock" in out) != CUDA  # without CUDA it says plainly what the times are


def test_benchmark_goes_on_after_a_failed_case_and_leaderboard_stops(problem):
    code, out, err, log, _ = run_eval(problem, "benchmark", submission="wrong_first", popcorn=True)
    assert code == 112 and log["check"] == "fail", out + err
    assert log["benchmark.0.status"] == "fail" and "benchmark.1.mean" in log  # as GPU MODE's eval
    assert "1 of 2 cases failed (0): no score" in out and "ranking score" not in out
    code, out, err, log, _ = run_eval(problem, "leaderboard", submission="wrong_first", popcorn=True)
    assert code == 112 and log["benchmark.0.status"] == "fail" and "benchmark.1.spec" not in log
    assert "the run ends here" in out


def test_leaderboard_checks_every_call_so_caching_fails(problem):
    code, out, err, log, _ = run_eval(problem, "leaderboard", submission="caches", popcorn=True)
    assert code == 112, out + err
    assert log["benchmark.0.status"] == "fail" and "timed call 0" in log["benchmark.0.error"]
    assert "none of the caches" in log["benchmark.0.error"]
    code, *_ = run_eval(problem, "test", submission="caches")
    assert code == 0  # a single call per case cannot see the cache: only ranked runs can


@pytest.mark.parametrize("submission", ["honest_bf16", "honest_fp8", "honest_mxfp4", "honest_a8w8"])
def test_honest_submissions_pass_the_leaderboard(problem, one_case, submission):
    code, out, err, log, _ = run_eval(problem, "leaderboard", submission=submission, extra=[one_case], popcorn=True,
                                      env={"POPCORN_SEED": "99"})
    assert code == 0, out + err
    assert log["check"] == "pass" and int(log["benchmark.0.runs"]) >= judge_modes.MIN_RUNS


def _compare(problem, a, b, one_case):
    cmd = [sys.executable, str(ROOT / "eval.py"), "compare", str(problem / f"{a}.py"), str(problem / f"{b}.py"),
           one_case, "--problem", str(problem)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if not k.startswith("POPCORN_")})
    m = re.search(r"geometric mean of A/B over the cases: ([\d.]+) \[([\d.]+), ([\d.]+)\]", proc.stdout)
    assert proc.returncode == 0 and m, proc.stdout + proc.stderr
    return proc.stdout, *map(float, m.groups())


def test_compare_tells_a_slower_copy_from_the_same_submission(problem, one_case):
    out, ratio, lo, hi = _compare(problem, "honest_bf16", "slowed", one_case)
    assert lo <= ratio <= hi < 0.9 and "A is faster" in out  # 4 ms more per call, on a call of ~1 ms
    out, ratio, lo, hi = _compare(problem, "honest_bf16", "honest_bf16", one_case)  # the same file twice
    if not lo <= 1.0 <= hi:  # two processes of one file differ more on a loaded CPU machine: once more
        out, ratio, lo, hi = _compare(problem, "honest_bf16", "honest_bf16", one_case)
    assert 0.9 < ratio < 1.1 and lo <= 1.0 <= hi and "no difference the run can tell" in out


def test_compare_runs_each_side_in_a_sandbox_the_other_cannot_write(problem, one_case):
    """A rewrites B's submission and the reference beside it before B has run (A's first call comes first):
    each side has its own sandbox, and (Landlock) writes only in its own, so B runs as B wrote it."""
    out, ratio, lo, hi = _compare(problem, "rewrites_the_other_side", "honest_bf16", one_case)
    if "Landlock" not in out:
        pytest.skip("no Landlock on this kernel: a worker is not kept out of another's sandbox")
    # B rewritten would wait 4 ms a call (A/B under 0.1); as written the two do the same work, whose
    # ratio a loaded CPU machine can move by tens of percent
    assert "LEAK" not in out and ratio > 0.5, out


def test_compare_takes_two_submissions():
    proc = subprocess.run([sys.executable, str(ROOT / "eval.py"), "compare", "a.py"], capture_output=True, text=True)
    assert proc.returncode == 2 and "compare A.py B.py" in proc.stderr


def test_profile_mode(problem):
    code, out, err, log, _ = run_eval(problem, "profile", popcorn=True)
    assert code == 0, out + err
    table = base64.b64decode(log["benchmark.0.report"].encode(), b"+*").decode()
    assert "Self CPU" in table and "Self CPU" in out


@pytest.mark.parametrize("content,needle", [
    ("batchsize: 2; qseqlen 1\n", "invalid case part"),
    ("batchsize: 2; qseqlen: 1; kvseqlen: 4; seed: 1; colour: 3\n", "colour"),
    ("batchsize: 2; qseqlen: 1; kvseqlen: 4\n", "seed"),
])
def test_malformed_tests_file_exits_113(problem, tmp_path, content, needle):
    tests = tmp_path / "bad.txt"
    tests.write_text(content)
    code, out, err, *_ = run_eval(problem, "test", extra=[str(tests)])
    assert code == 113 and needle in err and "bad.txt" in err


@pytest.mark.parametrize("content,needle", [
    ("tests: [\n", "not valid YAML"),
    ("- 1\n", "top level"),
    ("test_timeout: 5\nbenchmark_timeout: 5\nranked_timeout: 5\ntests: []\nbenchmarks: [{seed: 1}]\n", "`tests`"),
    ("test_timeout: 0\nbenchmark_timeout: 5\nranked_timeout: 5\ntests: [{seed: 1}]\nbenchmarks: [{seed: 1}]\n",
     "test_timeout"),
])
def test_malformed_task_yml_exits_113(problem, tmp_path, content, needle):
    d = tmp_path / "p"
    shutil.copytree(problem, d)
    (d / "task.yml").write_text(content)
    code, out, err, *_ = run_eval(d, "test")
    assert code == 113 and needle in err and "task.yml" in err


def test_bad_popcorn_fd_exits_111(problem):
    code, out, err, *_ = run_eval(problem, "test", env={"POPCORN_FD": "987"})
    assert code == 111 and "POPCORN_FD" in err


def test_help_explains_modes():
    out = subprocess.run([sys.executable, str(ROOT / "eval.py"), "--help"], capture_output=True, text=True).stdout
    for word in ("test", "benchmark", "leaderboard", "profile", "POPCORN_FD", "task.yml"):
        assert word in out
