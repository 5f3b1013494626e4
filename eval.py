"""
Evaluation harness (GPU MODE runner protocol, readable by hand): a judge process that generates the
inputs, checks the outputs and verifies the times, and a worker process that runs the submission.

    python eval.py test         [TESTS_FILE] [--problem DIR] [--submission FILE]
    python eval.py benchmark    [TESTS_FILE] ...
    python eval.py leaderboard  [TESTS_FILE] ...
    python eval.py profile      [TESTS_FILE] ...
    python eval.py compare      A.py B.py [TESTS_FILE] [--problem DIR]

test         generate each case, run custom_kernel once on a copy, check it against the reference.
benchmark    check one call, then time repeated calls on the same input (every output checked).
leaderboard  like benchmark, but every timed call gets a freshly generated input from a secret seed
             (so nothing can be cached between calls). The ranking score is the geometric mean of
             the per-case mean times.
profile      one call per case under torch.profiler; prints its table.
compare      A against B: both checked, then timed in one run, call by call in turn on the same input
             under the same protocol; per case the ratio of A's time to B's with its 95 % interval,
             and the geometric mean of the ratios (below 1: A is faster).

Without TESTS_FILE the cases come from DIR/task.yml (`tests` for test mode, `benchmarks` otherwise).
A tests file has one case per line, `key: value; key: value` (GPU MODE's format).
DIR defaults to this file's directory (the MLA decode problem); FILE defaults to DIR/submission.py.

A timed call is the device time of custom_kernel(data): the GPU is held until the call has returned,
so the host's time to enqueue it is measured beside the score (host/call), not in it. The judge
writes the call's inputs only after the call has returned, then flushes L2 (left clean) and releases
the GPU: nothing that depends on the inputs can run before the clock starts. Times are measured in
the worker and checked against the judge's own clock (docs/judge.md, "What the judge guarantees").

Runner protocol: when POPCORN_FD names an open file descriptor, results are also written there as
`key: value` lines (check, test-count, test.N.spec/status/error/message, benchmark-count,
benchmark.N.spec/runs/mean/std/err/best/worst/host/floor/judge/early/stragglers/late_holds, times in ns).
POPCORN_SEED, if set, is combined with every case's seed. Exit codes: 0 all passed, 112 something failed, 111
POPCORN_FD is not an open descriptor, 113 the tests file or task.yml is malformed, 2 bad command line.

task.yml's time limit for the mode (test_timeout, benchmark_timeout, ranked_timeout) is the whole
run's, as kernelbot applies it to this process: the report is finished before it, a case that cannot
start in time fails as not run, and each case's timing loop gets its share of what is left. An
exception, crash or hang in the submission fails that case, the worker is restarted and the run goes
on (leaderboard mode stops at the first failed case).
"""
import argparse
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

# The judge's modules are compiled from their source, never loaded from a .pyc beside it, which a worker
# able to write there (under ncu, whose temp folder the worker may write, when it holds this folder) could
# have planted for this run to load (judge_process.bytecode_from_source does the same for the problem's).
_site_pycache, sys.pycache_prefix = sys.pycache_prefix, tempfile.mkdtemp(prefix="eval-bytecode-")
try:
    from judge_cases import DefinitionError, load_task, make_cases, parse_tests_file, validate_cases
    from judge_modes import (Outcome, RunClock, refuse_unfit_cases, run_benchmarks, run_compare, run_profiles,
                             run_tests)
    from judge_process import CaseFailure, ROOT, Warden, protect_judge
    from judge_report import Report, first_line, triton_version
    from judge_stats import BANDS, CALL_BANDS, COMPARE_BANDS, SLOWEST_SHARE
    from judge_timing import Judge
finally:
    shutil.rmtree(sys.pycache_prefix, ignore_errors=True)
    sys.pycache_prefix = _site_pycache

MODES = ("test", "benchmark", "leaderboard", "profile", "compare")
EXIT_OK, EXIT_FAIL, EXIT_BAD_FD, EXIT_BAD_TESTS = 0, 112, 111, 113
# The judge's own failure (an exception of its code, not of a submission's), and a run stopped by SIGTERM or
# SIGINT: either way the run ends in a verdict, `check: fail` on POPCORN_FD with the reason.
EXIT_JUDGE_ERROR, EXIT_STOPPED = 114, 115
# The harness: this CLI and the judge's modules beside it (each task.yml's `files:` lists them all, for
# kernelbot, which writes them into one folder), and utils.py, which the problems share.
HARNESS_FILES = ("eval.py", "judge_cases.py", "judge_modes.py", "judge_process.py", "judge_report.py",
                 "judge_stats.py", "judge_timing.py", "judge_worker.py", "utils.py")


class FileGuard:
    """The problem's files and the harness (HARNESS_FILES) as they were when the run began, bytes and
    metadata, and the interpreter's metadata and start-up files (startup_files): a run during which any of
    them changed fails, naming them (they are not put back: the change may be a person's edit). Metadata
    too, because Landlock does not rule it: a worker of the files' owner can chmod, chown to a group of its
    own, set times and extended attributes. And the names in the harness's and the problem's folders and
    their __pycache__: a file added there (a module that shadows one the judge imports, compiled code)
    fails the run too. ignore: a file the run itself writes there (its --json)."""

    def __init__(self, problem: Path, ignore: Path | None = None):
        self.folders = [folder / sub for folder in sorted({ROOT, problem.resolve()}) for sub in (".", "__pycache__")]
        self.ignore = ignore.resolve() if ignore is not None else None
        self.entries = self._entries()
        paths = {ROOT / name for name in HARNESS_FILES}
        paths.update(p for p in problem.iterdir() if p.suffix in (".py", ".yml") and p.name != "submission.py")
        paths.update(self.startup_files())
        self.saved = {p: (p.read_bytes(), self._metadata(p)) for p in paths if p.is_file()}
        interpreter = Path(sys.executable).resolve() if sys.executable else None
        if interpreter is not None and interpreter.is_file():
            self.saved[interpreter] = (None, self._metadata(interpreter))

    @staticmethod
    def startup_files() -> set[Path]:
        """The files any Python started from this interpreter runs before its script (the judge's next run
        too): .pth files, sitecustomize and usercustomize, in every folder on the module path."""
        found = set()
        for entry in sys.path:
            folder = Path(entry or ".")
            if folder.is_dir():
                found.update(p.resolve() for pattern in ("*.pth", "sitecustomize.py", "usercustomize.py")
                             for p in folder.glob(pattern))
        return found

    @staticmethod
    def _metadata(path: Path) -> tuple:
        st = path.stat()
        try:
            xattrs = tuple(sorted((name, os.getxattr(path, name)) for name in os.listxattr(path)))
        except (OSError, AttributeError):  # no extended attributes here
            xattrs = ()
        # st_ctime_ns: the kernel's own time of the last change to the file, which no process can set
        # back; it shows a change that was made and undone during the run
        return st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_ctime_ns, xattrs

    def _entries(self) -> set[Path]:
        found = set()
        for folder in self.folders:
            try:
                found.update(entry for entry in folder.iterdir() if entry != self.ignore)
            except OSError:  # not there (yet)
                pass
        return found

    def changed(self) -> list[str]:
        changed = sorted(str(p) for p in self._entries() - self.entries)  # added during the run
        for path, (content, metadata) in self.saved.items():
            try:
                same = self._metadata(path) == metadata and (content is None or path.read_bytes() == content)
            except OSError:
                same = False
            if not same:
                changed.append(str(path))
        changed += sorted(str(p) for p in self.startup_files() - set(self.saved))  # added during the run
        return changed


def write_json(path: str, args, judge: Judge, report: Report, outcome: Outcome, seed) -> None:
    results = {"mode": args.mode, "problem": str(Path(args.problem).resolve()), "ok": outcome.ok,
               "device": judge.describe(), "torch": judge.torch.__version__, "triton": triton_version(),
               "python": sys.version.split()[0], "seed": seed, "worker": judge.worker.confinement,
               "band": dataclasses.asdict((COMPARE_BANDS if args.mode == "compare" else BANDS)[
                   "cuda" if judge.cuda else "cpu"]), "call_bands": CALL_BANDS, "slowest_share": SLOWEST_SHARE,
               "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cases": report.cases,
               "summary": [line.strip() for line in outcome.summary]}
    # whole or not at all: written beside its place, then moved there
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as a plain write would have made it (mkstemp's is 0600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(results, indent=1, default=str))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="eval.py", description=__doc__.split("\n\n")[0].strip(),
                                     epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("files", nargs="*", metavar="FILE", help="TESTS_FILE: cases, one per line (default: from "
                        "task.yml); in compare mode A.py B.py [TESTS_FILE]")
    parser.add_argument("--problem", default=str(ROOT), help="problem directory (default: %(default)s)")
    parser.add_argument("--submission", help="submission file (default: DIR/submission.py)")
    parser.add_argument("--json", metavar="FILE", help="also write the run's results to FILE as JSON: cases, "
                        "status, statistics, each timed call (device_ns, judge_ns, host_ns, early) and null call, "
                        "device, versions")
    args = parser.parse_intermixed_args(argv)
    args.other = None
    if args.mode == "compare":
        if len(args.files) not in (2, 3):
            parser.error("compare takes two submissions and, optionally, a tests file: compare A.py B.py [TESTS_FILE]")
        if args.submission:
            parser.error("compare names its submissions itself: compare A.py B.py")
        args.submission, args.other = args.files[:2]
        args.files = args.files[2:]
    elif len(args.files) > 1:
        parser.error(f"{args.mode} takes at most one tests file, got {len(args.files)} files")
    args.tests_file = args.files[0] if args.files else None
    return args


def open_popcorn_fd():
    fd = os.environ.pop("POPCORN_FD", None)
    if not fd:
        return None
    try:
        f = os.fdopen(int(fd), "w")
        os.set_inheritable(int(fd), False)
        return f
    except (ValueError, OSError) as e:
        print(f"eval.py: POPCORN_FD={fd!r} is not an open file descriptor: {e}", file=sys.stderr)
        sys.exit(EXIT_BAD_FD)


def main(argv=None) -> int:
    started = time.monotonic()
    argv = sys.argv[1:] if argv is None else argv
    # OpenMP threads that spin after a parallel region would take the CPU from the other processes of
    # the run (two cores: judge, worker, null worker): they sleep instead, here and in the workers.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = parse_args(argv)
    problem = Path(args.problem).resolve()
    submission = Path(args.submission).resolve() if args.submission else problem / "submission.py"
    if not (problem / "reference.py").is_file():
        print(f"eval.py: {problem} is not a problem directory (no reference.py)", file=sys.stderr)
        return 2
    other = Path(args.other).resolve() if args.other else None
    for path in (submission, other):
        if path is not None and not path.is_file():
            print(f"eval.py: submission file {path} not found", file=sys.stderr)
            return 2
    protect_judge()
    fd_file = open_popcorn_fd()
    seed_env = os.environ.pop("POPCORN_SEED", None)
    try:
        seed = int(seed_env) if seed_env else None
    except ValueError:
        print(f"eval.py: POPCORN_SEED={seed_env!r} is not an integer", file=sys.stderr)
        return 2

    try:
        task = load_task(problem)
        raw = parse_tests_file(args.tests_file) if args.tests_file else \
            task["tests" if args.mode == "test" else "benchmarks"]
    except DefinitionError as e:
        print(f"eval.py: {e}", file=sys.stderr)
        return EXIT_BAD_TESTS
    sys.path[:0] = [str(problem), str(ROOT)]
    limit_key = {"test": "test_timeout", "leaderboard": "ranked_timeout"}.get(args.mode, "benchmark_timeout")

    report = Report(fd_file)
    on_term = signal.signal(signal.SIGTERM, _stopped)
    try:
        return run_mode(args, problem, submission, other, seed, task, raw, limit_key, report, started)
    except (Exception, RunStopped, KeyboardInterrupt) as e:
        # Whatever stops the run, it ends in a verdict: a failed one, with the reason.
        stopped = not isinstance(e, Exception)
        why = (f"the run was stopped ({'SIGTERM' if isinstance(e, RunStopped) else 'SIGINT'})" if stopped else
               f"the judge itself failed: {type(e).__name__}: {e}")
        if not stopped:
            traceback.print_exc()
        if not report.checked:
            report.say(f"\nFAIL: {why}")
            report.log("error", first_line(why))
            report.log("check", "fail")
        return EXIT_STOPPED if stopped else EXIT_JUDGE_ERROR
    finally:
        signal.signal(signal.SIGTERM, on_term)
        if fd_file is not None:
            fd_file.close()


class RunStopped(BaseException):
    """SIGTERM (a runner's time limit): raised in the judge's main thread, so that its cleanup runs."""


def _stopped(signum, frame):
    raise RunStopped()


def run_mode(args, problem: Path, submission: Path, other: Path | None, seed, task: dict, raw: list,
             limit_key: str, report: Report, started: float) -> int:
    guard = FileGuard(problem, ignore=Path(args.json) if args.json else None)
    # kernelbot runs profile mode under `ncu --nvtx-include custom_kernel/` with POPCORN_NCU=1.
    under_ncu = args.mode == "profile" and os.environ.pop("POPCORN_NCU", "0").strip().lower() in ("1", "true", "yes")
    warden = Warden()  # cleans up after this process if it is killed before it is done
    try:
        # The workers start here and import torch while the judge imports it and checks the cases' arguments.
        judge = Judge(problem, submission, report, timed=args.mode in ("benchmark", "leaderboard", "compare"),
                      under_ncu=under_ncu, other=other, warden=warden)
        try:
            return judge_run(args, judge, report, guard, seed, task, raw, limit_key, started, problem, submission)
        finally:
            judge.close()  # (again, on the paths that did not get that far)
            judge.remove_sandboxes()
    finally:
        warden.done()


def run_cases(args, report: Report, judge: "Judge", cases: list, clock: RunClock) -> Outcome:
    if args.mode == "test":
        return run_tests(report, judge, cases, clock)
    if args.mode == "compare":
        return run_compare(report, judge, cases, clock, (str(args.submission), str(args.other)))
    if args.mode == "profile":
        return run_profiles(report, judge, cases, clock)
    return run_benchmarks(report, judge, cases, clock, ranked=args.mode == "leaderboard")


def judge_run(args, judge: "Judge", report: Report, guard: "FileGuard", seed, task: dict, raw: list,
              limit_key: str, started: float, problem: Path, submission: Path) -> int:
    """The mode itself, once the judge has started: its cases, the verdict, the JSON. (run_mode closes the
    judge and removes its sandboxes whatever happens here.)"""
    try:
        validate_cases(raw, judge.reference.generate_input, args.tests_file or str(problem / "task.yml"))
    except DefinitionError as e:
        print(f"eval.py: {e}", file=sys.stderr)
        return EXIT_BAD_TESTS
    cases = make_cases(raw, seed)
    clock = RunClock(float(task[limit_key]), limit_key, per_case=not judge.cuda, started=started)
    outcome = Outcome(False, [])
    try:
        try:
            judge.ensure_started(judge.worker, clock.start())
        except CaseFailure as e:
            report.say(f"eval.py: the worker could not start: {e}")
        else:
            report.say(f"{args.mode}: {os.path.relpath(submission)} on {judge.describe()}"
                       + (f", seed {seed}" if seed is not None else "") + f", {len(cases)} cases")
            report.say(f"worker: {'; '.join(judge.worker.confinement) or 'unconfined'}\n")
            judge.weigh_machine()
            unfit = judge.unfit_cases(cases)
            if unfit and args.mode in ("test", "leaderboard"):
                outcome = refuse_unfit_cases(report, args.mode, cases, unfit)
            else:
                if unfit:
                    report.say(f"NOTE: {len(unfit)} of the {len(cases)} cases cannot run on this machine and will "
                               f"be skipped: {', '.join(str(i) for i, _ in unfit)} (memory)\n")
                outcome = run_cases(args, report, judge, cases, clock)
    finally:
        judge.close()  # every process the worker started is gone before the last result line
    changed = guard.changed()
    if changed:
        outcome = Outcome(False, [f"\nFAIL: these files of the judge changed during the run: {', '.join(changed)}"])
    for line in outcome.summary:
        report.say(line)
    if args.json:
        try:
            write_json(args.json, args, judge, report, outcome, seed)
        except OSError as e:  # a full disk, say: the run still ends with a verdict, a failed one
            outcome = Outcome(False, [f"FAIL: the results could not be written to {args.json}: {e}"])
            report.say(outcome.summary[0])
    report.log("check", "pass" if outcome.ok else "fail")
    if report.fd_file is not None:
        report.fd_file.close()  # the last result line: before the sandboxes go, which can take a while
    return EXIT_OK if outcome.ok else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
