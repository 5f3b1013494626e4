"""Both kits under a stand-in for kernelbot's runner (gpu-mode/kernelbot, src/libkernelbot: task.py's
make_task_definition and build_task_config, run_eval.py's run_config), as it behaves:

- task.yml is read as kernelbot's LeaderboardTask takes it: an unknown key is an error, `gpus` must be
  there; only the `files:` entries are written into a fresh working directory (sources relative to
  task.yml, `@SUBMISSION@` replaced by the submission's text), flat, nothing else;
- `python3 submission.py` runs first (its result only informs), then `python3 eval.py MODE CASES` in
  that directory, CASES a file elsewhere holding one `key: value; key: value` line per case (tests for
  test mode, benchmarks otherwise); leaderboard mode is test, then benchmark, then leaderboard, each
  only if the one before passed; profile mode is one run per benchmark;
- results are read from the POPCORN_FD pipe only after the process has exited (a report larger than
  the pipe's buffer would hang it), parsed as `key: value` lines; a run succeeded when its exit code is
  0 or 112 and passed when `check` is `pass`; the score is the geometric mean of `benchmark.N.mean`.

The kits' task.yml files are used as they are, except for smaller cases (the CPU has no time for the
real ones)."""
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from eval import HARNESS_FILES

ROOT = Path(__file__).resolve().parents[2]
# LeaderboardTask's fields, and the keys make_task_definition removes before building it.
KERNELBOT_KEYS = {"files", "lang", "description", "config", "templates", "gpus", "libraries", "tests",
                  "benchmarks", "test_timeout", "benchmark_timeout", "ranked_timeout", "ranking_by", "seed",
                  "multi_gpu"}
KITS = {
    "mla": (ROOT, [{"batchsize": 2, "qseqlen": 1, "kvseqlen": 65, "seed": 11},
                   {"batchsize": 3, "qseqlen": 2, "kvseqlen": 20, "ragged": 1, "seed": 12}]),
    "paged": (ROOT / "problems" / "paged_mqa_logits",
              [{"batch": 2, "next_n": 1, "context": 64, "random": 0, "seed": 21},
               {"batch": 3, "next_n": 2, "context": 130, "random": 1, "seed": 22}]),
}


def task_definition(problem: Path, cases: list[dict]) -> dict:
    task = yaml.safe_load((problem / "task.yml").read_text())
    unknown = set(task) - KERNELBOT_KEYS
    assert not unknown, f"kernelbot's LeaderboardTask rejects the keys {unknown}"
    assert task.get("gpus"), "kernelbot cannot create a leaderboard without `gpus`"
    assert task["lang"] == "py" and isinstance(task["config"]["main"], str)
    missing = set(HARNESS_FILES) - {entry["name"] for entry in task["files"]}
    assert not missing, f"{problem / 'task.yml'}'s files: leave out {sorted(missing)}, which eval.py needs beside it"
    return dict(task, tests=cases, benchmarks=cases)


def write_files(task: dict, problem: Path, submission: str, workdir: Path) -> None:
    workdir.mkdir()
    for entry in task["files"]:
        text = submission if entry["source"] == "@SUBMISSION@" else (problem / entry["source"]).read_text()
        target = workdir / entry["name"]
        assert target.parent == workdir, "kernelbot writes files flat into its working directory"
        target.write_text(text)


def run_mode(task: dict, workdir: Path, mode: str, cases: list[dict], tmp_path: Path, seed=None) -> dict:
    cases_file = tmp_path / f"cases-{mode}-{len(list(tmp_path.iterdir()))}.txt"
    cases_file.write_text("".join("; ".join(f"{k}: {v}" for k, v in c.items()) + "\n" for c in cases))
    read_fd, write_fd = os.pipe()
    env = {k: v for k, v in os.environ.items() if not k.startswith("POPCORN_")}
    env["POPCORN_FD"] = str(write_fd)
    if seed is not None:
        env["POPCORN_SEED"] = str(seed)
    timeout = task[{"test": "test_timeout", "leaderboard": "ranked_timeout"}.get(mode, "benchmark_timeout")]
    try:
        proc = subprocess.run([sys.executable, task["config"]["main"], mode, str(cases_file)], cwd=workdir,
                              env=env, pass_fds=(write_fd,), capture_output=True, text=True, timeout=timeout)
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd) as f:  # read after the exit, as kernelbot does
        lines = f.read().splitlines()
    result = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip():
            result[key.strip()] = value.strip()
    success = proc.returncode in (0, 112)
    return {"success": success, "passed": success and result.get("check") == "pass", "result": result,
            "exit": proc.returncode, "output": proc.stdout + proc.stderr}


def kernelbot(problem: Path, cases: list[dict], mode: str, tmp_path: Path) -> dict:
    """kernelbot's run for one submission in one mode: {mode it ran: its run}."""
    task = task_definition(problem, cases)
    submission = (problem / task["templates"]["Python"]).read_text()
    workdir = tmp_path / "work"
    write_files(task, problem, submission, workdir)
    subprocess.run([sys.executable, "submission.py"], cwd=workdir, capture_output=True, timeout=120)
    runs = {}
    if mode == "profile":
        for i, case in enumerate(task["benchmarks"]):
            runs[f"profile.{i}"] = run_mode(task, workdir, "profile", [case], tmp_path)
        return runs
    for step in (["test", "benchmark", "leaderboard"] if mode == "leaderboard" else [mode]):
        runs[step] = run_mode(task, workdir, step, task["tests" if step == "test" else "benchmarks"], tmp_path,
                              seed=task.get("seed"))
        if not runs[step]["passed"]:
            break
    return runs


def score(run: dict) -> float:
    r = run["result"]
    means = [float(r[f"benchmark.{i}.mean"]) / 1e9 for i in range(int(r["benchmark-count"]))]
    return math.exp(sum(math.log(m) for m in means) / len(means))


@pytest.mark.parametrize("kit", sorted(KITS))
def test_the_kit_is_ranked_under_kernelbot(kit, tmp_path):
    problem, cases = KITS[kit]
    runs = kernelbot(problem, cases, "leaderboard", tmp_path)
    assert list(runs) == ["test", "benchmark", "leaderboard"]
    for step, run in runs.items():
        assert run["passed"], f"{step}: {run['output']}"
    assert runs["test"]["result"]["test-count"] == "2"
    assert all(runs["test"]["result"][f"test.{i}.status"] == "pass" for i in range(2))
    assert score(runs["leaderboard"]) > 0
    for i in range(2):
        r = runs["benchmark"]["result"]
        assert all(f"benchmark.{i}.{k}" in r for k in ("spec", "mean", "err", "best", "worst"))


@pytest.mark.parametrize("kit", sorted(KITS))
def test_the_kit_profiles_under_kernelbot(kit, tmp_path):
    import base64

    problem, cases = KITS[kit]
    runs = kernelbot(problem, cases[:1], "profile", tmp_path)
    run = runs["profile.0"]
    assert run["passed"], run["output"]
    table = base64.b64decode(run["result"]["benchmark.0.report"].encode(), b"+*").decode()
    assert "Self CPU" in table  # torch.profiler's table; under ncu (POPCORN_NCU=1) ncu's report replaces it


def test_the_competition_file_creates_both_leaderboards():
    """kernelbot's problem sync (problem_sync.create_update_plan) reads problems/*.yaml: each problem's
    `directory` is relative to problems/, where make_task_definition reads task.yml, its `files:` and its
    `templates:` relative to task.yml. Both kits are there, the MLA kit as problems/.. (the root)."""
    competitions = list((ROOT / "problems").glob("*.yaml"))
    assert len(competitions) == 1
    competition = yaml.safe_load(competitions[0].read_text())
    assert {"name", "description", "deadline", "problems"} <= set(competition)
    found = {}
    for problem in competition["problems"]:
        assert problem["gpus"] and problem["name"] and problem["directory"]
        folder = ROOT / "problems" / problem["directory"]
        task = yaml.safe_load((folder / "task.yml").read_text())
        for entry in task["files"]:
            assert entry["source"] == "@SUBMISSION@" or (folder / entry["source"]).is_file(), entry
        assert all((folder / source).is_file() for source in task["templates"].values())
        found[folder.resolve()] = problem["name"]
    assert found == {ROOT: "mla-decode-hopper", ROOT / "problems" / "paged_mqa_logits": "paged-mqa-logits"}
