"""eval.py end to end, in subprocesses, on small shapes: every mode, human and POPCORN_FD output,
malformed definitions, bad submissions, and the hostile set in tests/submissions/ (each one must fail,
with a message naming what was caught, or be measured honestly). The judge's modules have their own tests
beside this file (test_worker.py, test_process.py, test_timing.py, test_stats.py, test_modes.py)."""
import base64
import math
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import eval as cli
import judge_modes
import judge_process
import judge_report
import judge_stats
import judge_timing

ROOT = Path(__file__).resolve().parents[2]
SUBMISSIONS = Path(__file__).resolve().parents[1] / "submissions"
CUDA = torch.cuda.is_available()
SMALL_CASES = [
    '{"batchsize": 2, "qseqlen": 1, "kvseqlen": 65, "seed": 11}',
    '{"batchsize": 3, "qseqlen": 2, "kvseqlen": 20, "ragged": 1, "seed": 12}',
]

# Small bad submissions; the hostile and honest ones are files in tests/submissions/.
INLINE = {
    "raises": "def custom_kernel(data):\n    raise RuntimeError('kernel exploded')\n",
    "writes_its_compile_cache": "import os\nfrom reference import ref_kernel\n"
                                "def custom_kernel(data):\n"
                                "    with open(os.path.join(os.environ['TRITON_CACHE_DIR'], 'kernel.bin'), 'w') as f:\n"
                                "        f.write('compiled')\n"
                                "    return ref_kernel(data)\n",
    "raises_a_flood": "def custom_kernel(data):\n    raise RuntimeError('flood of text\\n' * 150_000)\n",
    "garbage": "import torch\ndef custom_kernel(data):\n"
               "    return torch.zeros(data[0].shape[0], 16, 512, dtype=torch.bfloat16, device=data[0].device)\n",
    "wrong_shape": "import torch\ndef custom_kernel(data):\n    return torch.zeros(3, dtype=torch.bfloat16)\n",
    "not_a_tensor": "def custom_kernel(data):\n    return [1, 2, 3]\n",
    "crashes": "import os\ndef custom_kernel(data):\n    os._exit(3)\n",
    "hangs": "import time\ndef custom_kernel(data):\n    time.sleep(3600)\n",
    "killed": "import os, signal\ndef custom_kernel(data):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    # honest_bf16 and then 4 ms of busy waiting: compare mode must tell it is slower
    "slowed": "import time\nfrom reference import ref_kernel\ndef custom_kernel(data):\n    out = ref_kernel(data)\n"
              "    end = time.perf_counter() + 0.004\n    while time.perf_counter() < end:\n        pass\n    return out\n",
    "no_kernel": "x = 1\n",
    # Right only while its worker runs at nice 19 and cannot raise its priority again.
    "checks_its_priority": textwrap.dedent("""
        import os
        from reference import ref_kernel
        def custom_kernel(data):
            try:
                os.setpriority(os.PRIO_PROCESS, 0, 0)
                lowered = False
            except PermissionError:
                lowered = True
            out = ref_kernel(data)
            return out if lowered and os.getpriority(os.PRIO_PROCESS, 0) == 19 else out * 0
        """),
    "wrong_first": "import torch\nfrom reference import ref_kernel\ndef custom_kernel(data):\n"
                   "    return torch.zeros_like(ref_kernel(data)) if data[4]['batch_size'] == 2 else ref_kernel(data)\n",
    # Returns the first output it computed for a shape on every later call with that shape.
    "caches": textwrap.dedent("""
        from reference import ref_kernel
        _seen = {}
        def custom_kernel(data):
            key = tuple(data[0].shape)
            if key not in _seen:
                _seen[key] = ref_kernel(data)
            return _seen[key]
        """),
}


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    """A copy of the problem with small cases and short time limits, holding every submission."""
    d = tmp_path_factory.mktemp("problem")
    for name in ("reference.py", "task.py"):
        shutil.copy(ROOT / name, d / name)
    cases = "\n".join(f"  - {c}" for c in SMALL_CASES)
    (d / "task.yml").write_text(
        f"test_timeout: 60\nbenchmark_timeout: 60\nranked_timeout: 60\ntests:\n{cases}\nbenchmarks:\n{cases}\n")
    for name, text in INLINE.items():
        (d / f"{name}.py").write_text(text)
    for path in SUBMISSIONS.glob("*.py"):
        shutil.copy(path, d / path.name)
    return d


@pytest.fixture(scope="module")
def one_case(tmp_path_factory):
    tests = tmp_path_factory.mktemp("cases") / "one.txt"
    tests.write_text("batchsize: 2; qseqlen: 1; kvseqlen: 65; seed: 11\n")
    return str(tests)


@pytest.fixture(scope="module")
def two_cases(tmp_path_factory):
    tests = tmp_path_factory.mktemp("cases") / "two.txt"
    tests.write_text("batchsize: 2; qseqlen: 1; kvseqlen: 65; seed: 11\n"
                     "batchsize: 3; qseqlen: 2; kvseqlen: 20; ragged: 1; seed: 12\n")
    return str(tests)


@pytest.fixture(scope="module")
def three_cases(tmp_path_factory):
    tests = tmp_path_factory.mktemp("cases") / "three.txt"
    tests.write_text("batchsize: 2; qseqlen: 1; kvseqlen: 65; seed: 11\n"
                     "batchsize: 3; qseqlen: 2; kvseqlen: 20; ragged: 1; seed: 12\n"
                     "batchsize: 2; qseqlen: 1; kvseqlen: 40; seed: 13\n")
    return str(tests)


def run_eval(problem, mode, submission="honest_bf16", extra=(), popcorn=False, env=None, timeout=300,
             at_last_line=None):
    """Runs eval.py; returns (exit code, stdout, stderr, POPCORN_FD lines as a dict, and as a list). submission: a
    file's name in the problem folder, or a Path.
    at_last_line: called once the judge has closed POPCORN_FD (its last result line), while it may still run."""
    path = submission if isinstance(submission, Path) else problem / f"{submission}.py"
    cmd = [sys.executable, str(ROOT / "eval.py"), mode, *extra, "--problem", str(problem), "--submission", str(path)]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("POPCORN_")}, **(env or {})}
    fds, read_fd = (), None
    if popcorn:
        read_fd, write_fd = os.pipe()
        env["POPCORN_FD"] = str(write_fd)
        fds = (write_fd,)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, pass_fds=fds)
    lines = []
    try:
        if popcorn:  # read in a thread, so that a judge that never closes the descriptor fails, not hangs
            os.close(write_fd)

            def read_all():
                with os.fdopen(read_fd) as f:
                    lines.extend(f.read().splitlines())

            reader = threading.Thread(target=read_all, daemon=True)
            reader.start()
            reader.join(timeout)
            assert not reader.is_alive(), f"eval.py kept POPCORN_FD open past {timeout} s"
            if at_last_line is not None:
                at_last_line()
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    log = dict(line.split(": ", 1) for line in lines if ": " in line)
    return proc.returncode, out, err, log, lines


def report_lines(out: str) -> list[str]:
    """The judge's own stdout lines (the submission's output is relayed with a prefix)."""
    return [line for line in out.splitlines() if not re.match(r"\s+(submission|null)> ", line)]


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


def test_a_killed_judge_leaves_no_worker_running(problem):
    """A runner that kills eval.py (SIGKILL, past its time limit) gives it no chance to clean up: the
    judge's warden kills the workers' process groups and removes the sandboxes."""
    cmd = [sys.executable, str(ROOT / "eval.py"), "test", "--problem", str(problem),
           "--submission", str(problem / "outlives_a_killed_judge.py")]
    judge = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line, give_up = "", time.monotonic() + 60
    while "submission> pids" not in line and time.monotonic() < give_up:
        if select.select([judge.stdout], [], [], 1)[0]:
            line = judge.stdout.readline()
    judge.kill()
    judge.wait()
    judge.stdout.close()
    worker, child, sandbox = line.split("pids", 1)[1].split()

    def running(pid):
        state = Path(f"/proc/{pid}/stat")
        return state.exists() and state.read_text().rsplit(")", 1)[1].split()[0] != "Z"

    give_up = time.monotonic() + 10
    while (running(worker) or running(child) or Path(sandbox).exists()) and time.monotonic() < give_up:
        time.sleep(0.1)
    assert not running(worker) and not running(child), "a worker outlived the judge"
    assert not Path(sandbox).exists(), "the sandbox outlived the judge"


def test_a_change_to_the_metadata_of_the_judges_files_fails_the_run(problem, tmp_path, one_case):
    d = tmp_path / "p"
    shutil.copytree(problem, d)
    target = d / "reference.py"
    code, out, err, log, _ = run_eval(d, "test", submission="changes_the_judges_file_modes", extra=[one_case],
                                      popcorn=True, env={"HOSTILE_TARGET": str(target)})
    assert "submission>" not in out, out + err  # its changes went through (and were put back)
    assert code == 112 and log["check"] == "fail", out + err
    assert f"these files of the judge changed during the run: {target}" in out, out + err


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


# ---------------------------------------------------------------------------------------------
# Hostile submissions: correctness faked from inside the submission's process
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("submission", [
    "fakes_check_through_sys_modules",
    "fakes_check_by_tolerances",
    "fakes_check_by_tensor_ops",
    "fakes_check_by_subclass",
    "fakes_check_by_rewriting_inputs",
])
def test_a_check_faked_in_the_submissions_process_fails(problem, one_case, submission):
    for mode in ("test", "leaderboard"):
        code, out, err, log, _ = run_eval(problem, mode, submission=submission, extra=[one_case], popcorn=True)
        assert code == 112 and log["check"] == "fail", out + err
        error = log["test.0.error" if mode == "test" else "benchmark.0.error"]
        assert "none of the caches" in error, error


def test_ranked_inputs_cannot_be_predicted(problem, one_case):
    code, out, err, log, _ = run_eval(problem, "leaderboard", submission="fakes_check_by_predicting_seeds",
                                      extra=[one_case], popcorn=True)
    assert code == 112, out + err
    assert "timed call 0" in log["benchmark.0.error"] and "none of the caches" in log["benchmark.0.error"]


# ---------------------------------------------------------------------------------------------
# Hostile submissions: times faked from inside the submission's process
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("submission", [
    pytest.param("fakes_time_by_slow_clock", marks=pytest.mark.skipif(CUDA, reason="the CPU path's clock")),
    "fakes_time_by_patching_the_report"])
@pytest.mark.parametrize("mode", ["benchmark", "leaderboard"])
def test_a_faked_time_fails_against_the_judges_clock(problem, one_case, submission, mode):
    code, out, err, log, _ = run_eval(problem, mode, submission=submission, extra=[one_case], popcorn=True)
    assert code == 112, out + err
    assert "below what the judge's clock allows" in log["benchmark.0.error"], log["benchmark.0.error"]


def test_timing_code_patched_in_the_submissions_process_changes_nothing(problem, one_case):
    honest = run_eval(problem, "benchmark", submission="honest_bf16", extra=[one_case], popcorn=True)[3]
    code, out, err, log, _ = run_eval(problem, "benchmark", submission="fakes_time_by_patching_stats",
                                      extra=[one_case], popcorn=True)
    assert code == 0, out + err
    # The statistics are the judge's: the same order of time as the honest run, not zero.
    assert float(log["benchmark.0.mean"]) > 0.3 * float(honest["benchmark.0.mean"])


@pytest.fixture(scope="module")
def honest_leaderboard(problem, one_case):
    """POPCORN lines of honest_bf16's leaderboard run on one_case: the work, reported honestly."""
    return run_eval(problem, "leaderboard", submission="honest_bf16", extra=[one_case], popcorn=True)[3]


@pytest.mark.parametrize("submission,extra_ns", [
    ("reports_a_tiny_time", 0.0),
    ("hides_work_in_rare_calls", 100e6 / 20),
    ("inflates_the_null_baseline_on_the_cpu", 0.0),
    ("floods_the_relay_after_a_stop", 0.0),
])
def test_a_time_faked_inside_the_cpus_margin_gains_nothing(problem, one_case, honest_leaderboard, submission, extra_ns):
    """On the CPU the judge ranks its own clock less the null's overhead (measured with the submission's
    processes stopped), so a report faked by less than the CPU's margin, or on the calls the check leaves
    out, or behind a baseline the submission slows, gains nothing against the same work reported
    honestly (run in the same session)."""
    if CUDA:
        pytest.skip("the CPU path's ranking; on a GPU, test_gpu_time_faked_in_the_submissions_process_gains_nothing")
    honest = float(honest_leaderboard["benchmark.0.mean"])
    code, out, err, log, _ = run_eval(problem, "leaderboard", submission=submission, extra=[one_case], popcorn=True)
    if code == 112:
        assert log["benchmark.0.status"] == "fail", out + err
    else:
        assert code == 0, out + err
        ranked = float(log["benchmark.0.mean"])
        for _ in range(2):  # on a loaded machine one process of a file can read twice another's: time it anew
            if ranked >= 0.7 * honest + 0.7 * extra_ns:
                break
            again = run_eval(problem, "leaderboard", submission="honest_bf16", extra=[one_case], popcorn=True)[3]
            honest = min(honest, float(again["benchmark.0.mean"]))
        assert ranked >= 0.7 * honest + 0.7 * extra_ns, f"{ranked:.0f} ns against honest {honest:.0f} ns\n" + out + err


def test_one_stalled_call_moves_the_cpus_ranking_by_nothing(problem, one_case, honest_leaderboard):
    """One call stalled 0.3 s on the host (stalls_one_call, on the CPU) would add 3 ms to a mean of 100 calls
    (several times the CPU's run-to-run spread); the slowest 1 % of a case's calls are left out."""
    if CUDA:
        pytest.skip("the CPU path; on a GPU, test_the_shipped_fast_path_cannot_shade_its_ranked_time")
    code, out, err, log, _ = run_eval(problem, "leaderboard", submission="stalls_one_call", extra=[one_case],
                                      popcorn=True)
    assert code == 0 and int(log["benchmark.0.slowest"]) >= 1, out + err
    assert float(log["benchmark.0.mean"]) < float(honest_leaderboard["benchmark.0.mean"]) + 1e6, out + err


@pytest.mark.parametrize("mode", ["test", "leaderboard"])
def test_an_output_finished_after_the_call_returned_fails(problem, one_case, mode):
    code, out, err, log, _ = run_eval(problem, mode, submission="fakes_output_from_a_thread", extra=[one_case],
                                      popcorn=True)
    assert code == 112 and log["check"] == "fail"
    assert "none of the caches" in log["test.0.error" if mode == "test" else "benchmark.0.error"]


# ---------------------------------------------------------------------------------------------
# Hostile submissions: the result stream and the judge's process
# ---------------------------------------------------------------------------------------------
def _assert_no_forged_results(lines, out):
    assert lines.count("check: fail") == 1 and "check: pass" not in lines, lines
    assert not any(line.startswith("LEAK") or "LEAK:" in line for line in out.splitlines()), out


def test_the_runners_descriptor_is_out_of_reach(problem, one_case):
    code, out, err, log, lines = run_eval(problem, "test", submission="forges_results_through_descriptors",
                                          extra=[one_case], popcorn=True)
    assert code == 112
    _assert_no_forged_results(lines, out)


def test_a_detached_daemon_is_gone_before_the_last_result_line(problem, one_case):
    code, out, err, log, lines = run_eval(problem, "test", submission="forges_results_from_a_daemon",
                                          extra=[one_case], popcorn=True)
    assert code == 112
    _assert_no_forged_results(lines, out)
    pids = [int(m) for m in re.findall(r"DAEMON (\d+)", out)]
    assert pids, out
    for pid in pids:  # gone, or a zombie left to init
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    assert "2/2 tests passed" not in "\n".join(report_lines(out))


def test_the_submissions_output_cannot_pass_for_the_report(problem):
    code, out, err, log, _ = run_eval(problem, "test", submission="forges_the_summary_on_stdout", popcorn=True)
    assert code == 112 and log["check"] == "fail"
    ours = report_lines(out)
    assert "0/2 tests passed" in ours and "2/2 tests passed" not in ours
    assert "  submission> 2/2 tests passed" in out.splitlines()  # shown, but as the submission's


def test_the_judge_cannot_be_signalled_or_traced(problem, one_case):
    code, out, err, log, lines = run_eval(problem, "test", submission="attacks_the_judge_process",
                                          extra=[one_case], popcorn=True)
    assert "check: pass" not in lines
    if "no signals to it" in out:  # Landlock scopes signals on this kernel: the judge survives
        assert code == 112 and log["check"] == "fail"
        _assert_no_forged_results(lines, out)


def test_a_worker_that_closes_its_connection_and_lives_on_fails_as_the_submissions(problem, two_cases):
    code, out, err, log, _ = run_eval(problem, "test", submission="closes_its_socket_and_lingers",
                                      extra=[two_cases], popcorn=True)
    assert code == 112 and log["check"] == "fail", out + err
    for i in (0, 1):  # the second case in a new worker
        assert log[f"test.{i}.status"] == "fail" and "closed its connection" in log[f"test.{i}.error"], log
    assert "judge's own work" not in out and "Traceback" not in err, out + err


@pytest.mark.parametrize("submission", ["changes_the_judges_limits", "leaves_state_in_the_kernel"])
def test_what_seccomp_denies_the_worker_is_refused(problem, two_cases, submission):
    """Same-user calls that no path names, so Landlock does not rule them: setting the judge's limits (which
    killed it, or failed its checks) and its I/O priority; state left in the kernel for a later run."""
    code, out, err, log, lines = run_eval(problem, "test", submission=submission, extra=[two_cases], popcorn=True)
    assert code == 0 and log["check"] == "pass" and "check: pass" in lines[-2:], out + err
    if "seccomp:" in out:
        assert "LEAK" not in out and out.count("refused:") >= 3, out


def test_nothing_can_be_added_to_dev_but_its_devices_and_dev_shm_stay_writable(problem, one_case):
    code, out, err, log, _ = run_eval(problem, "test", submission="adds_files_to_dev", extra=[one_case], popcorn=True)
    assert code == 0 and log["check"] == "pass", out + err
    if "Landlock ABI" in out:
        devices = sum(os.path.exists(d) for d in ("/dev/kvm", "/dev/userfaultfd"))
        assert "LEAK" not in out and out.count("refused:") == 2 + devices and "wrote /dev/null and /dev/shm" in out, out


@pytest.mark.parametrize("mode", ["test", "profile"])
def test_the_submission_cannot_plant_code_in_the_judges_python(problem, one_case, mode):
    """Every mode is confined alike: no worker may add a .pth file to the interpreter's site-packages."""
    code, out, err, log, _ = run_eval(problem, mode, submission="plants_code_in_the_judges_python",
                                      extra=[one_case], popcorn=True)
    assert code == 0 and "refused: a .pth file" in out or "Landlock ABI" not in out, out + err
    if "Landlock ABI" in out:
        assert "LEAK" not in out, out


def test_the_judge_notices_its_pythons_start_up_files_change(tmp_path, monkeypatch):
    """FileGuard: a .pth file added to, or changed in, a folder of the module path during the run (code the
    judge's next run would start with) fails the run, named."""
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "kept.pth").write_text("/nowhere\n")
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    problem = tmp_path / "problem"
    problem.mkdir()
    guard = cli.FileGuard(problem)
    assert guard.changed() == []
    (site / "added.pth").write_text("import os\n")
    (site / "sitecustomize.py").write_text("print('started')\n")
    assert guard.changed() == sorted([str(site / "added.pth"), str(site / "sitecustomize.py")])
    (site / "added.pth").unlink()
    (site / "sitecustomize.py").unlink()
    (site / "kept.pth").write_text("import os\n")
    assert guard.changed() == [str(site / "kept.pth")]


def test_a_file_added_beside_the_judges_or_the_problems_modules_fails_the_run(tmp_path):
    """FileGuard: a module or compiled code added to the problem's folder or its __pycache__ during the run (one
    that shadows a module the judge imports, or a .pyc for the next run) fails it, named; the run's own --json
    there does not."""
    problem = tmp_path / "problem"
    problem.mkdir()
    (problem / "reference.py").write_text("x = 1\n")
    results = problem / "results.json"
    guard = cli.FileGuard(problem, ignore=results)
    results.write_text("{}")
    assert guard.changed() == []
    (problem / "yaml.py").write_text("raise SystemExit\n")
    (problem / "__pycache__").mkdir()
    (problem / "__pycache__" / "reference.cpython-311.pyc").write_bytes(b"planted")
    assert guard.changed() == sorted(str(p) for p in (problem / "__pycache__", problem / "yaml.py",
                                                       problem / "__pycache__" / "reference.cpython-311.pyc"))


def test_the_submission_cannot_raise_its_scheduling_groups_priority(problem, one_case):
    """nice 19 holds for the worker's whole session (sched_autogroup): its /proc/self/autogroup is out of its
    reach (Landlock), and the judge checks the worker's priority before every timed call."""
    code, out, err, log, _ = run_eval(problem, "leaderboard", submission="raises_its_priority_between_calls",
                                      extra=[one_case], popcorn=True)
    if "autogroup nice 19" not in out:
        pytest.skip("no sched_autogroup on this kernel")
    if "Landlock ABI" in out:
        assert code == 0 and "LEAK" not in out and "refused: autogroup" in out, out + err
    elif "LEAK" in out:  # the judge sees it at the next call
        assert code == 112 and "no longer confined" in out, out + err


def test_the_null_submissions_files_are_out_of_reach(problem, one_case):
    """The null worker runs from a sandbox of its own, which the submission's worker cannot rewrite where the
    worker is Landlock-confined."""
    code, out, err, _, _ = run_eval(problem, "benchmark", submission="rewrites_the_nulls_files", extra=[one_case])
    assert code == 0, out + err
    found = re.search(r"rewrote (\d+) of (\d+) other sandboxes", out)
    assert found and int(found.group(2)) >= 1, out  # the null's sandbox is there, beside the worker's
    if "Landlock ABI" in out:
        assert found.group(1) == "0", out


@pytest.mark.parametrize("mode", ["test", "benchmark"])
def test_shared_memory_truncated_by_the_submission_cannot_take_the_judge_down(problem, one_case, mode):
    """The regions the worker maps cannot be shrunk under the judge (sealed memfds on the CPU, IPC memory
    on a GPU): the run goes on to its report (test mode: from one case to the next)."""
    extra = [one_case] if mode == "benchmark" else []
    code, out, err, log, _ = run_eval(problem, mode, submission="truncates_the_shared_memory", extra=extra,
                                      popcorn=True)
    assert code == 0 and log.get("check") == "pass", out + err


def run_restarted(problem, three_cases, submission):
    """A test run of a submission built on restarts_its_worker: its first worker answers case 0 and exits
    when asked for case 1, which fails; case 2 runs in a worker the judge started afresh."""
    code, out, err, log, _ = run_eval(problem, "test", submission=submission, extra=[three_cases], popcorn=True)
    assert code == 112 and log.get("test.0.status") == "pass", out + err
    assert log.get("test.1.status") == "fail" and "died" in log.get("test.1.error", ""), out + err
    return log, out + err


def test_a_restarted_worker_runs_the_judges_code_not_what_the_last_one_left(problem, three_cases):
    """A worker that exits is started again; nothing its predecessor wrote (a script in its sandbox,
    sitecustomize, a .pth in its home) runs before the new one has confined itself."""
    log, text = run_restarted(problem, three_cases, "plants_code_for_its_next_start")
    assert log.get("test.2.status") == "pass", text


def test_a_truncated_release_flag_cannot_take_the_judge_down_when_it_restarts_a_worker(problem, three_cases):
    log, text = run_restarted(problem, three_cases, "truncates_the_release_flag")
    assert log.get("test.2.status") == "pass" and "test.2.error" not in log, text


def test_a_fork_chain_is_gone_before_the_last_result_line(problem, tmp_path):
    """A chain of processes that each fork and exit at once outruns a search of /proc; it cannot leave the
    worker's process group, which the judge kills as one."""
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm for the chain to write to")
    log = Path(tempfile.mkdtemp(dir="/dev/shm")) / "chain"
    try:
        code, out, err, _, _ = run_eval(problem, "test", submission="outlives_the_judge_by_a_fork_chain",
                                        env={"CHAIN_LOG": str(log)})
        assert code == 0, out + err
        time.sleep(1.0)  # a survivor sees the judge gone within microseconds
        text = log.read_text() if log.exists() else ""
        assert "started" in text and "survived" not in text, text
    finally:
        shutil.rmtree(log.parent, ignore_errors=True)


def test_text_from_the_submission_cannot_pass_for_the_report_or_break_it(problem, tmp_path):
    """An error whose message holds report lines, terminal escapes and a lone surrogate, output with
    carriage returns and escapes, and a reported time past float's range: every line of the submission's
    text is marked as its own and printable, the report goes on to its end, and the time fails its case
    as a bad report, not as the judge's own failure."""
    code, out, err, log, lines = run_eval(problem, "test", submission="forges_the_report_in_its_text", popcorn=True)
    assert code == 112 and log["check"] == "fail", out + err
    judge_lines = report_lines(out)
    assert not [line for line in judge_lines if "[PASS] test 0" in line or "2/2 tests passed" in line], out
    assert "\x1b" not in out and "\r" not in out and "\\x1b[8m" in out, out
    assert "\u2028" not in out and "\\u2028" in out, out
    assert log["test.0.error"].startswith("submission> RuntimeError: fake"), log
    assert log["test.1.status"] == "pass", log
    tests = tmp_path / "ragged.txt"
    tests.write_text("batchsize: 3; qseqlen: 2; kvseqlen: 20; ragged: 1; seed: 12\n")
    code, out, err, log, _ = run_eval(problem, "benchmark", submission="forges_the_report_in_its_text",
                                      extra=[str(tests)], popcorn=True)
    assert code == 112 and "judge's own work" not in log["benchmark.0.error"], out + err
    assert "time" in log["benchmark.0.error"], log


@pytest.mark.parametrize("mode", ["test", "leaderboard"])
def test_a_flood_of_error_text_is_cut(problem, mode, tmp_path):
    """A failing call's error of 2 MB (once printed whole: 27 MB of stdout for three cases) is cut to
    SUBMISSION_TEXT_LINES lines in the report, the JSON and the POPCORN lines, with a note."""
    out_json = tmp_path / "run.json"
    code, out, err, log, lines = run_eval(problem, mode, submission="raises_a_flood", popcorn=True,
                                          extra=["--json", str(out_json)])
    assert code == 112 and log["check"] == "fail", out[:4000] + err[-4000:]
    assert "(cut: the submission's text ran to" in out, out[:4000]
    cases = 1 if mode == "leaderboard" else len(SMALL_CASES)  # leaderboard stops at its first failed case
    limit = cases * (judge_report.SUBMISSION_TEXT_LINES + 20) * 200
    assert len(out) < limit and sum(map(len, lines)) < limit and out_json.stat().st_size < 2 * limit


def test_a_compile_cache_the_runner_names_is_not_the_workers(problem, one_case, tmp_path):
    """Whatever TRITON_CACHE_DIR names, a worker compiles into its sandbox's cache: one the runner names that
    does not exist yet cannot leave the submission unable to compile (Landlock lets a worker write only under
    folders that exist), and what one run's worker leaves there is never loaded by a later run's."""
    (problem / "plants_in_the_cache.py").write_text(
        "import os\nfrom reference import ref_kernel\ndef custom_kernel(data):\n"
        "    open(os.path.join(os.environ['TRITON_CACHE_DIR'], 'planted'), 'w').close()\n    return ref_kernel(data)\n")
    (problem / "finds_a_planted_kernel.py").write_text(
        "import os\nfrom reference import ref_kernel\ndef custom_kernel(data):\n"
        "    out = ref_kernel(data)\n"
        "    return out * 0 if os.path.exists(os.path.join(os.environ['TRITON_CACHE_DIR'], 'planted')) else out\n")
    cache = tmp_path / "fresh" / "triton-cache"
    for submission in ("writes_its_compile_cache", "plants_in_the_cache", "finds_a_planted_kernel"):
        code, out, err, log, _ = run_eval(problem, "test", submission=submission, extra=[one_case], popcorn=True,
                                          env={"TRITON_CACHE_DIR": str(cache)})
        assert code == 0 and log["check"] == "pass", out + err
    cache.mkdir(parents=True)  # a cache that exists is not the worker's either
    for submission in ("plants_in_the_cache", "finds_a_planted_kernel"):
        code, out, err, log, _ = run_eval(problem, "test", submission=submission, extra=[one_case], popcorn=True,
                                          env={"TRITON_CACHE_DIR": str(cache)})
        assert code == 0 and log["check"] == "pass", out + err
    assert not any(cache.iterdir())


def test_a_runners_openmp_pinning_does_not_stop_the_worker(problem, one_case):
    """OpenMP pins its threads by thread id, which the seccomp filter refuses (it cannot tell them from another
    process's): the worker does not inherit the runner's pinning, so its threads still start."""
    (problem / "uses_two_threads.py").write_text(
        "import torch\nfrom reference import ref_kernel\ndef custom_kernel(data):\n"
        "    torch.set_num_threads(2)\n    torch.randn(256, 256) @ torch.randn(256, 256)\n"
        "    return ref_kernel(data)\n")
    code, out, err, log, _ = run_eval(problem, "test", submission="uses_two_threads", extra=[one_case], popcorn=True,
                                      env={"OMP_PROC_BIND": "true", "OMP_PLACES": "cores", "GOMP_CPU_AFFINITY": "0-1"})
    assert code == 0 and log["check"] == "pass", out + err


def test_torch_compiles_cache_is_the_sandboxes_whatever_the_runner_names(problem, one_case, tmp_path):
    """A TORCHINDUCTOR_CACHE_DIR the runner names (here one that does not exist) is neither what the worker
    must write nor where a later run finds what this one compiled: the worker's is in its sandbox."""
    (problem / "writes_the_inductor_cache.py").write_text(
        "import os\nfrom pathlib import Path\nfrom reference import ref_kernel\ndef custom_kernel(data):\n"
        "    d = Path(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n    d.mkdir(parents=True, exist_ok=True)\n"
        "    (d / 'kernel.py').write_text('compiled')\n    assert d.resolve().is_relative_to(Path.cwd().resolve())\n"
        "    return ref_kernel(data)\n")
    runner_cache = tmp_path / "not" / "made"
    code, out, err, log, _ = run_eval(problem, "test", submission="writes_the_inductor_cache", extra=[one_case],
                                      popcorn=True, env={"TORCHINDUCTOR_CACHE_DIR": str(runner_cache)})
    assert code == 0 and log["check"] == "pass" and not runner_cache.exists(), out + err


def test_results_that_cannot_be_written_still_end_in_a_verdict(problem, one_case, tmp_path):
    """The --json file on a filesystem that fails the write (full, or here a folder that is not there): the
    run says so and fails on POPCORN_FD, with no traceback and no partial file."""
    target = tmp_path / "missing" / "run.json"
    code, out, err, log, _ = run_eval(problem, "test", extra=[one_case, "--json", str(target)], popcorn=True)
    assert code == 112 and log["check"] == "fail" and "could not be written" in out, out + err
    assert "Traceback" not in err and not target.exists(), err


def _verdict_of(cmd, env, on_header=None, timeout=120):
    """Runs a judge command line with POPCORN_FD; on_header(proc) once it has printed its `worker:` line.
    Returns (exit code, stdout, stderr, POPCORN_FD lines as a dict)."""
    read_fd, write_fd = os.pipe()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("POPCORN_")}, **env, "POPCORN_FD": str(write_fd)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            pass_fds=(write_fd,))
    os.close(write_fd)
    try:
        out = []
        for line in proc.stdout:
            out.append(line)
            if on_header is not None and line.startswith("worker:"):
                on_header(proc)
        err = proc.stderr.read()
        proc.wait(timeout=timeout)
        with os.fdopen(read_fd) as f:
            log = dict(line.split(": ", 1) for line in f.read().splitlines() if ": " in line)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, "".join(out), err, log


def test_a_stopped_run_still_ends_in_a_verdict(problem, one_case, tmp_path):
    """SIGTERM (a runner's limit) mid-run: the judge ends its workers, removes its sandboxes and says
    `check: fail` with the reason, exit 115."""
    cmd = [sys.executable, str(ROOT / "eval.py"), "test", one_case, "--problem", str(problem), "--submission",
           str(problem / "hangs.py")]
    code, out, err, log = _verdict_of(cmd, {"TMPDIR": str(tmp_path)},
                                      on_header=lambda proc: (time.sleep(1), proc.send_signal(signal.SIGTERM)))
    assert code == cli.EXIT_STOPPED and log["check"] == "fail" and "SIGTERM" in log["error"], out + err
    assert "Traceback" not in err and not list(tmp_path.glob("eval-sandbox-*")), err


def test_the_judges_own_failure_still_ends_in_a_verdict(problem, one_case):
    """An exception in the judge's own code (here planted in its test loop) fails the run with the reason on
    POPCORN_FD, exit 114, and the traceback on stderr for whoever maintains the judge."""
    script = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import eval\n"
              "def broken(*a, **k): raise RuntimeError('planted fault')\n"
              "eval.run_tests = broken\nsys.exit(eval.main(sys.argv[1:]))\n")
    cmd = [sys.executable, "-c", script, str(ROOT), "test", one_case, "--problem", str(problem), "--submission",
           str(problem / "honest_bf16.py")]
    code, out, err, log = _verdict_of(cmd, {})
    assert code == cli.EXIT_JUDGE_ERROR and log["check"] == "fail", out + err
    assert "planted fault" in log["error"] and "RuntimeError: planted fault" in err, out + err


def test_malformed_messages_fail_as_the_submissions(problem):
    code, out, err, log, _ = run_eval(problem, "test", submission="sends_malformed_messages", popcorn=True)
    assert code == 112 and log["check"] == "fail", out + err
    for i in (0, 1):
        assert log[f"test.{i}.status"] == "fail" and "judge's own work" not in log[f"test.{i}.error"], log
    assert "Traceback" not in err, err


def test_the_timing_loop_ends_on_what_is_ranked_not_on_a_report(problem, one_case):
    if CUDA:
        pytest.skip("on a GPU, reports are what is ranked: one of 31 s ranks 31 s")
    code, out, err, log, _ = run_eval(problem, "leaderboard", submission="ends_the_timing_loop_when_it_likes",
                                      extra=[one_case], popcorn=True)
    if code == 112:  # its report of 31 s is far from what the judge's clock saw
        assert "cannot be trusted" in log["benchmark.0.error"], out + err
    else:  # or it ran the whole loop (its slowest calls left out of the statistics)
        runs = int(log["benchmark.0.runs"]) + int(log["benchmark.0.slowest"])
        assert code == 0 and runs == judge_modes.RANKED_MAX_REPEATS, out + err


def test_an_answer_sent_ahead_of_its_call_fails(problem, one_case):
    """A second "done" sent with each timed call's answers the next call the moment it is made (the judge's
    clock stopped before the call began: 0.00 us ranked on the CPU): it carries the wrong ticket."""
    if CUDA:
        pytest.skip("the hostile replaces the CPU path's timed call")
    code, out, err, log, _ = run_eval(problem, "benchmark", submission="answers_before_it_is_asked",
                                      extra=[one_case], popcorn=True)
    assert code == 112 and log["check"] == "fail", out + err
    assert "answers no request the judge is waiting on" in log["benchmark.0.error"], out + err


def test_the_last_result_line_does_not_wait_for_the_sandbox_to_go(problem, one_case, tmp_path):
    """The sandbox is removed after the last result line: a submission that fills it with entries slow to
    remove cannot hold the report back (past the runner's time limit, which kills the judge with it)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    sandboxes_at_the_last_line = []
    code, out, err, log, _ = run_eval(
        problem, "test", submission="fills_its_sandbox_with_links", extra=[one_case], popcorn=True,
        env={"TMPDIR": str(tmp)},
        at_last_line=lambda: sandboxes_at_the_last_line.extend(p for p in tmp.glob("eval-sandbox-*")
                                                               if (p / "links").exists()))
    assert code == 0 and log["check"] == "pass", out + err
    assert sandboxes_at_the_last_line, "the sandbox was removed before the last result line"
    assert not list(tmp.glob("eval-sandbox-*")), "the sandbox outlived the run"


def test_a_sandbox_too_deep_for_shutil_is_still_removed(problem, one_case):
    code, out, err, log, _ = run_eval(problem, "test", submission="leaves_a_deep_tree", extra=[one_case], popcorn=True)
    assert code == 0 and log["check"] == "pass", out + err
    sandbox = re.search(r"SANDBOX (\S+)", out).group(1)
    assert not Path(sandbox).exists(), sandbox


def test_the_judges_own_work_failing_fails_the_case_not_the_run(problem, tmp_path):
    """An exception in the judge's own work on a case (here its input runs out of memory, as on a GPU whose
    memory the submission's processes hold) fails that case, saying so; the run goes on to its report."""
    d = tmp_path / "p"
    shutil.copytree(problem, d)
    with open(d / "reference.py", "a") as f:
        f.write("\n_generate = generate_input\n\n\ndef generate_input(**args):\n    if args['seed'] == 12:\n"
                "        raise MemoryError('simulated')\n    return _generate(**args)\n")
    code, out, err, log, _ = run_eval(d, "test", popcorn=True)
    assert code == 112 and log["check"] == "fail", out + err
    assert log["test.0.status"] == "pass" and log["test.1.status"] == "fail", out + err
    assert log["test.1.error"].startswith("the judge's own work on this case failed: MemoryError"), out + err
    assert "Traceback" not in err, err


def test_the_submission_runs_at_the_lowest_priority_for_good(problem, one_case):
    """Work a submission starts between its calls (burning every core while the null submission is
    timed, to inflate the baseline its own times are checked against) runs at nice 19, under the judge."""
    code, out, err, log, _ = run_eval(problem, "test", submission="checks_its_priority", extra=[one_case], popcorn=True)
    assert code == 0 and log["check"] == "pass", out + err


def test_the_judges_files_cannot_be_rewritten(problem, one_case, tmp_path):
    d = tmp_path / "p"
    shutil.copytree(problem, d)
    before = (d / "reference.py").read_bytes()
    code, out, err, log, lines = run_eval(d, "test", submission="tampers_with_the_judge_files", extra=[one_case],
                                          popcorn=True)
    assert code == 112 and log["check"] == "fail"
    if "Landlock" in out:
        assert (d / "reference.py").read_bytes() == before
        _assert_no_forged_results(lines, out)
    else:  # without Landlock the judge at least notices
        assert "files of the judge changed" in out


# ---------------------------------------------------------------------------------------------
# On a GPU: the hold, the device clock and the hostile GPU submissions
# ---------------------------------------------------------------------------------------------
# What each GPU hostile's call costs on the GPU at the least: async_attention's spin, or the side
# stream's sleep.
TRUE_WORK_NS = {"fakes_time_on_a_side_stream": 1.0e6}
# The most the copy-engine head start may gain (A/B of the shipped submission against itself with it):
# docs/judge.md states up to ~9 % on inputs that fit in L2.
COPY_ENGINE_HEAD_START = 1.12


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("submission", [
    "fakes_time_by_elapsed_time",
    "fakes_time_by_idle_stream_events",
    "fakes_time_by_rerecording_start",
    "fakes_time_on_a_side_stream",
    "turns_the_cuda_flag_off",
    "skips_the_hold",
    "computes_before_the_release",
    "computes_between_the_holds",
    "inflates_the_null_baseline",
])
@pytest.mark.parametrize("mode", ["benchmark", "leaderboard"])
def test_gpu_time_faked_in_the_submissions_process_gains_nothing(problem, one_case, submission, mode):
    """The case fails, or what is ranked is no less than the work's own GPU time (a call that waits on the
    host long enough is timed on the judge's clock as it ran, and its report counts for nothing)."""
    code, out, err, log, _ = run_eval(problem, mode, submission=submission, extra=[one_case], popcorn=True)
    if code == 112:
        assert log["benchmark.0.status"] == "fail", out + err
    else:
        assert code == 0, out + err
        assert float(log["benchmark.0.mean"]) >= 0.85 * TRUE_WORK_NS.get(submission, 0.2e6), out + err


# The shipped fast paths on their shortest benchmark cases, where a report could once take most of a call off.
KITS = {"mla": (ROOT, "batchsize: 4; qseqlen: 1; kvseqlen: 1024; seed: 4217\n"
                      "batchsize: 32; qseqlen: 1; kvseqlen: 1024; seed: 5412\n"),
        "paged": (ROOT / "problems" / "paged_mqa_logits", "batch: 256; next_n: 1; context: 1024; random: 1; seed: 5001\n")}


@pytest.fixture(scope="module")
def shipped_runs(tmp_path_factory):
    """Per kit: its short cases' tests file and the shipped submission's leaderboard means (ns) on them."""
    runs = {}
    for kit, (problem, cases) in KITS.items():
        tests = tmp_path_factory.mktemp("cases") / f"{kit}.txt"
        tests.write_text(cases)
        code, out, err, log, _ = run_eval(problem, "leaderboard", submission=problem / "submission.py",
                                          extra=[str(tests)], popcorn=True)
        assert code == 0, out + err
        runs[kit] = (tests, [float(log[f"benchmark.{i}.mean"]) for i in range(int(log["benchmark-count"]))])
    return runs


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("kit", list(KITS))
@pytest.mark.parametrize("hostile,expect", [
    ("forges_short_reports", "fails"),
    ("signals_its_output_early", "fails"),
    ("fits_its_output_to_an_early_digest", "fails"),
    ("shaves_its_reports", "within the band"),
    ("reports_a_stalled_call", "as honest"),
    ("stalls_one_call", "as honest"),
])
def test_the_shipped_fast_path_cannot_shade_its_ranked_time(shipped_runs, tmp_path, kit, hostile, expect):
    """The hostile appended to the shipped submission, in leaderboard mode, against the shipped submission's own
    run: a forged report fails the run (a quarter reported passes on MLA 4 x 1024, where the band cannot see
    it, and fails on 32 x 1024: docs/judge.md, "The band"), or is ranked within max(1 us, 5 %) of honest; a
    shave under the band gains no more than the band; a stall of one call, on either clock, moves the mean by
    a few per cent at most (1 % by rule; the rest is two runs' spread)."""
    problem, _ = KITS[kit]
    tests, honest = shipped_runs[kit]
    submission = tmp_path / "submission.py"
    submission.write_text((problem / "submission.py").read_text() + "\n\n" + (SUBMISSIONS / f"{hostile}.py").read_text())
    code, out, err, log, _ = run_eval(problem, "leaderboard", submission=submission, extra=[str(tests)], popcorn=True)
    print(f"{kit} {hostile}: exit {code}, means {[log.get(f'benchmark.{i}.mean') for i in range(len(honest))]} "
          f"(shipped {honest}), {[log.get(f'benchmark.{i}.error', '')[:160] for i in range(len(honest))]}")
    if expect == "fails" and code == 112:  # on the band, the memory floor, a timed call's output checked wrong
        errors = [log.get(f"benchmark.{i}.error", "") for i in range(len(honest))]  # or signalled before it was
        assert log["check"] == "fail" and any(
            "below what the judge's clock allows" in e or "under the memory floor" in e or e.startswith("timed call")
            or "output staged before it was" in e for e in errors), out + err
        return
    assert code == 0, out + err
    means = [float(log[f"benchmark.{i}.mean"]) for i in range(len(honest))]
    for mean, base in zip(means, honest):
        if expect == "fails":
            assert mean >= base - max(1e3, 0.05 * base), out
        elif expect == "within the band":
            assert mean >= base - judge_stats.BANDS["cuda"].at(base), out
        else:
            assert abs(mean / base - 1) < 0.03, out


@pytest.fixture(scope="module")
def l2_sized_case(tmp_path_factory):
    """A case whose fp8 cache (19 MB) fits in the H200's 60 MB L2: what a copy-engine head start could warm."""
    tests = tmp_path_factory.mktemp("cases") / "l2.txt"
    tests.write_text("batchsize: 4; qseqlen: 1; kvseqlen: 8192; seed: 11\n")
    return str(tests)


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("prefetch", ["copy", "read"])
def test_a_prefetch_head_start_stays_within_its_bound(l2_sized_case, tmp_path, prefetch):
    """The one head start the judge cannot stop (docs/judge.md): the inputs read into L2 the moment they
    are written, by a copy engine or by a kernel on another stream (which may start once the full-SM hold
    has let go). Against the shipped submission, on an input that fits in L2 (its best case), what it
    gains stays within the bound the docs state, or the judge's clock sees the side work beside the call
    and fails the case (the read of a kernel on another stream, measured on the H200)."""
    tool = tmp_path / "prefetch.py"
    tool.write_text((ROOT / "tools" / "copy_engine_prefetch.py").read_text().replace(
        'PREFETCH = "copy"', f'PREFETCH = "{prefetch}"'))
    cmd = [sys.executable, str(ROOT / "eval.py"), "compare", str(ROOT / "submission.py"), str(tool), l2_sized_case]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if run.returncode == 112 and "below what the judge's clock allows" in run.stdout:
        assert "B: the times reported" in run.stdout, run.stdout  # caught in B, the prefetching side
        return
    assert run.returncode == 0, run.stdout + run.stderr
    ratio = float(re.search(r"geometric mean of A/B over the cases: ([0-9.]+)", run.stdout).group(1))
    assert ratio <= COPY_ENGINE_HEAD_START, run.stdout


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("mode", ["test", "leaderboard"])
def test_output_finished_on_a_side_stream_fails(problem, mode):
    code, out, err, log, _ = run_eval(problem, mode, submission="side_stream_unjoined", popcorn=True)
    assert code == 112, out + err
    key = "test.0.error" if mode == "test" else "benchmark.0.error"
    assert "changed after custom_kernel returned" in log[key]


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_an_asynchronous_submission_is_timed_on_the_device_clock(problem, one_case):
    code, out, err, log, _ = run_eval(problem, "leaderboard", submission="async_attention", extra=[one_case],
                                      popcorn=True)
    assert code == 0, out + err
    assert int(log["benchmark.0.early"]) == 0 and "on the judge's clock as they ran" not in out
    assert int(log["benchmark.0.late_holds"]) == 0, out  # its one-block hold ran each time (the judge waited on it)


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_a_submission_that_synchronises_is_timed_as_it_runs(problem, one_case):
    code, out, err, log, _ = run_eval(problem, "benchmark", submission="honest_bf16", extra=[one_case], popcorn=True)
    assert code == 0, out + err  # the reference reads indptr on the host: it waits on the GPU inside the call
    assert int(log["benchmark.0.early"]) == int(log["benchmark.0.runs"]) and "on the judge's clock as they ran" in out
    assert int(log["benchmark.0.late_holds"]) == 0, out


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_a_stream_left_blocked_by_a_child_process_neither_hangs_the_judge_nor_passes(problem, one_case):
    """A stream waiting forever in a process of the submission's can keep the judge's work off the GPU: the
    run still ends (the watchdog kills the submission's processes) with the case failed saying why, or, where
    the GPU does run the judge's work beside it, with the honest time."""
    code, out, err, log, _ = run_eval(problem, "leaderboard", submission="blocks_the_gpu_from_a_child",
                                      extra=[one_case], popcorn=True, timeout=240)
    if code == 112:
        assert "ran none of the judge's work" in log["benchmark.0.error"], out + err
    else:
        assert code == 0 and float(log["benchmark.0.mean"]) >= 0.85 * 0.2e6, out + err


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_a_submission_holding_the_gpus_memory_cannot_take_the_judge_down(problem):
    code, out, err, log, _ = run_eval(problem, "benchmark", submission="holds_the_gpu_memory", popcorn=True)
    assert code in (0, 112) and "check" in log and "Traceback" not in err, out + err


def test_compiled_code_planted_beside_the_judges_modules_is_never_loaded(tmp_path, one_case):
    """A .pyc beside a judge module or the problem's reference (what a worker that could write the judge's folder,
    under ncu with that folder in its temp one, could leave for the next run): the judge compiles its own and
    the problem's modules from source, so the planted code never runs."""
    import py_compile

    kit = tmp_path / "kit"
    kit.mkdir()
    for name in [*cli.HARNESS_FILES, "reference.py", "task.py", "task.yml"]:
        shutil.copy(ROOT / name, kit / name)
    shutil.copy(SUBMISSIONS / "honest_bf16.py", kit / "submission.py")
    for name in ("judge_stats", "reference"):
        planted = tmp_path / f"{name}.py"
        planted.write_text((kit / f"{name}.py").read_text() + "\nprint('PLANTED in the judge', flush=True)\n")
        cache = kit / "__pycache__" / f"{name}.{sys.implementation.cache_tag}.pyc"
        py_compile.compile(str(planted), cfile=str(cache), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    done = subprocess.run([sys.executable, str(kit / "eval.py"), "test", one_case], capture_output=True, text=True,
                          timeout=300, cwd=kit, env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    assert done.returncode == 0 and "PLANTED" not in done.stdout + done.stderr, done.stdout + done.stderr
