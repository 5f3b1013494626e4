"""eval.py end to end, in subprocesses, on small shapes: every mode, human and POPCORN_FD output,
malformed definitions, and submissions that raise, return garbage, crash, hang or cache outputs."""
import base64
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SMALL_CASES = [
    '{"batchsize": 2, "qseqlen": 1, "kvseqlen": 65, "seed": 11}',
    '{"batchsize": 3, "qseqlen": 2, "kvseqlen": 20, "ragged": 1, "seed": 12}',
]

SUBMISSIONS = {
    "good": "from reference import ref_kernel\ndef custom_kernel(data):\n    return ref_kernel(data)\n",
    "raises": "def custom_kernel(data):\n    raise RuntimeError('kernel exploded')\n",
    "garbage": "import torch\ndef custom_kernel(data):\n    return torch.zeros(data[0].shape[0], 16, 512, dtype=torch.bfloat16)\n",
    "crashes": "import os\ndef custom_kernel(data):\n    os._exit(3)\n",
    "hangs": "import time\ndef custom_kernel(data):\n    time.sleep(3600)\n",
    "no_kernel": "x = 1\n",
    "patches_check": textwrap.dedent("""
        import torch
        import reference
        reference.check_implementation = lambda data, output: (True, "")
        def custom_kernel(data):
            return torch.zeros(data[0].shape[0], 16, 512, dtype=torch.bfloat16)
        """),
    # Computes the answer, then writes it into the output on a side stream after ~10 ms of
    # spinning, returning at once: the end event on the current stream would not wait for it.
    "side_stream": textwrap.dedent("""
        import torch
        from reference import ref_kernel
        _side = []
        def custom_kernel(data):
            if not _side:
                _side.append(torch.cuda.Stream())
            answer = ref_kernel(data)
            out = torch.zeros_like(answer)
            side = _side[0]
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                torch.cuda._sleep(20_000_000)
                out.copy_(answer)
            answer.record_stream(side)
            out.record_stream(side)
            return out
        """),
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
    """A copy of the problem with small cases and a short per-case timeout."""
    d = tmp_path_factory.mktemp("problem")
    for name in ("reference.py", "task.py"):
        shutil.copy(ROOT / name, d / name)
    cases = "\n".join(f"  - {c}" for c in SMALL_CASES)
    (d / "task.yml").write_text(
        f"test_timeout: 60\nbenchmark_timeout: 60\nranked_timeout: 60\ntests:\n{cases}\nbenchmarks:\n{cases}\n")
    for name, text in SUBMISSIONS.items():
        (d / f"{name}.py").write_text(text)
    return d


def run_eval(problem, mode, submission="good", extra=(), popcorn=False, env=None, timeout=240):
    """Runs eval.py; returns (exit code, stdout, stderr, POPCORN_FD lines as a dict or None)."""
    cmd = [sys.executable, str(ROOT / "eval.py"), mode, *extra, "--problem", str(problem),
           "--submission", str(problem / f"{submission}.py")]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("POPCORN_")}, **(env or {})}
    fds, read_fd = (), None
    if popcorn:
        read_fd, write_fd = os.pipe()
        env["POPCORN_FD"] = str(write_fd)
        fds = (write_fd,)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, pass_fds=fds)
    if popcorn:
        os.close(write_fd)
        with os.fdopen(read_fd) as f:
            lines = f.read().splitlines()
    out, err = proc.communicate(timeout=timeout)
    log = None
    if popcorn:
        log = dict(line.split(": ", 1) for line in lines)
    return proc.returncode, out, err, log


def test_test_mode_passes_human_and_popcorn(problem):
    code, out, err, log = run_eval(problem, "test", popcorn=True)
    assert code == 0, out + err
    assert "2/2 tests passed" in out and "[PASS] test 1" in out
    assert log["check"] == "pass" and log["test-count"] == "2"
    assert log["test.1.spec"] == "batchsize: 3; qseqlen: 2; kvseqlen: 20; ragged: 1; seed: 12"
    assert log["test.0.status"] == "pass" and "bf16 cache" in log["test.0.message"]


def test_tests_file_argument_and_seed(problem, tmp_path):
    tests = tmp_path / "tests.txt"
    tests.write_text("batchsize: 1; qseqlen: 1; kvseqlen: 1; seed: 5\nbatchsize: 2; qseqlen: 1; kvseqlen: 7; seed: 6\n")
    code, out, err, log = run_eval(problem, "test", extra=[str(tests)], popcorn=True, env={"POPCORN_SEED": "123"})
    assert code == 0, out + err
    assert log["test-count"] == "2" and log["test.0.spec"] == "batchsize: 1; qseqlen: 1; kvseqlen: 1; seed: 5"
    assert "seed 123" in out


@pytest.mark.parametrize("submission,needle", [
    ("raises", "kernel exploded"),
    ("garbage", "none of the caches"),
    ("crashes", "exit code 3"),
    ("no_kernel", "custom_kernel"),
    ("patches_check", "none of the caches"),
])
def test_bad_submissions_fail_each_case_and_harness_goes_on(problem, submission, needle):
    code, out, err, log = run_eval(problem, "test", submission=submission, popcorn=True)
    assert code == 112, out + err
    assert log["check"] == "fail"
    assert log["test.0.status"] == "fail" and log["test.1.status"] == "fail"  # the run went on after case 0
    assert needle in log["test.0.error"] and needle in out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="side streams need a GPU")
@pytest.mark.parametrize("mode", ["test", "leaderboard"])
def test_output_finished_on_a_side_stream_fails(problem, mode):
    code, out, err, log = run_eval(problem, mode, submission="side_stream", popcorn=True)
    assert code == 112, out + err
    key = "test.0.error" if mode == "test" else "benchmark.0.error"
    assert "changed after custom_kernel returned" in log[key]


def test_hanging_submission_times_out(problem, tmp_path):
    tests = tmp_path / "one.txt"
    tests.write_text("batchsize: 1; qseqlen: 1; kvseqlen: 3; seed: 1\n")
    d = tmp_path / "p"
    shutil.copytree(problem, d)
    (d / "task.yml").write_text((problem / "task.yml").read_text().replace("test_timeout: 60", "test_timeout: 8"))
    code, out, err, log = run_eval(d, "test", submission="hangs", extra=[str(tests)], popcorn=True, timeout=120)
    assert code == 112
    assert log["test.0.status"] == "fail" and "timed out after 8 s" in log["test.0.error"]


def test_benchmark_mode_reports_stats(problem):
    code, out, err, log = run_eval(problem, "benchmark", popcorn=True)
    assert code == 0, out + err
    assert log["benchmark-count"] == "2" and log["check"] == "pass"
    for i in range(2):
        assert int(log[f"benchmark.{i}.runs"]) >= 3
        assert 0 < float(log[f"benchmark.{i}.best"]) <= float(log[f"benchmark.{i}.mean"]) <= float(log[f"benchmark.{i}.worst"])
    assert "geometric mean of the means (ranking score)" in out
    assert "geometric mean of the best calls (not ranked)" in out
    assert "CPU wall-clock" in out  # no CUDA here: says plainly what the times are


def test_benchmark_stops_at_a_wrong_answer(problem):
    code, out, err, log = run_eval(problem, "benchmark", submission="garbage", popcorn=True)
    assert code == 112 and log["benchmark.0.status"] == "fail" and log["check"] == "fail"


def test_leaderboard_checks_every_call_so_caching_fails(problem):
    code, out, err, log = run_eval(problem, "leaderboard", submission="caches", popcorn=True)
    assert code == 112, out + err
    assert log["benchmark.0.status"] == "fail" and "none of the caches" in log["benchmark.0.error"]
    code, out, err, log = run_eval(problem, "test", submission="caches")
    assert code == 0  # a single call per case cannot see the cache: only ranked runs can


def test_leaderboard_passes_with_the_reference(problem):
    code, out, err, log = run_eval(problem, "leaderboard", popcorn=True, env={"POPCORN_SEED": "99"})
    assert code == 0, out + err
    assert log["check"] == "pass" and int(log["benchmark.1.runs"]) >= 3


def test_profile_mode(problem):
    code, out, err, log = run_eval(problem, "profile", popcorn=True)
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
    code, out, err, _ = run_eval(problem, "test", extra=[str(tests)])
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
    code, out, err, _ = run_eval(d, "test")
    assert code == 113 and needle in err and "task.yml" in err


def test_bad_popcorn_fd_exits_111(problem):
    code, out, err, _ = run_eval(problem, "test", env={"POPCORN_FD": "987"})
    assert code == 111 and "POPCORN_FD" in err


def test_help_explains_modes():
    out = subprocess.run([sys.executable, str(ROOT / "eval.py"), "--help"], capture_output=True, text=True).stdout
    for word in ("test", "benchmark", "leaderboard", "profile", "POPCORN_FD", "task.yml"):
        assert word in out
