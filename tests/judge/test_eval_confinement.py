"""eval.py end to end against submissions aimed at the judge itself (tests/submissions/): its process, its
files and the interpreter it runs in, the runner's descriptor, the report and the verdict, the worker's
confinement (seccomp, Landlock, priority), and what one run could leave for the next."""
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import eval as cli
import judge_report
from eval_runs import ROOT, SMALL_CASES, SUBMISSIONS, report_lines, run_eval
from eval_runs import one_case_fixture, problem_fixture, three_cases_fixture, two_cases_fixture  # noqa: F401


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
