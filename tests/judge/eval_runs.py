"""What the end-to-end tests of eval.py share: a small copy of the problem holding every test submission
(tests/submissions/ and the small bad ones below), the small cases, and run_eval, which runs eval.py in a
subprocess and reads its POPCORN_FD lines. The tests: test_eval.py (modes, arguments, limits),
test_eval_timing.py (what a submission can do to its time), test_eval_confinement.py (what it can do to
the judge, its files and its verdict)."""
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch


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


@pytest.fixture(scope="module", name="problem")
def problem_fixture(tmp_path_factory):
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


# The cases the tests time, in eval.py's tests-file form: the first one, two or three of them.
CASE_LINES = ("batchsize: 2; qseqlen: 1; kvseqlen: 65; seed: 11",
              "batchsize: 3; qseqlen: 2; kvseqlen: 20; ragged: 1; seed: 12",
              "batchsize: 2; qseqlen: 1; kvseqlen: 40; seed: 13")


def _cases_file(tmp_path_factory, name: str, count: int) -> str:
    tests = tmp_path_factory.mktemp("cases") / f"{name}.txt"
    tests.write_text("".join(line + "\n" for line in CASE_LINES[:count]))
    return str(tests)


@pytest.fixture(scope="module", name="one_case")
def one_case_fixture(tmp_path_factory):
    return _cases_file(tmp_path_factory, "one", 1)


@pytest.fixture(scope="module", name="two_cases")
def two_cases_fixture(tmp_path_factory):
    return _cases_file(tmp_path_factory, "two", 2)


@pytest.fixture(scope="module", name="three_cases")
def three_cases_fixture(tmp_path_factory):
    return _cases_file(tmp_path_factory, "three", 3)


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
