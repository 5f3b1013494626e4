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
import base64
import ctypes
import dataclasses
import errno
import fcntl
import functools
import gc
import glob
import inspect
import json
import math
import mmap
import os
import pickle
import re
import secrets
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent
MODES = ("test", "benchmark", "leaderboard", "profile", "compare")
EXIT_OK, EXIT_FAIL, EXIT_BAD_FD, EXIT_BAD_TESTS = 0, 112, 111, 113
# The judge's own failure (an exception of its code, not of a submission's), and a run stopped by SIGTERM or
# SIGINT: either way the run ends in a verdict, `check: fail` on POPCORN_FD with the reason.
EXIT_JUDGE_ERROR, EXIT_STOPPED = 114, 115

# Stopping rule (GPU MODE's, with a floor of MIN_RUNS so that the judge's clock has enough calls to
# check): stop when the standard error of the mean is under 0.1 % of the mean, when the summed time
# passes max_time, or after WALL_LIMIT_NS of wall-clock time.
BENCH_MAX_REPEATS, BENCH_MAX_TIME_NS = 1000, 50e9
RANKED_MAX_REPEATS, RANKED_MAX_TIME_NS = 100, 30e9
# Without CUDA, benchmark and compare stop after this many calls: CPU times are for trying a path, not
# for ranking, and their run-to-run spread dwarfs the error of a mean over this many.
CPU_MAX_REPEATS = 200
WALL_LIMIT_NS = 120e9
# The mode's time limit in task.yml is the whole run's; the judge keeps this much of it to end the run
# and write its report, and a case's timing loop stops after LOOP_SHARE of the case's share of the
# time left (its first call, compilation included, and the checks take the rest).
RUN_RESERVE_S, RUN_RESERVE_FRACTION = 10.0, 0.1
LOOP_SHARE = 0.5
# On the CPU the judge, the worker and their copies of an input share the machine's memory: a case runs
# only when this many times its input (reference.input_bytes) is available. eval.py test peaks at 3.2x
# the input at 64 x 8192; a ranked run holds two inputs while it generates the next.
HARNESS_MEMORY_FACTOR = 6
MIN_RUNS = 10
WARMUP_CALLS = 3

# The judge's clock against the worker's. The judge's own overhead is measured on the same protocol with a
# null submission that takes as long as the measured calls (a spin on the GPU, a busy wait on the CPU):
# NULL_CALIBRATION calls before a case's timed calls, then one after every NULL_EVERY of them. Per call,
# the judge's clock less the null's overhead (trimmed mean: the slowest TRIM of its calls left out) is
# what the judge saw of the call; a report may lie under it by at most a band, band(t) = abs_ns + rel * t
# for a call reported at t (Band).
#
# The band is what the judge can tell apart, measured on the H200 with tools/judge_resolution.py (the
# shipped submission and two null processes, rounds of fresh processes; the figures are in
# docs/judge.md, "The band"): how long the protocol takes differs from one process to the next by a few
# us, which no number of calls averages away. 6 us + 10 % keeps every honest gap measured inside it and
# fails a report of a quarter of a call from MLA's shortest case up; below it a report can take time off
# unseen, as docs/judge.md states per case. On the CPU the three processes' wake-ups on a few cores make
# it milliseconds.
#   - A case whose trimmed mean gap (the largest TRIM of its per-call residuals left out, so that a hiccup
#     of the judge's cannot fail it) exceeds band(its reported mean) is timed again on fresh processes
#     (RETIMES: a process whose switches run slow is not the submission's doing), and fails if the mean gap
#     of all its timings exceeds it (a second draw of processes is not a second chance at a lucky one).
#   - One call is ranked no lower than the judge's clock of it less CALL_BANDS bands (ranked_times), and a
#     report more than CALL_BANDS bands above the judge's clock (a stall of the worker's events that the
#     judge's clock did not see) is ranked on the judge's clock: CALL_BANDS is wide enough that the
#     per-call spread never moves an honest call, and the calls a trimmed mean leaves out can hide no more.
#   - On the CPU the ranked time is the judge's clock itself; its band only checks the report.
@dataclasses.dataclass(frozen=True)
class Band:
    abs_ns: float
    rel: float

    def at(self, reported_ns: float) -> float:
        return self.abs_ns + self.rel * max(reported_ns, 0.0)


BANDS = {"cuda": Band(6e3, 0.10), "cpu": Band(2e6, 0.15)}
CALL_BANDS = 3
RETIMES = 1
# A case's statistics leave out its slowest SLOWEST_SHARE of ranked calls (one at least): one call in a
# hundred stalled for milliseconds, on either clock and whatever the cause (the judge or the worker
# descheduled, another context on the GPU), then moves its mean by nothing. The report counts them.
SLOWEST_SHARE = 0.01
# A call that has not returned when the judge releases it is timed on the judge's host clock, host time
# included. In a case whose other calls all return in time, such a call is a stall of the host (the
# worker descheduled or paging), not the submission's cost, and one of them would move the mean by
# milliseconds: up to STRAGGLER_SHARE of a case's calls (one at least) are then left out of its ranked
# statistics. They are still checked, and the report counts them.
STRAGGLER_SHARE = 0.01
NULL_CALIBRATION, NULL_EVERY, TRIM = 10, 4, 0.05
# compare mode: the normal quantile of its two-sided 95 % intervals; how much two worker processes
# running the same file differ, by which every interval is widened (it is fixed within a pair of
# processes, so the per-pair ratios cannot show it: the shipped MLA submission against itself read
# 0.996-1.000 per case on the H200, the paged one 1.004-1.007; on two CPU cores, 1.02-1.05); B's file
# name in the sandbox.
COMPARE_Z = 1.96
COMPARE_PROCESS_SPREAD = {"cuda": 0.005, "cpu": 0.05}
OTHER_SUBMISSION = "submission_other.py"
# compare mode keeps three workers' contexts on the GPU, and its honest gaps to the null are larger: on the
# H200 the shipped MLA submission's gap read +20.0 to +21.0 us per case in compare against +5 to +8 us in
# leaderboard mode on the same machine. It checks reports against these bands (it ranks nothing).
COMPARE_BANDS = {"cuda": Band(40e3, 0.15), "cpu": Band(4e6, 0.15)}

# On a GPU the null submission's calls run on a quiet machine: every other process the judge started (the
# submission's worker and whatever it started) is stopped (SIGSTOP), and the judge first waits
# until a probe of QUIET_PROBE_NS, one thread reading the GPU's clock, runs with no gap over QUIET_GAP_NS
# in it: another context with work queued, on any engine, takes the GPU from it in time slices (on the
# H200 a context running kernels or copies left gaps of 0.8 to 2.3 ms in such a probe; an idle one,
# under 0.1 us). A GPU that is not quiet after QUIET_WAIT_S fails the case.
QUIET_PROBE_NS, QUIET_GAP_NS, QUIET_WAIT_S = 4_000_000, 50_000, 2.0

# How long the GPU stays held for a call that has not returned (one that synchronises, or a host path
# slower than this): then the judge releases it and the rest of the call is timed as it runs.
RETURN_WAIT_S = 0.005
HOLD_TIMEOUT_NS = 60_000_000_000  # each hold lets go by itself this long after it starts, whatever happens
# How long the judge waits, once it has let the full-SM hold go, for the one-block hold behind it to say
# it runs (so that the full hold has left the SMs before the judge's own work needs them); past this it
# goes on regardless, and the report counts such calls (`late_holds`). The wait is before the judge's
# clock starts: it costs the run wall time, not a call time.
HOLD_SWAP_WAIT_S = 0.01
# The judge's gate (Judge.timed) opens by itself this long after it starts, should the judge's host be held
# up queuing a call's work behind it (the call is then timed with that delay in it, not lost).
GATE_TIMEOUT_NS = 1_000_000_000
# On a GPU machine both sides poll for the other's next message for this long before they sleep on it:
# a process woken from sleep takes a time that grows with how long it slept (tens to hundreds of us on
# a VM), which would otherwise be most of the judge's clock. (On a CPU machine the cores do the work.)
POLL_S = 0.02

# Peak device-memory bandwidth (datasheet, bytes/s) by device name; the memory floor of a case is the
# bytes its reference says one call must move (reference.min_bytes) over this. The largest figure of
# each name family, so that no correct call can be under its floor.
PEAK_BANDWIDTH = (("GH200", 4.9e12), ("H200", 4.8e12), ("H100", 3.9e12), ("H800", 3.35e12),
                  ("B200", 8.0e12), ("B100", 8.0e12), ("A100", 2.04e12))

REPORT_LINE_LIMIT, RELAY_LINE_LIMIT, RELAY_LINE_CHARS = 400, 2000, 2000
# The most of the submission's own free text (an error, a profile table) that one case's report, JSON
# and POPCORN lines carry: a traceback or a torch.profiler table fits; a flood is cut, with a note.
SUBMISSION_TEXT_LINES, SUBMISSION_TEXT_CHARS = 200, 20_000
WORKER_FRAME_LIMIT = 8 << 20


class DefinitionError(Exception):
    """A malformed task.yml or tests file (exit code 113)."""


# ---------------------------------------------------------------------------------------------
# Cases: task.yml and tests files
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class TestCase:
    args: dict
    spec: str


def spec_string(args: dict) -> str:
    return "; ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in args.items())


def combine_seeds(a: int, b: int) -> int:
    """GPU MODE's Cantor-style combination: a large secret seed gives a large case seed."""
    return int(a + (a + b) * (a + b + 1) // 2)


_CASE_PART = re.compile(r"\s*([a-zA-Z_]\w*):\s*([a-zA-Z_]\w*|[+-]?[0-9]+)\s*")


def parse_tests_file(path: str) -> list[dict]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise DefinitionError(f"cannot read tests file {path}: {e}") from None
    cases = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        case = {}
        for part in line.split(";"):
            m = _CASE_PART.fullmatch(part)
            if not m:
                raise DefinitionError(f"{path}:{lineno}: invalid case part {part!r} in {line!r} "
                                      f"(expected `key: value; key: value` with integer or true/false values)")
            key, val = m[1], m[2]
            case[key] = int(val) if re.fullmatch(r"[+-]?[0-9]+", val) else {"true": True, "false": False}.get(val, val)
        cases.append(case)
    if not cases:
        raise DefinitionError(f"tests file {path} holds no cases")
    return cases


def load_task(problem_dir: Path) -> dict:
    """task.yml of the problem, validated enough that later errors cannot come from it."""
    import yaml

    path = problem_dir / "task.yml"
    try:
        task = yaml.safe_load(path.read_text())
    except OSError as e:
        raise DefinitionError(f"cannot read {path}: {e}") from None
    except yaml.YAMLError as e:
        raise DefinitionError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(task, dict):
        raise DefinitionError(f"{path}: top level must be a mapping, got {type(task).__name__}")
    for key in ("tests", "benchmarks"):
        cases = task.get(key)
        if not isinstance(cases, list) or not cases:
            raise DefinitionError(f"{path}: key `{key}` must be a non-empty list of cases")
        for i, case in enumerate(cases):
            if not isinstance(case, dict) or not all(isinstance(v, (int, bool)) for v in case.values()):
                raise DefinitionError(f"{path}: {key}[{i}] must map names to integers or booleans, got {case!r}")
    for key in ("test_timeout", "benchmark_timeout", "ranked_timeout"):
        value = task.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise DefinitionError(f"{path}: key `{key}` must be a positive number of seconds, got {value!r}")
    return task


def validate_cases(cases: list[dict], generate_input, where: str) -> None:
    """Every case must bind to generate_input's parameters and carry an integer seed."""
    sig = inspect.signature(generate_input)
    for i, case in enumerate(cases):
        try:
            sig.bind(**case)
        except TypeError as e:
            raise DefinitionError(f"{where}: case {i} ({spec_string(case)}): {e}; "
                                  f"generate_input takes {list(sig.parameters)}") from None
        if not isinstance(case.get("seed"), int) or isinstance(case.get("seed"), bool):
            raise DefinitionError(f"{where}: case {i} ({spec_string(case)}) needs an integer `seed`")


def make_cases(cases: list[dict], seed: int | None) -> list[TestCase]:
    out = []
    for case in cases:
        args = dict(case)
        spec = spec_string(args)
        if seed is not None and "seed" in args:
            args["seed"] = combine_seeds(args["seed"], seed)
        out.append(TestCase(args=args, spec=spec))
    return out


# ---------------------------------------------------------------------------------------------
# Statistics (computed by the judge from the times the worker reports)
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Stats:
    runs: int
    mean: float
    std: float
    err: float
    best: float
    worst: float


def calculate_stats(durations: list[float]) -> Stats:
    runs = len(durations)
    avg = sum(durations) / runs
    std = math.sqrt(sum((x - avg) ** 2 for x in durations) / (runs - 1)) if runs > 1 else 0.0
    return Stats(runs=runs, mean=avg, std=std, err=std / math.sqrt(runs), best=float(min(durations)),
                 worst=float(max(durations)))


def trimmed_mean(values: list[float], trim: float = TRIM) -> float:
    """Mean of values without the largest `trim` fraction of them."""
    keep = sorted(values)[: max(1, len(values) - int(trim * len(values)))]
    return sum(keep) / len(keep)


# ---------------------------------------------------------------------------------------------
# Operating-system guards: the judge out of the worker's reach, the worker confined (Linux)
# ---------------------------------------------------------------------------------------------
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 4, 36, 38
PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 28, 47, 4
# SECBIT_NOROOT, NO_SETUID_FIXUP, KEEP_CAPS_LOCKED, NO_CAP_AMBIENT_RAISE and their locks: a root
# worker does not get its capabilities back by exec'ing anything.
SECUREBITS_LOCKED_DOWN = 0b11101111


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def protect_judge() -> None:
    """The judge is not dumpable, so that a process of the same user (the worker) can neither ptrace
    it nor open its /proc files (fd, mem, environ); and it is the subreaper of everything it starts,
    so that a worker's detached descendants stay in its tree, where stop() finds them."""
    libc = _libc()
    if libc is None or not sys.platform.startswith("linux"):
        return
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


# Landlock (Linux 5.13+): the worker may write only under its sandbox, the device nodes and a compile
# cache the host named; it cannot ptrace, open /proc files of, or (ABI 6+) signal any process outside
# its own domain. Rights: file writes, removals, creations, rename/link across dirs (ABI 2), truncation
# (ABI 3), device ioctls (ABI 5).
_LL_WRITE_RIGHTS = ((1, (1 << 1) | (1 << 4) | (1 << 5) | (0x7F << 6)), (2, 1 << 13), (3, 1 << 14), (5, 1 << 15))
_LL_SCOPE_SOCKETS, _LL_SCOPE_SIGNALS = 0b01, 0b10  # ABI 6: abstract unix sockets, signals
# Of those, what writing into existing files takes (WRITE_FILE, TRUNCATE, IOCTL_DEV): the rights on the
# devices a worker opens (WORKER_DEVICES), so that no entry of /dev can be removed, renamed over or added
# (a regular file in place of /dev/null would outlive the run); /dev/shm has them all.
_LL_FILE_RIGHTS = (1 << 1) | (1 << 14) | (1 << 15)


class _LandlockRulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _LandlockPathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


# The device files a worker may open for writing (and ioctl): the null devices, random, its terminal, and the
# GPU's (the CUDA driver's /dev/nvidia*). Not the rest of /dev (/dev/kvm, /dev/userfaultfd, disks).
WORKER_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx",
                  "/dev/pts", "/dev/nvidia*")


def worker_devices() -> tuple[str, ...]:
    return tuple(p for pattern in WORKER_DEVICES for p in sorted(glob.glob(pattern)))


def confine_worker(writable: list[str], under_ncu: bool = False, lowest_priority: bool = True,
                   files_only: tuple[str, ...] | None = None) -> list[str]:
    """Run in the worker before it imports torch or the submission; returns what holds, in words.
    writable: folders it may write anything under; files_only: files, or folders of files, it may write
    (_LL_FILE_RIGHTS: adding, removing and renaming nothing there), by default worker_devices().
    under_ncu: under the profiler, whose library in the worker shares a temp folder with the profiler's
    process (TMPDIR, else /tmp: writable too) and may reach it by an abstract socket (not scoped).
    lowest_priority: nice 19 for the submission's worker (and every process it starts), which it cannot
    undo without capabilities, so that work it does between its calls cannot crowd out the judge or the
    null submission while they measure the protocol's overhead (the baseline its times are checked
    against)."""
    held = []
    if lowest_priority:
        os.setpriority(os.PRIO_PROCESS, 0, 19)
        held.append("nice 19")
        try:  # and no way back, whatever limits the runner grants: no nice under 19, no real-time policy
            import resource

            resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
            resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
        except (ImportError, OSError, ValueError, AttributeError):
            pass
        try:  # its session's scheduling group too (sched_autogroup weighs nice only within a group)
            Path("/proc/self/autogroup").write_text("19")
            held.append("autogroup nice 19")
        except OSError:
            pass
    libc = _libc()
    if libc is None or not sys.platform.startswith("linux"):
        return held + ["no confinement (not Linux)"]
    if _capabilities_effective():
        libc.prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKED_DOWN, 0, 0, 0)
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text()) if Path("/proc/sys/kernel/cap_last_cap").exists() else 40
        for cap in range(last + 1):
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        data = (ctypes.c_uint32 * 6)()
        if libc.capset(header, data) != 0 or _capabilities_effective():
            raise RuntimeError(f"could not drop the worker's capabilities: {os.strerror(ctypes.get_errno())}")
        held.append("no capabilities")
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    held.append(_install_syscall_filter(libc))
    abi = libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # landlock_create_ruleset(VERSION)
    if abi < 1:
        held.append("no Landlock on this kernel: the submission's process can write what this user can "
                    "write and signal the judge; the judge checks its own files when the run ends")
        return held
    rights = 0
    for min_abi, bits in _LL_WRITE_RIGHTS:
        rights |= bits if abi >= min_abi else 0
    scope = 0 if abi < 6 else _LL_SCOPE_SIGNALS if under_ncu else _LL_SCOPE_SIGNALS | _LL_SCOPE_SOCKETS
    attr = _LandlockRulesetAttr(rights, 0, scope)
    if under_ncu:
        writable = [*writable, os.environ.get("TMPDIR") or "/tmp"]
    ruleset = libc.syscall(444, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise RuntimeError(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        files_only = worker_devices() if files_only is None else files_only
        for path, allowed in [(p, rights) for p in writable] + [(p, rights & _LL_FILE_RIGHTS) for p in files_only]:
            if not os.path.isdir(path) and (allowed != rights & _LL_FILE_RIGHTS or not os.path.exists(path)):
                continue  # a rule on a file takes file rights only
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _LandlockPathBeneath(allowed, fd)
                if libc.syscall(445, ruleset, 1, ctypes.byref(rule), 0) != 0:
                    raise RuntimeError(f"landlock_add_rule({path}): {os.strerror(ctypes.get_errno())}")
            finally:
                os.close(fd)
        if libc.syscall(446, ruleset, 0) != 0:
            raise RuntimeError(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    held.append(f"Landlock ABI {abi}: writes only under its sandbox, /dev/shm and its threads' /proc, and into "
                f"the null, random, terminal and GPU devices (adding or removing nothing in /dev), no ptrace or /proc access to "
                f"the judge" + (", no signals to it" if abi >= 6 else
                                " (this kernel cannot scope signals: the submission can signal the judge)")
                + ("; under ncu (POPCORN_NCU) its temp folder is writable too, the profiler's" if under_ncu else ""))
    return held


# seccomp (Linux), in the worker and in everything it starts. setsid and setpgid fail (EPERM), so that all of
# them stay in the worker's process group, which the judge kills as one: a group kill cannot be outrun by
# forking (a fork under way when it arrives does not complete), where a search of /proc for descendants
# can be by a chain of processes that each fork and exit. The calls that set another process's limits,
# priorities, CPUs or scheduling fail unless they name the caller (_SELF_ONLY_CALLS): the judge runs as
# the same user, and lowering its limits (RLIMIT_CPU, RLIMIT_NOFILE) would kill it or fail its work, and
# its priority or CPUs slow the host that watches its clock; neither Landlock nor the judge's
# non-dumpable flag rules them. The kernel keyrings and the SysV and POSIX message queues fail: state there
# outlives the run and is no path, so Landlock does not rule it, and no submission needs it; on i386, whose
# older `ipc` call multiplexes msgget (and the rest of SysV IPC), that call as a whole.
# Syscall numbers by audit arch.
_DENIED_CALLS = {  # setsid, setpgid, add_key, request_key, keyctl, msgget, mq_open (i386: and ipc)
    0xC000003E: (112, 109, 248, 249, 250, 68, 240),   # x86_64
    0x40000003: (66, 57, 286, 287, 288, 399, 277, 117),  # i386
    0xC00000B7: (157, 154, 217, 218, 219, 186, 180),  # aarch64
}
# (call, its target argument): prlimit64 (pid), ioprio_set (who), setpriority (who), sched_setaffinity,
# sched_setscheduler, sched_setparam, sched_setattr (pid). Refused unless the target is 0, the caller (its
# process group for setpriority's PRIO_PGRP): the judge runs as the same user, and its CPUs, priority and
# policy are the worker's to set otherwise (its host watches the clock's end).
_SELF_ONLY_CALLS = {
    0xC000003E: ((302, 0), (251, 1), (141, 1), (203, 0), (144, 0), (142, 0), (314, 0)),
    0x40000003: ((340, 0), (289, 1), (97, 1), (241, 0), (156, 0), (154, 0), (351, 0)),
    0xC00000B7: ((261, 0), (30, 1), (140, 1), (122, 0), (119, 0), (118, 0), (274, 0)),
}
# (call, argument, value) refused whatever else: ioprio_set's `which` IOPRIO_WHO_USER and setpriority's
# PRIO_USER, whose `who` 0 means every process of the caller's user (the judge's among them).
_DENIED_WHEN = {
    0xC000003E: ((251, 0, 3), (141, 0, 2)),
    0x40000003: ((289, 0, 3), (97, 0, 2)),
    0xC00000B7: ((30, 0, 3), (140, 0, 2)),
}
_X32_SYSCALL_BIT = 0x40000000
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def worker_syscall_filter() -> bytes:
    """The classic-BPF seccomp program: per known arch, _DENIED_CALLS (and x32 calls) -> EPERM,
    _DENIED_WHEN -> EPERM for that argument's value, and _SELF_ONLY_CALLS -> EPERM unless their target
    argument is 0; the rest allowed; a call of an arch the table does not know kills the process (its
    numbers are another table's, which the filter cannot read)."""
    allow, deny, kill = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x80000000  # SECCOMP_RET_KILL_PROCESS
    # (op, k, jump if true, jump if false): jumps name labels; None is the next instruction
    prog = [("ld", 4, None, None)]  # seccomp_data.arch
    for arch, denied in _DENIED_CALLS.items():
        prog += [("jeq", arch, None, f"after {arch}"), ("ld", 0, None, None)]  # seccomp_data.nr
        if arch == 0xC000003E:
            prog.append(("jge", _X32_SYSCALL_BIT, "deny", None))
        prog += [("jeq", nr, "deny", None) for nr in denied]
        prog += [("jeq", nr, f"{arch} when {nr}", None) for nr, _, _ in _DENIED_WHEN[arch]]
        prog += [("jeq", nr, f"{arch} arg {arg}", None) for nr, arg in _SELF_ONLY_CALLS[arch]]
        prog.append(("ret", allow, None, None))
        self_only = dict(_SELF_ONLY_CALLS[arch])
        for nr, arg, value in _DENIED_WHEN[arch]:  # then on to its self-only check, if it has one
            after = f"{arch} arg {self_only[nr]}" if nr in self_only else "allow"
            prog += [("label", f"{arch} when {nr}", None, None),
                     ("ld", 16 + 8 * arg, None, None),
                     ("jeq", value, "deny", after)]
        for arg in sorted({arg for _, arg in _SELF_ONLY_CALLS[arch]}):
            prog += [("label", f"{arch} arg {arg}", None, None),
                     ("ld", 16 + 8 * arg, None, None),  # seccomp_data.args[arg], low word (a pid_t / int)
                     ("jeq", 0, "allow", "deny")]
        prog.append(("label", f"after {arch}", None, None))
    prog += [("ret", kill, None, None),  # an arch the table does not know (32-bit ARM on an aarch64 kernel)
             ("label", "allow", None, None), ("ret", allow, None, None),
             ("label", "deny", None, None), ("ret", deny, None, None)]
    at, n = {}, 0
    for op, k, _, _ in prog:
        if op == "label":
            at[k] = n
        else:
            n += 1
    opcodes = {"ld": 0x20, "jeq": 0x15, "jge": 0x35, "ret": 0x06}
    code, i = [], 0
    for op, k, if_true, if_false in prog:
        if op == "label":
            continue
        jt, jf = ((0 if j is None else at[j] - (i + 1)) for j in (if_true, if_false))
        code.append(struct.pack("<HBBI", opcodes[op], jt, jf, k))
        i += 1
    return b"".join(code)


def _install_syscall_filter(libc) -> str:
    program = ctypes.create_string_buffer(worker_syscall_filter())
    fprog = _SockFprog(len(program.raw) // 8, ctypes.cast(program, ctypes.c_void_p))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return (f"no seccomp ({os.strerror(ctypes.get_errno())}): a process it starts can leave its process "
                f"group; the judge then finds it in /proc")
    return ("seccomp: it and what it starts stay in its process group, set no other process's limits, "
            "priorities, CPUs or scheduling, and have no keyrings or message queues")


def _read_or_empty(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _capabilities_effective() -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16) != 0
    except OSError:
        pass
    return os.geteuid() == 0


def _stat_fields(path: str) -> list[str]:
    """The fields of a /proc .../stat file after the command name (state first); OSError if it is gone."""
    stat = Path(path).read_text()
    return stat[stat.rindex(")") + 2:].split()


def _process_tree() -> dict[int, list[int]]:
    """parent pid -> live child pids, from /proc (zombies left out)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat_fields(f"/proc/{entry}/stat")
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def _signal_all(pids, sig: int, groups: bool = False) -> None:
    """sig to each of pids (process groups, with groups=True); one that is gone already is no error."""
    for pid in pids:
        try:
            (os.killpg if groups else os.kill)(pid, sig)
        except OSError:
            pass


def kill_descendants(keep: set[int], unreaped: set[int] = frozenset()) -> None:
    """SIGKILL every descendant of this process except the subtrees rooted at `keep`, until none is
    left (a descendant that forks while this runs is found on the next pass); reap those that became
    the judge's children, except `unreaped` (processes whose Popen object reaps them)."""
    if not Path("/proc/self/stat").exists():
        return
    for _ in range(200):
        found = _descendants(keep)
        if not found:
            return
        _signal_all(found, signal.SIGKILL)
        for pid in found:
            if pid not in unreaped:
                try:
                    os.waitpid(pid, 0)  # the orphans it adopted are the judge's to reap
                except ChildProcessError:
                    pass


def kill_process_group(pgid: int, limit_s: float = 5.0) -> None:
    """SIGKILL the process group until no member is left (its members cannot leave it: worker_syscall_filter),
    reaping those that became the judge's children (a zombie still counts as a member)."""
    give_up = time.monotonic() + limit_s
    while time.monotonic() < give_up:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        try:
            while os.waitid(os.P_PGID, pgid, os.WEXITED | os.WNOHANG) is not None:
                pass
        except ChildProcessError:
            pass
        time.sleep(0.001)


def remove_tree(path: Path) -> None:
    """A directory gone, whatever a worker left in it (a tree too deep for shutil's recursion, folders it
    took its own permissions from); never raises."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        pass
    if path.exists():
        subprocess.run(["chmod", "-R", "u+rwx", str(path)], capture_output=True)
        subprocess.run(["rm", "-rf", "--", str(path)], capture_output=True)


class Warden:
    """A process forked from the judge at its start, in a session of its own, that cleans up if the judge
    dies before it has said it is done (a runner kills it past its time limit): it kills every worker's
    process group and removes the sandboxes. A worker has a session of its own (so that the judge can
    kill its group as one), so without the warden it would outlive a killed judge, still running."""

    spared: set = set()  # the warden's pid: the judge's kills of its descendants leave it alone

    def __init__(self):
        self.fd = None
        if not sys.platform.startswith("linux"):
            return
        read_fd, write_fd = os.pipe()
        pid = os.fork()  # before the judge starts threads or imports torch
        if pid == 0:
            try:
                os.close(write_fd)
                os.setsid()  # out of the judge's group, which a runner may kill as one
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)
                # nothing of the judge's held open (POPCORN_FD, its stdout): its readers see EOF on time
                os.closerange(3, read_fd)
                os.closerange(read_fd + 1, 1 << 16)
                Warden._watch(read_fd)
            finally:
                os._exit(0)
        os.close(read_fd)
        self.fd = write_fd
        Warden.spared = {pid}

    @staticmethod
    def _watch(fd: int) -> None:
        groups, dirs, pending = set(), set(), b""
        while chunk := os.read(fd, 4096):
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                what, _, arg = line.decode().partition(" ")
                if what == "done":
                    return
                if what == "group":
                    groups.add(int(arg))
                elif what == "ended":
                    groups.discard(int(arg))
                elif what == "dir":
                    dirs.add(arg)
        for pgid in groups:  # the judge is gone without saying it was done
            kill_process_group(pgid)
        for path in dirs:
            remove_tree(Path(path))

    def tell(self, line: str) -> None:
        if self.fd is not None:
            try:
                os.write(self.fd, (line + "\n").encode())
            except OSError:  # the warden is gone (killed on a machine without Landlock's scoping)
                self.fd = None

    def done(self) -> None:
        """The judge has cleaned up itself: the warden exits without touching anything."""
        self.tell("done")
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _children(pid: int) -> list[int]:
    """A process's children (zombies too), from each of its threads' /proc children list."""
    found = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                found += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
            except OSError:
                pass
    except OSError:
        pass
    return found


def _descendants(keep: set[int]) -> list[int]:
    """Every descendant of this process (zombies left out), except the subtrees rooted at `keep`: down the
    tree's children lists where the kernel keeps them (a few files), else from a scan of all of /proc."""
    me = os.getpid()
    keep = set(keep) | Warden.spared
    if Path(f"/proc/{me}/task/{me}/children").exists():
        children = _children
    else:
        tree = _process_tree()
        children = lambda pid: tree.get(pid, [])  # noqa: E731
    found, todo = [], [me]
    while todo:
        for child in children(todo.pop()):
            if child not in keep and child not in found:
                found.append(child)
                todo.append(child)
    return [pid for pid in found if _state(pid) not in ("Z", "")]


def _state(pid: int) -> str:
    try:
        return _stat_fields(f"/proc/{pid}/stat")[0]
    except (OSError, IndexError):
        return ""


def _thread_states_and_cpu(pid: int) -> tuple[set[str], tuple[int, int]] | None:
    """The states of a process's threads and the CPU time they have had (ns from schedstat, where the
    kernel keeps it, and clock ticks), or None once it is gone."""
    states, ns, ticks = set(), 0, 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            fields = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
            states.add(fields[0])
            ticks += int(fields[11]) + int(fields[12])  # utime + stime
            try:
                ns += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    except (OSError, ValueError, IndexError):
        return None
    return states, (ns, ticks)


class DescendantsStopped:
    """Context manager: SIGSTOP `groups` (process groups: the workers') and every descendant of this process
    except the subtrees rooted at `keep`, until every thread of every one of them shows as stopped (passes:
    a stopped process cannot fork; a sibling that was still running may have sent one SIGCONT), and SIGCONT
    them afterwards. ran(): those that have had CPU time since (something resumed them), whose work the
    judge cannot rule out."""

    def __init__(self, keep: set[int], groups: list[int] = ()):
        self.keep, self.groups, self.cpu = keep, list(groups), {}

    def __enter__(self) -> "DescendantsStopped":
        if not Path("/proc/self/stat").exists():
            return self
        # first the workers' process groups, each at once: no member forks past it
        _signal_all(self.groups, signal.SIGSTOP, groups=True)
        give_up = time.monotonic() + 2.0
        while True:
            new = [pid for pid in _descendants(self.keep) if pid not in self.cpu]
            self.cpu.update(dict.fromkeys(new))
            _signal_all(new, signal.SIGSTOP)
            while True:  # a signal takes a moment to arrive; one resumed meanwhile is stopped again
                running = [pid for pid in self.cpu if not self._stopped(pid)]
                if not running or time.monotonic() > give_up:
                    break
                _signal_all(running, signal.SIGSTOP)
                time.sleep(0.0002)
            if not new or time.monotonic() > give_up:  # a pass that finds no new process: all are stopped
                break
        self.cpu = self._settled_cpu()
        return self

    def _settled_cpu(self) -> dict:
        """Each stopped process's CPU time, read until two readings agree: a thread shows as stopped a
        moment before the scheduler has booked its last slice."""
        def reading():
            return {pid: (seen[1] if seen is not None else None)
                    for pid, seen in ((pid, _thread_states_and_cpu(pid)) for pid in self.cpu)}

        last = reading()
        for _ in range(20):
            time.sleep(0.0005)
            now = reading()
            if now == last:
                break
            last = now
        return last

    @staticmethod
    def _stopped(pid: int) -> bool:
        seen = _thread_states_and_cpu(pid)
        return seen is None or seen[0] <= {"T", "t", "Z", "X"}

    def ran(self) -> list[int]:
        out = []
        for pid, before in self.cpu.items():
            seen = _thread_states_and_cpu(pid)
            if seen is not None and before is not None and (seen[1][0] > before[0] or seen[1][1] > before[1]):
                out.append(pid)
        return out

    def __exit__(self, *exc) -> None:
        _signal_all(self.groups, signal.SIGCONT, groups=True)
        _signal_all(self.cpu, signal.SIGCONT)


# ---------------------------------------------------------------------------------------------
# CUDA driver calls (ctypes): allocations shared by IPC handle, host-memory registration, the hold
# ---------------------------------------------------------------------------------------------
class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class CudaDriver:
    """The few driver calls torch does not expose, made in torch's (primary) context of this thread."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), _IpcHandle, ctypes.c_uint]
        self._call("cuInit", ctypes.c_uint(0))

    def _call(self, name, *args):
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(text))
            raise RuntimeError(f"{name}: CUDA error {rc} ({(text.value or b'unknown').decode()})")

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self._call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(nbytes))
        return ptr.value

    def ipc_handle(self, ptr: int) -> bytes:
        handle = _IpcHandle()
        self._call("cuIpcGetMemHandle", ctypes.byref(handle), ctypes.c_uint64(ptr))
        return bytes(handle)  # all 64 bytes (the field itself would stop at the first zero byte)

    def ipc_open(self, handle: bytes) -> int:
        ptr = ctypes.c_uint64()
        self._call("cuIpcOpenMemHandle_v2", ctypes.byref(ptr), _IpcHandle.from_buffer_copy(handle), 1)
        return ptr.value

    def host_register(self, addr: int, nbytes: int) -> int:
        """Pins host memory for the device (portable, mapped); returns its device address."""
        self._call("cuMemHostRegister_v2", ctypes.c_void_p(addr), ctypes.c_size_t(nbytes), ctypes.c_uint(3))
        dev = ctypes.c_uint64()
        self._call("cuMemHostGetDevicePointer_v2", ctypes.byref(dev), ctypes.c_void_p(addr), ctypes.c_uint(0))
        return dev.value

    def function(self, ptx: str, name: str):
        """Entry `name` of a PTX body (one of the _..._PTX below), loaded after the common header."""
        module, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self._call("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p((_PTX_HEADER + ptx).encode()))
        self._call("cuModuleGetFunction", ctypes.byref(fn), module, name.encode())
        return fn

    def launch(self, fn, grid: int, block: int, stream: int, args) -> None:
        params = (ctypes.c_void_p * len(args))(*(ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args))
        self._call("cuLaunchKernel", fn, ctypes.c_uint(grid), ctypes.c_uint(1), ctypes.c_uint(1),
                   ctypes.c_uint(block), ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_uint(0),
                   ctypes.c_void_p(stream), params, None)

    def reset_persisting_l2(self) -> None:
        """Lines a submission marked persisting (cudaAccessPolicyWindow) become evictable again."""
        self._call("cuCtxResetPersistingL2Cache")


class _CudaArray:
    """A raw device allocation as __cuda_array_interface__, for torch.as_tensor (no copy)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


# Every PTX module below targets sm_70 and up (the hold, spin and stamp use only %globaltimer,
# relaxed system-scope loads and nanosleep).
_PTX_HEADER = ".version 7.0\n.target sm_70\n.address_size 64\n"

# The hold: a kernel that lets go when the judge writes a release count >= target into host memory.
# A timed call is queued behind two of them (hold_targets): one launch that fills every SM's thread slots
# (so no kernel of the worker's, on any stream, can start beside it while custom_kernel runs on the host),
# then one block that first writes its target to `announce` (so the judge knows the full hold has left
# the SMs) and spins while the judge writes the inputs and flushes L2. The GPU takes the SMs from a
# spinning hold for the judge's work and gives them back; for the full hold that leaves the call behind it
# ~6 us slower on inputs over ~100 MB (docs/judge.md), for one block it leaves nothing measurable.
_HOLD_PTX = r"""
.visible .entry eval_hold(.param .u64 flag, .param .u32 target, .param .u64 timeout_ns, .param .u64 announce,
                          .param .u64 let_go_at)
{
    .reg .pred %p<4>;
    .reg .b32 %r<5>;
    .reg .b64 %rd<8>;
    mov.u32 %r0, %tid.x;
    setp.ne.u32 %p0, %r0, 0;
    @%p0 bra DONE;
    ld.param.u64 %rd0, [flag];
    ld.param.u32 %r1, [target];
    ld.param.u64 %rd1, [timeout_ns];
    ld.param.u64 %rd5, [announce];
    setp.eq.u64 %p3, %rd5, 0;
    @!%p3 st.relaxed.sys.global.u32 [%rd5], %r1;
    mov.u64 %rd2, %globaltimer;
    add.u64 %rd3, %rd2, %rd1;
POLL:
    ld.relaxed.sys.global.u32 %r2, [%rd0];
    sub.s32 %r3, %r2, %r1;
    setp.ge.s32 %p1, %r3, 0;
    @%p1 bra LET_GO;
    mov.u64 %rd4, %globaltimer;
    setp.gt.u64 %p2, %rd4, %rd3;
    @%p2 bra LET_GO;
    nanosleep.u32 200;
    bra POLL;
LET_GO:
    ld.param.u64 %rd6, [let_go_at];
    setp.eq.u64 %p3, %rd6, 0;
    mov.u64 %rd7, %globaltimer;
    @!%p3 st.relaxed.sys.global.u64 [%rd6], %rd7;
DONE:
    bar.sync 0;
    ret;
}
"""


# Byte offsets in the release page: the release count the holds poll; the one-block hold's announcement;
# the GPU time (%globaltimer) at which the one-block hold let go, which the judge reads back for the
# breakdown of its clock (TimedCall.parts; the worker's word, shown, never ranked); the worker's signal
# that a call's output is staged (the call's number) and, written before it, the output's digest (16 bytes).
RELEASE_AT, ANNOUNCE_AT, LET_GO_AT, STAGED_AT, DIGEST_AT = 0, 8, 16, 24, 32
ONE_BLOCK_HOLD = (1, 32)  # (blocks, threads a block) of the hold the judge's work takes the SMs from


def hold_targets(seq: int) -> tuple[int, int]:
    """Release counts of timed call seq: the full-SM hold lets go at the first, the one-block hold (and so
    the call) at the second."""
    return 2 * seq - 1, 2 * seq


def hold_grid(torch) -> tuple[int, int]:
    """(blocks, threads a block) of the hold: every SM's thread slots filled, so no other kernel of the
    worker's context can start beside it."""
    props = torch.cuda.get_device_properties(0)
    per_sm = getattr(props, "max_threads_per_multi_processor", 2048)
    blocks_per_sm = -(-per_sm // 1024)
    return props.multi_processor_count * blocks_per_sm, per_sm // blocks_per_sm


# The null submission's stand-in for a call's work: one thread that spins for a given time, so that the
# null protocol keeps the GPU (and the judge, waiting) busy as long as the measured call did.
_SPIN_PTX = r"""
.visible .entry eval_spin(.param .u64 duration_ns)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd0, [duration_ns];
    mov.u64 %rd1, %globaltimer;
    add.u64 %rd2, %rd1, %rd0;
SPIN:
    mov.u64 %rd3, %globaltimer;
    setp.lt.u64 %p0, %rd3, %rd2;
    @%p0 bra SPIN;
    ret;
}
"""


# The judge's clock on the GPU: one thread writes %globaltimer (ns) to an address, on the judge's stream.
# The clock starts at the stamp before it writes a call's inputs; the stamp after the release anchors the
# host's part of the clock (Judge.timed); the two after the worker's signal time the judge's copy of the
# output, off the clock (TimedCall.parts).
STAMPS = ("start", "released", "staged", "end")  # the judge's stamps of a timed call, in order
_STAMP_PTX = r"""
.visible .entry eval_stamp(.param .u64 out)
{
    .reg .b64 %rd<3>;
    ld.param.u64 %rd0, [out];
    mov.u64 %rd1, %globaltimer;
    st.global.u64 [%rd0], %rd1;
    ret;
}
"""


# The judge's release of a worker's holds: one thread writes the release count into the worker's release
# page (host memory both map), on the judge's stream, so that it follows the judge's inputs and flush
# with no host in between, and the same count into the judge's own page (GATE_RELEASED_AT), where the
# judge's host sees the moment of the release on its own clock.
_RELEASE_PTX = r"""
.visible .entry eval_release(.param .u64 flag, .param .u32 value, .param .u64 judge_at)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd0, [flag];
    ld.param.u32 %r0, [value];
    ld.param.u64 %rd1, [judge_at];
    membar.sys;
    st.relaxed.sys.global.u32 [%rd0], %r0;
    st.relaxed.sys.global.u32 [%rd1], %r0;
    ret;
}
"""
GATE_AT, GATE_RELEASED_AT = 0, 8  # byte offsets in the judge's page: its gate's count; the release's count


# The worker's signal that a timed call's output is staged: one thread copies the output's digest (two device
# int64, output_digest) into the release page and then, once that is visible to the host, the call's number.
# The judge's host acts on the first sighting of the number and holds the call to the digest it read then.
_SIGNAL_PTX = r"""
.visible .entry eval_signal(.param .u64 digest, .param .u64 digest_at, .param .u64 staged_at, .param .u32 seq)
{
    .reg .b32 %r<1>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd0, [digest];
    ld.param.u64 %rd1, [digest_at];
    ld.param.u64 %rd2, [staged_at];
    ld.param.u32 %r0, [seq];
    ld.global.u64 %rd3, [%rd0];
    ld.global.u64 %rd4, [%rd0+8];
    st.relaxed.sys.global.u64 [%rd1], %rd3;
    st.relaxed.sys.global.u64 [%rd1+8], %rd4;
    membar.sys;
    st.relaxed.sys.global.u32 [%rd2], %r0;
    ret;
}
"""


# The output's digest binds the output: a worker that signals before its output exists must name the digest
# of bytes it does not have yet, and then make its output fit it within the check's tolerance. A sum of the
# words (or of any function of each word) can be fitted so, by bending near-zero elements; this digest
# cannot: a Merkle tree over the output's 64-bit words, DIGEST_BLOCK words a node, whose compression
# mix(a + mix(b ^ k)) ^ a ^ b takes each argument in twice, so no node's inputs can be solved for from its
# value. Two lanes, each keyed by a 64-bit key drawn per call (so nothing computed before the call helps),
# give 128 bits: fitting an output means a search over about 2**64 outputs for each lane, where a worker
# has the ~150 us the GPU takes to switch back to the judge's context. The worker computes it with a
# Triton kernel (WorkerDigest), the judge with torch ops (output_digest); tests check that they agree.
DIGEST_BLOCK = 1024
DIGEST_LEVELS = DIGEST_BLOCK.bit_length() - 1
_DIGEST_MULTIPLIER = 0xBF58476D1CE4E5B9  # splitmix64's


def _as_int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def digest_key() -> list[int]:
    """A fresh key for one timed call: one signed 64-bit integer per lane."""
    return [_as_int64(secrets.randbits(64)) for _ in range(2)]


def digest_words(torch, flat):
    """A result region's bytes (a uint8 tensor) as 64-bit words, zero-padded to whole words."""
    if flat.numel() % 8:
        padded = torch.zeros(flat.numel() + 8 - flat.numel() % 8, dtype=torch.uint8, device=flat.device)
        padded[:flat.numel()] = flat
        flat = padded
    return flat.view(torch.int64)


def _digest_mix(x):
    """x ^= x >> 32 (logical), x *= M, x ^= x >> 29, on int64 tensors holding 64-bit patterns."""
    x = x ^ ((x >> 32) & 0xFFFFFFFF)
    x = x * _as_int64(_DIGEST_MULTIPLIER)
    return x ^ ((x >> 29) & ((1 << 35) - 1))


def output_digest(torch, flat, key: list[int]):
    """The keyed digest of a result region's bytes: two int64 (one per lane). Each pass maps every
    DIGEST_BLOCK words (the last block zero-padded) to one, leaves mixed with the key and pairs compressed
    level by level, until one word a lane is left; the first pass reads the bytes, the later ones each
    lane's own words. WorkerDigest computes the same on the GPU."""
    k = torch.tensor(key, dtype=torch.int64, device=flat.device).view(2, 1, 1)
    x = digest_words(torch, flat).view(1, -1)
    while True:
        n = x.shape[1]
        blocks = max(1, -(-n // DIGEST_BLOCK))
        y = torch.zeros((2, blocks * DIGEST_BLOCK), dtype=torch.int64, device=flat.device)
        y[:, :n] = x
        y = _digest_mix(y.view(2, blocks, DIGEST_BLOCK) ^ k)
        for _ in range(DIGEST_LEVELS):
            y = y.view(2, blocks, -1, 2)
            a, b = y[..., 0], y[..., 1]
            y = _digest_mix(a + _digest_mix(b ^ k)) ^ a ^ b
        x = y.view(2, blocks)
        if blocks == 1:
            return x.view(2)


# Triton's language, once WorkerDigest has imported it; until then a stand-in for the kernel's annotations.
tl = types.SimpleNamespace(constexpr="tl.constexpr")


def _digest_kernel(src, dst, key, n, lane_stride, BLOCK: tl.constexpr, LEVELS: tl.constexpr):
    """One pass of output_digest as a Triton kernel (WorkerDigest makes it one): program (block, lane) maps
    words [block * BLOCK, (block + 1) * BLOCK) of its lane's row of src (rows lane_stride apart: 0 on the
    first pass, where both lanes read the output) to dst[lane, block]."""
    block, lane = tl.program_id(0), tl.program_id(1)
    k = tl.load(key + lane).to(tl.uint64, bitcast=True)
    offs = block * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src + lane * lane_stride + offs, mask=offs < n, other=0).to(tl.uint64, bitcast=True)
    x = x ^ k
    x = x ^ (x >> 32)
    x = x * 0xBF58476D1CE4E5B9
    x = x ^ (x >> 29)
    for level in tl.static_range(LEVELS):
        a, b = tl.split(tl.reshape(x, (BLOCK >> (level + 1), 2)))
        x = b ^ k
        x = x ^ (x >> 32)
        x = x * 0xBF58476D1CE4E5B9
        x = a + (x ^ (x >> 29))
        x = x ^ (x >> 32)
        x = x * 0xBF58476D1CE4E5B9
        x = (x ^ (x >> 29)) ^ a ^ b
    tl.store(dst + lane * tl.num_programs(0) + block + tl.arange(0, 1), x.to(tl.int64, bitcast=True))


class WorkerDigest:
    """output_digest on the worker's stream, for its signal: a few launches of one Triton kernel, where the
    judge's torch ops take hundreds. Triton is imported only here, once the worker is confined."""

    def __init__(self, torch):
        import triton
        import triton.language

        globals()["tl"] = triton.language  # the name _digest_kernel's body uses
        self.torch = torch
        self.kernel = triton.jit(_digest_kernel, do_not_specialize=["n", "lane_stride"])
        self.key = torch.zeros(2, dtype=torch.int64, device="cuda")

    def load_key(self, key: list[int]) -> None:
        """The next digests' key, copied to the GPU now (before a call's holds, so the copy is off the clock)."""
        self.key.copy_(self.torch.tensor(key, dtype=self.torch.int64))

    def __call__(self, flat):
        """Queues the digest of flat (a uint8 tensor on the GPU) under the loaded key; returns its (2,) int64
        tensor."""
        torch = self.torch
        x, stride = digest_words(torch, flat), 0
        while True:
            n = x.numel() if stride == 0 else x.shape[1]
            blocks = max(1, -(-n // DIGEST_BLOCK))
            out = torch.empty((2, blocks), dtype=torch.int64, device=flat.device)
            self.kernel[(blocks, 2)](x, out, self.key, n, stride, BLOCK=DIGEST_BLOCK, LEVELS=DIGEST_LEVELS,
                                     num_warps=4)
            if blocks == 1:
                return out.view(2)
            x, stride = out, blocks


# The judge's quiet probe: one thread reads %globaltimer for a given time and writes the largest step
# between two reads. A step of more than a microsecond or so is a time slice the GPU gave to another
# context.
_QUIET_PROBE_PTX = r"""
.visible .entry eval_quiet_probe(.param .u64 out, .param .u64 duration_ns)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd0, [out];
    ld.param.u64 %rd1, [duration_ns];
    mov.u64 %rd2, %globaltimer;
    add.u64 %rd3, %rd2, %rd1;
    mov.u64 %rd4, 0;
READ:
    mov.u64 %rd5, %globaltimer;
    sub.u64 %rd6, %rd5, %rd2;
    max.u64 %rd4, %rd4, %rd6;
    mov.u64 %rd2, %rd5;
    setp.lt.u64 %p0, %rd5, %rd3;
    @%p0 bra READ;
    st.global.u64 [%rd0], %rd4;
    ret;
}
"""


# ---------------------------------------------------------------------------------------------
# Shared memory between the judge and a worker: regions, and the inputs' layout in them
# ---------------------------------------------------------------------------------------------
@functools.cache
def _dtypes() -> dict:
    """torch's dtypes by name ("torch.bfloat16"): how dtypes cross between the processes."""
    import torch

    return {str(v): v for v in vars(torch).values() if isinstance(v, torch.dtype)}


class SharedRegion:
    """Judge-owned memory that workers map: the arena (the worker's copy of the inputs) or the result
    (where the worker copies the output's bytes). On a GPU, a raw driver allocation shared by IPC handle
    and never returned to torch's caching allocator, so that a worker's mapping can never come to alias
    the judge's own tensors; regions live until the judge exits. On the CPU, a memfd handed to the
    worker over its socket and sealed against shrinking (a worker that could truncate it would make the
    judge's next access to it a SIGBUS), closed when a larger region replaces it (its memory goes once
    neither process maps it); where there is no memfd, a file in the sandbox."""

    def __init__(self, nbytes: int, cuda: bool, driver, directory: Path, name: str):
        import torch

        self.nbytes, self.cuda = max(int(nbytes), 1), cuda
        if cuda:
            ptr = driver.alloc(self.nbytes)
            self.tensor = torch.as_tensor(_CudaArray(ptr, self.nbytes))
            self.tensor.zero_()  # a fresh allocation may hold what the judge's context freed before
            self.handle = ("cuda", driver.ipc_handle(ptr), self.nbytes)
        elif hasattr(os, "memfd_create"):
            self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(self.fd, self.nbytes)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self._map = mmap.mmap(self.fd, self.nbytes)
            self.tensor = torch.frombuffer(self._map, dtype=torch.uint8)
            self.handle = ("memfd", name, self.nbytes)
        else:
            path = directory / name
            with open(path, "wb") as f:
                f.truncate(self.nbytes)
            self._file = open(path, "r+b")
            self._map = mmap.mmap(self._file.fileno(), self.nbytes)
            self.tensor = torch.frombuffer(self._map, dtype=torch.uint8)
            self.handle = ("file", name, self.nbytes)
            self._path = path

    def replaced(self) -> None:
        if self.handle[0] == "memfd":
            os.close(self.fd)
        elif self.handle[0] == "file":
            self._path.unlink(missing_ok=True)


def open_region(handle, driver, sandbox: Path, fd: int | None = None):
    """The worker's view of a SharedRegion: (uint8 tensor, object that keeps the mapping alive). fd: the
    memfd of a "memfd" region, received over the socket."""
    import torch

    kind, ref, nbytes = handle
    if kind == "cuda":
        return torch.as_tensor(_CudaArray(driver.ipc_open(ref), nbytes)), None
    if kind == "memfd":
        m = mmap.mmap(fd, nbytes)
        return torch.frombuffer(m, dtype=torch.uint8), m
    f = open(sandbox / ref, "r+b")
    m = mmap.mmap(f.fileno(), nbytes)
    return torch.frombuffer(m, dtype=torch.uint8), (f, m)


class InputLayout:
    """Where each tensor of an input lives in the arena. `structure` is the input with every tensor
    replaced by ("tensor", i); `specs[i]` is (byte offset, dtype, shape, strides). The worker builds
    its copy of the input as views of the arena from these (it never sees the judge's tensors)."""

    ALIGN = 512

    def __init__(self, data):
        self.tensors, self.specs, self.spans = [], [], []
        self.nbytes = 0
        self.structure = self._walk(data)

    def _walk(self, x):
        import torch

        if isinstance(x, torch.Tensor):
            span = 1 + sum((n - 1) * s for n, s in zip(x.shape, x.stride())) if x.numel() else 0
            offset = -(-self.nbytes // self.ALIGN) * self.ALIGN
            nbytes = span * x.element_size()
            self.tensors.append(x)
            self.specs.append((offset, str(x.dtype), tuple(x.shape), tuple(x.stride())))
            self.spans.append((offset, nbytes, x.is_floating_point() or x.dtype == torch.uint8))
            self.nbytes = offset + nbytes
            return ("tensor", len(self.tensors) - 1)
        if isinstance(x, (tuple, list)):
            return ("tuple" if isinstance(x, tuple) else "list", [self._walk(v) for v in x])
        if isinstance(x, dict):
            return ("dict", [(k, self._walk(v)) for k, v in x.items()])
        if x is None or isinstance(x, (bool, int, float, str)):
            return ("value", x)
        raise TypeError(f"generate_input returned a {type(x).__name__}; the judge can pass tensors, tuples, "
                        f"lists, dicts and plain values to the worker")

    def views(self, arena) -> list:
        return [arena_view(arena, spec) for spec in self.specs]

    def write(self, views) -> None:
        for view, tensor in zip(views, self.tensors):
            view.copy_(tensor)

    def poison(self, arena) -> None:
        """Every input byte garbage (0xFF: NaN for floats, for data bytes) or zero (indices), so that
        work done before the judge writes the call's inputs computes nothing of use."""
        for offset, nbytes, as_nan in self.spans:
            arena[offset:offset + nbytes].fill_(0xFF if as_nan else 0)


def arena_view(arena, spec):
    offset, dtype, shape, stride = spec
    dt = _dtypes()[dtype] if isinstance(dtype, str) else dtype
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
    flat = arena[offset:offset + span * dt.itemsize].view(dt)
    return flat.as_strided(shape, stride)


def build_input(structure, views):
    kind, body = structure
    if kind == "tensor":
        return views[body]
    if kind in ("tuple", "list"):
        items = [build_input(s, views) for s in body]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return {k: build_input(s, views) for k, s in body}
    return body


# ---------------------------------------------------------------------------------------------
# Messages: length-prefixed frames over a socket pair. The judge sends pickles (the worker trusts
# the judge); the worker sends JSON (the judge trusts nothing from it and unpickles nothing).
# ---------------------------------------------------------------------------------------------
_FRAME = struct.Struct("<I")


def send_frame(sock, payload: bytes) -> None:
    sock.sendall(_FRAME.pack(len(payload)) + payload)


def recv_exact(sock, n: int, deadline: float | None = None) -> bytes:
    """n bytes from sock. deadline (time.monotonic()): socket.timeout once it has passed, however the bytes
    arrive (a timeout per recv would restart with every byte a sender drips)."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("deadline passed in the middle of a message")
            sock.settimeout(left)
        chunk = sock.recv(n - got)
        if not chunk:
            raise EOFError("the other side closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_frame(sock, limit: int, deadline: float | None = None) -> bytes:
    (n,) = _FRAME.unpack(recv_exact(sock, _FRAME.size, deadline))
    if n > limit:
        raise ValueError(f"a message of {n} bytes (limit {limit})")
    return recv_exact(sock, n, deadline)


# Control characters (but newline and tab), Unicode line and paragraph separators (which str.splitlines
# breaks at) and the invisible format characters that reorder or hide text on a display.
_CONTROL_CHARACTERS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def printable(text: str) -> str:
    """Text from the submission's process as the judge prints it: control characters (terminal escapes,
    carriage returns) and lone surrogates written out as escapes, so that it can neither redraw the
    report on a terminal nor fail to encode; newlines and tabs stay."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _CONTROL_CHARACTERS.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256
                                   else f"\\u{ord(m.group()):04x}", text)


def from_submission(text: str) -> str:
    """Free text the submission's process sent (its error, a profile table), printable and every line
    marked as the submission's, so that none of it can pass for a line of the report; at most
    SUBMISSION_TEXT_LINES lines and SUBMISSION_TEXT_CHARS characters of it, with a note where it was cut."""
    text = str(text)
    shown = printable(text[:SUBMISSION_TEXT_CHARS])  # escapes lengthen it: cut again after them
    lines = shown[:SUBMISSION_TEXT_CHARS].splitlines()
    kept = lines[:SUBMISSION_TEXT_LINES]
    if len(kept) < len(lines) or len(text) > SUBMISSION_TEXT_CHARS or len(shown) > SUBMISSION_TEXT_CHARS:
        kept.append(f"... (cut: the submission's text ran to {len(text):,} characters; the first "
                    f"{min(len(lines), SUBMISSION_TEXT_LINES)} lines are shown)")
    return "\n".join(f"submission> {line}" for line in kept)


def _printable_message(obj):
    """A message from the worker with every string in it made printable."""
    if isinstance(obj, str):
        return printable(obj)
    if isinstance(obj, list):
        return [_printable_message(x) for x in obj]
    if isinstance(obj, dict):
        return {printable(str(k)): _printable_message(v) for k, v in obj.items()}
    return obj


# ---------------------------------------------------------------------------------------------
# Worker: runs in the submission's process. Nothing here is trusted by the judge: everything it
# reports is checked (outputs against the reference, times against the judge's clock).
# ---------------------------------------------------------------------------------------------
class WorkerSession:
    def __init__(self, sock, flag_fd: int, role: str, under_ncu: bool = False):
        self.sock, self.flag_fd, self.role, self.under_ncu = sock, flag_fd, role, under_ncu
        self.cuda = False
        self.kernel_fn = None
        self.seq, self.mimic_ns, self.null_early = 0, 0, False
        self.regions = {}
        self.data = self.result = None
        self.null_form = None
        self.ticket = None  # the judge's last request's, echoed in every answer

    def send(self, **msg) -> None:
        send_frame(self.sock, json.dumps({**msg, "ticket": self.ticket}).encode())

    def serve(self) -> None:
        while True:
            if self.cuda:  # poll before sleeping (POLL_S)
                poll_until = time.monotonic() + POLL_S
                while time.monotonic() < poll_until and not select.select([self.sock], [], [], 0)[0]:
                    pass
            try:
                msg = pickle.loads(recv_frame(self.sock, 1 << 30))
            except EOFError:
                return
            self.ticket = msg.pop("ticket", None)
            try:
                getattr(self, "op_" + msg.pop("op"))(**msg)
            except BaseException as e:
                self.send(kind="error", message=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-8)}")

    def setup(self) -> None:
        """Confinement first, before any code but this file's runs; then torch and the device."""
        self.sandbox = Path.cwd()
        # /proc/self/task: the CUDA driver names its threads there. Not the rest of /proc/self: its autogroup
        # file would let it raise its scheduling group's priority back from nice 19.
        confinement = confine_worker([str(self.sandbox), "/dev/shm", os.path.realpath("/proc/self/task")],
                                     under_ncu=self.under_ncu, lowest_priority=self.role != "null")
        import torch  # before the sandbox is on sys.path: no module an earlier worker left there runs in set-up

        self.torch, self.cuda = torch, torch.cuda.is_available()
        if self.cuda:
            torch.cuda.init()
            torch.empty(1, device="cuda")  # the primary context, current on this thread
            self.driver = CudaDriver()
            self.flag = mmap.mmap(self.flag_fd, 4096)
            flag_addr = ctypes.addressof(ctypes.c_char.from_buffer(self.flag))
            self.flag_dev = self.driver.host_register(flag_addr, 4096)
            self.hold_fn = self.driver.function(_HOLD_PTX, "eval_hold")
            self.spin_fn = self.driver.function(_SPIN_PTX, "eval_spin")
            self.signal_fn = self.driver.function(_SIGNAL_PTX, "eval_signal")
            self.digest = WorkerDigest(torch)
            self.digest(torch.zeros(8 * DIGEST_BLOCK + 1, dtype=torch.uint8, device="cuda"))  # compiled here
            self.hold_shape = hold_grid(torch)
            self.start_event = torch.cuda.Event(enable_timing=True)
            self.end_event = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
        else:
            self.driver = None
        # the submission's imports come from the sandbox (started with -P, Python put no folder first)
        if getattr(sys.flags, "safe_path", False):
            sys.path.insert(0, str(self.sandbox))
        else:
            sys.path[0] = str(self.sandbox)
        self.send(kind="ready", confinement=confinement, cuda=self.cuda)

    def kernel(self):
        if self.role == "null":
            return self._null_kernel
        if self.kernel_fn is None:
            import importlib.util

            path = self.sandbox / (OTHER_SUBMISSION if self.role == "other" else "submission.py")
            spec = importlib.util.spec_from_file_location("submission", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules["submission"] = module
            spec.loader.exec_module(module)
            if not callable(getattr(module, "custom_kernel", None)):
                raise AttributeError("the submission defines no function custom_kernel(data)")
            self.kernel_fn = module.custom_kernel
        return self.kernel_fn

    def op_map(self, arena, result, layout, form):
        memfds = [h for h in (arena, result) if h[0] == "memfd"]
        fds = socket.recv_fds(self.sock, 1, len(memfds))[1] if memfds else []  # sent right after this message
        self.data = self.result = None  # the views of regions the judge has replaced go with them
        self.regions = {h: r for h, r in self.regions.items() if h in (arena, result)}
        try:
            for handle in (arena, result):
                if handle not in self.regions:
                    fd = fds[memfds.index(handle)] if handle in memfds else None
                    self.regions[handle] = open_region(handle, self.driver, self.sandbox, fd)
        finally:
            for fd in fds:
                os.close(fd)
        structure, specs = layout
        views = [arena_view(self.regions[arena][0], spec) for spec in specs]
        self.data = build_input(structure, views)
        self.result = self.regions[result][0]
        self.null_form = form
        self.send(kind="mapped")

    def _null_kernel(self, data):
        """An empty output of the right form, after as long as the call being calibrated took: on the GPU
        a spin kernel of that length, on the CPU a busy wait. For a call that was released before it
        returned, the null first waits on the host for its release, as such a call does."""
        shape, dtype, device = self.null_form
        if self.null_early:
            give_up = time.monotonic() + HOLD_TIMEOUT_NS / 1e9
            released = hold_targets(self.seq)[1]
            while struct.unpack_from("<i", self.flag, RELEASE_AT)[0] - released < 0 and time.monotonic() < give_up:
                pass
        if self.mimic_ns > 0:
            if self.cuda:
                self.driver.launch(self.spin_fn, 1, 1, self.torch.cuda.current_stream().cuda_stream,
                                   [ctypes.c_uint64(int(self.mimic_ns))])
            else:
                end = time.perf_counter_ns() + self.mimic_ns
                while time.perf_counter_ns() < end:
                    pass
        return self.torch.empty(shape, dtype=_dtypes()[dtype], device=device)

    def _stage(self, out) -> dict:
        """Copies the output's bytes into the result region (on the current stream): what the judge
        checks is those bytes, whatever object the submission returned."""
        torch = self.torch
        if not isinstance(out, torch.Tensor):
            return {"tensor": False, "type": type(out).__name__}
        with torch._C.DisableTorchFunctionSubclass():
            t = torch.Tensor.as_subclass(out, torch.Tensor).detach()
            nbytes = t.numel() * t.element_size()
            meta = {"tensor": True, "dtype": str(t.dtype), "shape": list(t.shape), "device": t.device.type,
                    "nbytes": nbytes, "copied": nbytes == self.result.numel()}
            if meta["copied"] and nbytes:
                self.result.copy_(t.contiguous().reshape(-1).view(torch.uint8))
            self._staged = t
        return meta

    def op_call(self):
        """One untimed call; `changed` says whether the output still changed after the call returned."""
        out = self.kernel()(self.data)
        meta = self._stage(out)
        if self.cuda:
            self.torch.cuda.synchronize()
        changed = False
        if meta.get("copied") and meta["nbytes"]:
            now = self._staged.contiguous().reshape(-1).view(self.torch.uint8)
            changed = not self.torch.equal(now.to(self.result.device), self.result)
        self.send(kind="done", output=meta, changed=changed)

    def op_timed(self, seq: int, key: list, mimic_ns: float = 0, early: bool = False):
        """One timed call; key, the digest's for this call's signal (output_digest)."""
        self.seq, self.mimic_ns, self.null_early = seq, mimic_ns, early
        gc.disable()
        try:
            if self.cuda:
                self.digest.load_key(key)
            (self._timed_gpu if self.cuda else self._timed_cpu)(seq)
        finally:
            gc.enable()

    def _timed_gpu(self, seq: int):
        torch = self.torch
        torch.cuda.synchronize()
        stream = torch.cuda.current_stream()
        full, one_block = hold_targets(seq)
        for shape, target, announce, let_go in ((self.hold_shape, full, 0, 0),
                                                (ONE_BLOCK_HOLD, one_block, self.flag_dev + ANNOUNCE_AT,
                                                 self.flag_dev + LET_GO_AT)):
            self.driver.launch(self.hold_fn, *shape, stream.cuda_stream,
                               [ctypes.c_uint64(self.flag_dev + RELEASE_AT), ctypes.c_uint32(target),
                                ctypes.c_uint64(HOLD_TIMEOUT_NS), ctypes.c_uint64(announce), ctypes.c_uint64(let_go)])
        self.start_event.record(stream)
        t0 = time.perf_counter_ns()
        out = self.kernel()(self.data)
        t1 = time.perf_counter_ns()
        self.end_event.record(stream)
        meta = self._stage(out)
        self._signal_staged(seq, stream)
        self.send(kind="enqueued", host_ns=t1 - t0)
        self.end_event.synchronize()
        device_ns = self.start_event.elapsed_time(self.end_event) * 1e6
        torch.cuda.synchronize()
        self.send(kind="done", device_ns=device_ns, output=meta)

    def _signal_staged(self, seq: int, stream) -> None:
        """Behind the staged output on the stream: its digest, then the call's number, into the release page."""
        self._digest = self.digest(self.result)  # kept until the next call: the kernel reads it
        self.driver.launch(self.signal_fn, 1, 1, stream.cuda_stream,
                           [ctypes.c_uint64(self._digest.data_ptr()), ctypes.c_uint64(self.flag_dev + DIGEST_AT),
                            ctypes.c_uint64(self.flag_dev + STAGED_AT), ctypes.c_uint32(seq)])

    def _timed_cpu(self, seq: int):
        t0 = time.perf_counter_ns()
        out = self.kernel()(self.data)
        t1 = time.perf_counter_ns()
        meta = self._stage(out)
        self.send(kind="done", device_ns=float(t1 - t0), output=meta)

    def op_profile(self):
        """One call after a warm-up one (compilation stays out of the profile). Under ncu, the call inside an
        NVTX range named custom_kernel (what kernelbot's `ncu --nvtx-include custom_kernel/` captures);
        otherwise torch.profiler's table of it."""
        from torch.profiler import ProfilerActivity, profile

        torch, kernel = self.torch, self.kernel()
        kernel(self.data)
        if self.cuda:
            torch.cuda.synchronize()
        if self.under_ncu and self.cuda:
            torch.cuda.nvtx.range_push("custom_kernel")
            kernel(self.data)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
            self.send(kind="profile", table="(profiled by ncu: the kernels of the NVTX range custom_kernel)")
            return
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        with profile(activities=activities) as prof:
            kernel(self.data)
            if self.cuda:
                torch.cuda.synchronize()
        sort = "self_cuda_time_total" if self.cuda else "self_cpu_time_total"
        self.send(kind="profile", table=prof.key_averages().table(sort_by=sort, row_limit=20))


def worker_main(argv: list[str]) -> int:
    """eval.py --worker SOCKET_FD FLAG_FD ROLE [ncu], started by the judge in its sandbox."""
    sock_fd, flag_fd, role = int(argv[0]), int(argv[1]), argv[2]
    session = WorkerSession(socket.socket(fileno=sock_fd), flag_fd, role, under_ncu=argv[3:4] == ["ncu"])
    try:
        session.setup()
    except BaseException as e:
        session.send(kind="error", message=f"worker start-up failed: {type(e).__name__}: {e}\n"
                                           f"{traceback.format_exc(limit=-4)}")
        return 1
    session.serve()
    return 0


# ---------------------------------------------------------------------------------------------
# Judge side of a worker: the sandbox it runs in, its process, its messages
# ---------------------------------------------------------------------------------------------
class CaseFailure(Exception):
    """The case could not produce a result: exception, crash or timeout in the worker."""


def failure_text(e: Exception) -> str:
    """Why a case failed: a CaseFailure's own words. Any other exception is the judge's own work on the case
    failing (on a GPU most often for memory that the submission's processes hold), said so, not as a
    traceback that ends the run."""
    if isinstance(e, CaseFailure):
        return str(e)
    text = f"the judge's own work on this case failed: {type(e).__name__}: {_first_line(str(e))}"
    if isinstance(e, MemoryError) or "out of memory" in str(e).lower():
        return text + " (the machine's or the GPU's memory: the submission's processes may be holding it)"
    traceback.print_exception(e, file=sys.stderr)  # not the submission's doing, as far as the judge can tell
    return text


class CaseSkipped(Exception):
    """The case cannot run on this machine (its inputs would not fit in its memory): skipped, not failed."""


def available_memory() -> int | None:
    """Bytes of memory this process's machine can still give: MemAvailable, or less where a cgroup (a
    container) limits it; None where neither is known."""
    free = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            free.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(free) if free else None


class RunClock:
    """The time limits of a run. On a GPU, task.yml's limit for the mode is the whole eval.py process's,
    as kernelbot applies it (it kills the process then, and the results with it): the judge keeps a
    reserve to finish its report, a case that cannot start in time fails as not run, and a case's timing
    loop gets its share of the time left. Without CUDA (never a kernelbot run, and 10-100x slower) the
    same limit applies to each case instead."""

    def __init__(self, limit_s: float, key: str, per_case: bool, started: float | None = None):
        """started: when the process started (time.monotonic()); the judge's own start-up counts too."""
        self.limit_s, self.key, self.per_case = limit_s, key, per_case
        start = time.monotonic() if started is None else started
        self.deadline = start + limit_s - min(RUN_RESERVE_S, RUN_RESERVE_FRACTION * limit_s)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def start_case(self, cases_left: int) -> float:
        """Sets the case's deadline; returns its share of the time (seconds), cases_left counting it."""
        if self.per_case:
            self.deadline = time.monotonic() + self.limit_s
            return self.limit_s
        if self.left() <= 0:
            raise CaseFailure(f"not run: the run's time limit ({self.limit_s:g} s, task.yml `{self.key}`) was "
                              f"reached")
        return self.left() / max(cases_left, 1)

    def credit(self, seconds: float) -> None:
        """Without CUDA, the case's limit bounds the submission, not the judge: the judge's own work in a
        case (a ranked call's fresh input and its check) extends it. On a GPU the run's limit is absolute."""
        if self.per_case:
            self.deadline += seconds

    def start(self) -> float:
        """Time for the worker's start-up, before the first case."""
        return self.limit_s if self.per_case else self.left()


def sealed_copy(data: bytes, name: str) -> int | None:
    """A memfd holding data that no process can change any more (sealed against writes, resizing and
    further seals), or None where there is no memfd."""
    if not hasattr(os, "memfd_create"):
        return None
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd


# This file as the judge read it before any submission ran, for the workers to start from. A worker
# started from a file in its sandbox would run whatever a previous worker wrote there, before it confines
# itself (the confinement is this file's code): so the judge starts every worker from a sealed copy.
_worker_code = []


def worker_code_fd() -> int | None:
    if not _worker_code:
        _worker_code.append(sealed_copy(Path(__file__).read_bytes(), "eval-worker.py"))
    return _worker_code[0]


def worker_environment() -> dict:
    """The runner's environment for a worker, less what the worker must not have or could turn against its
    own next start: no POPCORN_* variables; PYTHONPATH with only absolute entries (a relative one would
    name the worker's sandbox, which it can write, and Python imports from it before the worker has
    confined itself); the user site-packages of the judge, not of the worker's home; no OpenMP thread
    pinning (OMP_PROC_BIND, OMP_PLACES, GOMP_CPU_AFFINITY, KMP_AFFINITY): libgomp pins a thread by its
    thread id, which the seccomp filter cannot tell from another process's and refuses (_SELF_ONLY_CALLS),
    and a thread it cannot pin it does not start."""
    import site

    env = {k: v for k, v in os.environ.items()
           if not k.startswith("POPCORN") and k not in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")}
    if "PYTHONPATH" in env:
        env["PYTHONPATH"] = os.pathsep.join(p for p in env["PYTHONPATH"].split(os.pathsep) if os.path.isabs(p))
    env["PYTHONUSERBASE"] = site.getuserbase()
    return env


class Sandbox:
    """A fresh directory the worker runs in: copies of the problem's modules, the submission as
    submission.py, its home, temp and compile-cache folders, and the CPU regions (the worker's code is
    not there: see worker_code_fd). The worker's environment holds none of the runner's POPCORN_*
    variables."""

    def __init__(self, problem: Path, submission: Path | None, under_ncu: bool = False, other: Path | None = None):
        self.under_ncu = under_ncu
        self.dir = Path(tempfile.mkdtemp(prefix="eval-sandbox-"))
        for f in problem.glob("*.py"):
            shutil.copy2(f, self.dir / f.name)
        if not (self.dir / "utils.py").exists():
            shutil.copy2(ROOT / "utils.py", self.dir / "utils.py")
        if worker_code_fd() is None:  # no memfd: the worker starts from a copy here
            shutil.copy2(Path(__file__).resolve(), self.dir / "eval.py")
        if submission is not None:
            shutil.copy2(submission, self.dir / "submission.py")
        if other is not None:  # compare mode's B, run by the worker of role "other"
            shutil.copy2(other, self.dir / OTHER_SUBMISSION)
        env = worker_environment()
        for var, sub in (("HOME", "home"), ("TMPDIR", "tmp"), ("XDG_CACHE_HOME", "cache")):
            (self.dir / sub).mkdir()
            if not (under_ncu and var == "TMPDIR"):  # ncu's injection and its host share a temp dir
                env[var] = str(self.dir / sub)
        # Compile caches are the sandbox's, whatever the runner names: a worker may write only where Landlock
        # lets it (a cache folder the runner names may not exist yet, and the worker may not create it), and
        # what one run's worker compiles into a shared cache would be loaded by a later run's (a kernel
        # planted for another submission, or for the null's digest kernel) unchecked. So every run compiles
        # afresh, in its first, untimed calls.
        for var, sub in (("TRITON_CACHE_DIR", "triton"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
            (self.dir / "cache" / sub).mkdir()
            env[var] = str(self.dir / "cache" / sub)
        env["PYTHONUNBUFFERED"] = "1"
        self.env = env

    def remove(self) -> None:
        remove_tree(self.dir)


class WorkerProcess:
    """One worker: `submission` runs custom_kernel, `null` runs a null submission (an empty output of the
    right form) on the same protocol, for the judge's overhead. Its stdout and stderr are relayed,
    prefixed, as the submission's output; on stop, every process it started is killed."""

    live: set = set()  # pids of running workers (kill_descendants spares the others' trees)
    warden: Warden | None = None  # told of every worker's process group
    killed_because = ""  # why the judge killed the workers, if it did (GpuWatchdog), until they start again
    # Cleared while the null submission's calls are timed: relaying is the judge's own work, which output
    # the submission left in its pipe (a flood of lines) would otherwise make compete with those calls.
    relaying = threading.Event()
    relaying.set()

    def __init__(self, sandbox: Sandbox, role: str, report: "Report"):
        self.sandbox, self.role, self.report = sandbox, role, report
        self.cuda = self.driver = None
        self.proc = self.sock = None
        self.seq = 0
        self.mapped = None
        self.arena = self.result = None  # its own regions: no two workers see each other's inputs or outputs
        self.confinement = []
        self.late_holds = 0  # timed calls whose one-block hold did not say it ran in time (swap_holds)
        self.flag_fd = self.flag = None
        if hasattr(os, "memfd_create"):  # the release count the GPU hold polls, shared with the worker
            self.flag_fd = os.memfd_create(f"eval-{role}-release", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(self.flag_fd, 4096)
            # sealed against resizing: a worker that truncated it would make the judge's next write a SIGBUS
            fcntl.fcntl(self.flag_fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self.flag = mmap.mmap(self.flag_fd, 4096)

    def spawn(self) -> None:
        """Starts the process (it sets itself up, then says it is ready: see handshake)."""
        parent, child = socket.socketpair()
        code = worker_code_fd()
        fds = (child.fileno(),) + ((self.flag_fd,) if self.flag_fd is not None else ()) + ((code,) if code else ())
        script = f"/proc/self/fd/{code}" if code is not None else str(self.sandbox.dir / "eval.py")
        # -P (Python 3.11+): no script folder on sys.path, which for the sealed copy would be "/"
        cmd = [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []), script, "--worker", str(child.fileno()),
               str(self.flag_fd if self.flag_fd is not None else -1), self.role] + (["ncu"] * self.sandbox.under_ncu)
        self.proc = subprocess.Popen(cmd, cwd=self.sandbox.dir, env=self.sandbox.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=fds,
                                     start_new_session=True)
        child.close()
        # seq goes on counting across restarts, and the release page keeps its counts: a release of the last
        # worker's still queued on the judge's stream can then never let a new worker's holds go early.
        self.sock, self.mapped, self.ticket = parent, None, None
        WorkerProcess.live.add(self.proc.pid)
        if WorkerProcess.warden is not None:
            WorkerProcess.warden.tell(f"group {self.proc.pid}")
        self._relay = threading.Thread(target=self._relay_output, args=(self.proc.stdout,), daemon=True)
        self._relay.start()

    def attach(self, cuda: bool, driver) -> None:
        """The judge's side of the release flag, once the judge has its own CUDA context."""
        self.cuda, self.driver = cuda, driver
        if cuda:
            self.flag_dev = driver.host_register(ctypes.addressof(ctypes.c_char.from_buffer(self.flag)), 4096)

    def handshake(self, deadline: float) -> None:
        ready = self.receive("ready", deadline)
        confinement = ready.get("confinement", [])
        if not isinstance(confinement, list) or not all(isinstance(c, str) for c in confinement):
            raise CaseFailure("the submission's process sent a malformed 'ready' message")
        self.confinement = confinement
        unconfined = self._not_as_confined()
        if unconfined:
            raise CaseFailure(f"the worker's process is not confined as it says: {unconfined}")
        if bool(ready.get("cuda")) != self.cuda:
            raise CaseFailure(f"the worker {'sees' if ready.get('cuda') else 'does not see'} a CUDA device and "
                              f"the judge {'does' if self.cuda else 'does not'}")

    def _not_as_confined(self) -> str:
        """What /proc shows of the worker that its confinement should rule out ('' if nothing): checked by
        the judge itself, so that what the report says of the worker does not rest on the worker's word."""
        try:
            status = dict(line.split(":", 1) for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
                          if ":" in line)
            nice = int(_stat_fields(f"/proc/{self.proc.pid}/stat")[16])
        except (OSError, ValueError, IndexError):
            return ""  # no /proc (not Linux), or gone: the next message says so
        said = " ".join(self.confinement)
        wrong = []
        if "nice 19" in said and nice != 19:
            wrong.append(f"nice {nice}")
        if "autogroup nice 19" in said and "nice 19" not in _read_or_empty(f"/proc/{self.proc.pid}/autogroup"):
            wrong.append("its scheduling group's nice is not 19")
        if "no confinement" not in said and status.get("NoNewPrivs", "1").strip() != "1":
            wrong.append("it may gain privileges (NoNewPrivs 0)")
        if int(status.get("CapEff", "0").strip() or "0", 16) != 0:
            wrong.append(f"capabilities {status['CapEff'].strip()}")
        if "seccomp:" in said and status.get("Seccomp", "2").strip() != "2":
            wrong.append("no seccomp filter")
        return "; ".join(wrong)

    def start(self, deadline: float) -> None:
        self.spawn()
        self.handshake(deadline)

    def _relay_output(self, pipe) -> None:
        # Bounded reads: output without newlines arrives in pieces, never as one line of unbounded size.
        while WorkerProcess.relaying.wait() and (raw := pipe.readline(RELAY_LINE_CHARS)):
            self.report.relay(self.role, raw.decode(errors="replace").rstrip("\n"))

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, fds: list[int] = (), **msg) -> None:
        """A message; fds: descriptors for the worker (SCM_RIGHTS), sent right after it."""
        # A fresh ticket per request, which every answer must carry: an answer sent ahead of its request
        # (a "done" queued during the previous call, received the moment the next is made) cannot have it.
        self.ticket = msg["ticket"] = secrets.token_hex(16)
        try:
            send_frame(self.sock, pickle.dumps(msg))
            if fds:
                socket.send_fds(self.sock, [b"\0"], fds)
        except OSError as e:
            raise CaseFailure(self._death(f"could not be reached ({e})")) from None

    def receive(self, kind: str, deadline: float, or_none: bool = False, poll: bool = False) -> dict | None:
        """The next message, which must be of `kind`; an error message or a dead worker fails the case.
        At the deadline: None if or_none, else the case fails (it timed out). poll: see POLL_S."""
        poll_until = time.monotonic() + (POLL_S if poll else 0)
        while True:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                if or_none:
                    return None
                raise CaseFailure("timed out (the time limit from task.yml)")
            ready, _, _ = select.select([self.sock], [], [], 0 if now < poll_until else min(remaining, 0.2))
            if not ready:
                if self.proc.poll() is not None:
                    raise CaseFailure(self._death("died"))
                continue
            try:
                msg = _printable_message(json.loads(recv_frame(self.sock, WORKER_FRAME_LIMIT,
                                                               now + max(remaining, 0.01))))
            except socket.timeout:
                raise CaseFailure("timed out in the middle of a message (the time limit from task.yml)") from None
            except (EOFError, OSError):
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:  # it closed its end and lives on: killed, and the case fails
                    _signal_all([self.proc.pid], signal.SIGKILL, groups=True)
                    self.proc.wait(timeout=10)
                    raise CaseFailure("the worker process closed its connection to the judge and did not exit "
                                      "(the submission's code shut its socket)") from None
                raise CaseFailure(self._death("died")) from None
            except (ValueError, RecursionError) as e:  # not JSON, or nested past the parser's depth
                raise CaseFailure(f"the submission's process sent a malformed message ({e})") from None
            finally:
                self.sock.settimeout(None)
            if not isinstance(msg, dict) or not isinstance(msg.get("kind"), str):
                raise CaseFailure("the submission's process sent a malformed message")
            if msg["kind"] == "error":
                raise CaseFailure(from_submission(str(msg.get("message", "error"))))
            if msg.get("ticket") != self.ticket:
                raise CaseFailure(f"the submission's process sent a {msg['kind']!r} that answers no request the judge "
                                  f"is waiting on (sent ahead of its request, or left over from an earlier one)")
            if msg["kind"] != kind:
                raise CaseFailure(f"the submission's process sent {msg['kind']!r} where the judge expected {kind!r}")
            return msg

    def _death(self, what: str) -> str:
        if WorkerProcess.killed_because:
            return WorkerProcess.killed_because
        code = self.proc.poll()
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            hint = " (killed: most often the machine ran out of memory)" if -code == signal.SIGKILL else ""
            return f"the worker process {what}: killed by signal {name}{hint}"
        return f"the worker process {what} (exit code {code}) while running the submission"

    def release(self, seq: int) -> None:
        """Lets both of the worker's holds for call `seq` go at once, from the host (a call that failed; the
        judge's stream-ordered release is Judge._release)."""
        struct.pack_into("<i", self.flag, RELEASE_AT, hold_targets(seq)[1])

    def swap_holds(self, seq: int) -> bool:
        """Lets the full-SM hold of call `seq` go, and waits (HOLD_SWAP_WAIT_S at most) until the one-block
        hold behind it runs: the judge's work that follows then takes the SMs from one block, not from all.
        Whether it did run in time."""
        full, one_block = hold_targets(seq)
        struct.pack_into("<i", self.flag, RELEASE_AT, full)
        give_up = time.monotonic() + HOLD_SWAP_WAIT_S
        while struct.unpack_from("<i", self.flag, ANNOUNCE_AT)[0] != one_block:
            if time.monotonic() > give_up:
                return False
        return True

    def stop(self) -> None:
        if self.proc is None:
            return
        _signal_all([self.proc.pid], signal.SIGKILL, groups=True)
        WorkerProcess.live.discard(self.proc.pid)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        kill_process_group(self.proc.pid)  # the worker's group: the worker and all it started (its session)
        kill_descendants(keep=set(WorkerProcess.live))  # and any that left it (where seccomp is missing)
        if WorkerProcess.warden is not None:
            WorkerProcess.warden.tell(f"ended {self.proc.pid}")  # its id may be another group's from now
        self._relay.join(timeout=5)
        if not self._relay.is_alive():  # else a process the kills missed holds the pipe: closing would wait on it
            self.proc.stdout.close()
        self.sock.close()
        self.proc = None


# ---------------------------------------------------------------------------------------------
# Judge: inputs, calls, checks and the timing check
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Prepared:
    """One input, as the judge holds it: where its pristine tensors go in the arena, its check, and the
    memory floor of a call on it."""
    layout: InputLayout
    check: object
    floor_ns: float | None


@dataclasses.dataclass
class TimedCall:
    device_ns: float   # the worker's measure (its report)
    judge_ns: float    # the judge's clock: on a GPU from its stamp before the inputs exist to its host's sighting
    #                    of the signal that the output is staged (Judge.timed); on the CPU, call sent to answer
    #                    received
    host_ns: float     # the worker's host clock around custom_kernel (GPU only; shown, never ranked)
    early: bool        # the GPU was released before custom_kernel returned
    # On a GPU, where the judge's clock went (ns from its first stamp): the release, behind the inputs and
    # the flush; the one-block hold let go (the worker's word); the staged signal seen (the clock's end);
    # and, off the clock, how long the judge's copy of the output took. For tools/judge_resolution.py;
    # nothing ranks it.
    parts: tuple = ()


# The judge's GPU watchdog. On the H200 a CUDA context with a stream left waiting on a value that never
# comes (cuStreamWaitValue32) kept every other context's work off the GPU: a submission could leave one
# behind in a process of its own and hang the judge inside its next GPU call (time slicing otherwise runs a
# context's kernel within milliseconds, whatever the others do). Once a step of the judge
# (a message to a worker, an input, a check) has lasted WATCHDOG_AFTER_S, a thread of the judge's checks
# every WATCHDOG_PERIOD_S that the GPU still runs a small kernel of the judge's; if one does not run
# within WATCHDOG_LIMIT_S, it kills every process the judge started (their contexts, and what they left
# on the GPU, go with them) and the case fails saying why. Not under ncu, which holds the GPU while it
# replays a kernel.
WATCHDOG_AFTER_S, WATCHDOG_PERIOD_S, WATCHDOG_LIMIT_S = 2.0, 1.0, 5.0


class GpuWatchdog:
    """probe(limit_s, stop): whether the GPU ran a kernel of the judge's within limit_s (or stop, a
    threading.Event, was set first); on_starved(): what is done when it did not."""

    def __init__(self, probe, on_starved, after_s: float = WATCHDOG_AFTER_S, period_s: float = WATCHDOG_PERIOD_S,
                 limit_s: float = WATCHDOG_LIMIT_S):
        self.probe, self.on_starved = probe, on_starved
        self.after_s, self.period_s, self.limit_s = after_s, period_s, limit_s
        self.step_started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="eval-gpu-watchdog", daemon=True)
        self._thread.start()

    def step(self) -> None:
        """The judge's main thread begins a step."""
        self.step_started = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _watch(self) -> None:
        while not self._stop.wait(self.period_s):
            if time.monotonic() - self.step_started < self.after_s:
                continue
            try:
                ran = self.probe(self.limit_s, self._stop)
            except Exception:  # a probe that cannot be made (memory, say) says nothing: try again later
                continue
            if not ran and not self._stop.is_set():
                self.on_starved()


def gpu_probe(torch):
    """A probe for GpuWatchdog: one small kernel on a stream of its own, polled, never waited on. Made once
    here, so that its kernel is loaded before any submission can hold the GPU's memory."""
    stream = torch.cuda.Stream()
    word = torch.zeros(1, dtype=torch.int32, device="cuda")

    def probe(limit_s: float, stop: threading.Event) -> bool:
        done = torch.cuda.Event()
        with torch.cuda.stream(stream):
            word.add_(1)
            done.record()
        give_up = time.monotonic() + limit_s
        while not done.query():
            if time.monotonic() > give_up:
                return False
            if stop.wait(0.01):
                return True
        return True
    probe(60.0, threading.Event())
    return probe


def kill_workers_for_the_gpu() -> None:
    """GpuWatchdog's on_starved: every process the judge started is killed, the reason kept for the report."""
    WorkerProcess.killed_because = (
        f"the judge killed the submission's processes: the GPU ran none of the judge's work for "
        f"{WATCHDOG_LIMIT_S:.0f} s (a stream that a process of the submission's left waiting on a value that "
        f"never comes keeps every other process's work off the GPU)")
    _signal_all(list(WorkerProcess.live), signal.SIGKILL, groups=True)
    _signal_all(_descendants(keep=set()), signal.SIGKILL)


class Judge:
    def __init__(self, problem: Path, submission: Path, report: "Report", timed: bool, under_ncu: bool = False,
                 other: Path | None = None, warden: Warden | None = None):
        self.report = report
        WorkerProcess.warden = warden
        self.sandboxes, self.workers_started = [], []
        try:
            self._start(problem, submission, timed, under_ncu, other, warden)
        except BaseException:  # nothing of a judge that could not start outlives it
            for w in self.workers_started:
                w.stop()
            self.remove_sandboxes()
            raise

    def _start(self, problem: Path, submission: Path, timed: bool, under_ncu: bool, other: Path | None,
               warden: Warden | None) -> None:
        def sandbox(*args) -> Sandbox:
            box = Sandbox(*args)
            self.sandboxes.append(box)
            if warden is not None:
                warden.tell(f"dir {box.dir}")
            return box

        # Each worker runs in a sandbox of its own, which no other worker (Landlock: each writes only under its
        # own) can rewrite. The null's: a null importing rewritten modules could be made slow, and the baseline
        # that reported times are checked against with it. compare's B's: A, whose code runs first, could
        # otherwise rewrite B's submission or the modules B imports before B imports them.
        self.sandbox = sandbox(problem, submission, under_ncu)
        self.null_sandbox = sandbox(problem, None) if timed else None
        other_sandbox = sandbox(problem, None, under_ncu, other) if other is not None else None
        # The workers import torch while the judge does (they set themselves up unprompted).
        report = self.report
        self.worker = WorkerProcess(self.sandbox, "submission", report)
        self.null = WorkerProcess(self.null_sandbox, "null", report) if timed else None
        self.other = WorkerProcess(other_sandbox, "other", report) if other is not None else None
        for w in self.workers:
            self.workers_started.append(w)
            w.spawn()
        import torch
        import reference
        import utils

        self.torch, self.reference = torch, reference
        self.cuda = torch.cuda.is_available()
        self.flush = utils.L2Flush() if self.cuda else None  # also makes torch's context current
        self.driver = CudaDriver() if self.cuda else None
        self.peak_bw = peak_bandwidth(torch) if self.cuda else None
        for w in self.workers:
            w.attach(self.cuda, self.driver)
        if self.cuda:
            self.stamp_fn = self.driver.function(_STAMP_PTX, "eval_stamp")
            self.release_fn = self.driver.function(_RELEASE_PTX, "eval_release")
            # The gate: the judge's own hold (on a page no worker maps), which keeps its stream from starting
            # a timed call's work until all of it is queued (Judge.timed).
            self.gate_fn = self.driver.function(_HOLD_PTX, "eval_hold")
            self.gate_page = mmap.mmap(-1, 4096)
            self.gate_dev = self.driver.host_register(ctypes.addressof(ctypes.c_char.from_buffer(self.gate_page)), 4096)
            self.gate_seq = 0
            self.stamps = torch.zeros(len(STAMPS), dtype=torch.int64, device="cuda")
            self.quiet_fn = self.driver.function(_QUIET_PROBE_PTX, "eval_quiet_probe")
            self.quiet_gap = torch.zeros(1, dtype=torch.int64, device="cuda")
        self.watchdog = (GpuWatchdog(gpu_probe(torch), kill_workers_for_the_gpu) if self.cuda and not under_ncu
                         else None)
        self.form = None
        self.regions = 0
        self.memory_at_start = None

    def describe(self) -> str:
        torch = self.torch
        device = "cpu"
        if self.cuda:
            p = torch.cuda.get_device_properties(0)
            device = f"{p.name} (sm_{p.major}{p.minor}, {p.multi_processor_count} SMs)"
        return f"{device}  (torch {torch.__version__}, triton {triton_version()})"

    def release_memory(self) -> None:
        """Between cases on the CPU: the freed inputs' memory back to the machine (glibc keeps freed heap
        memory for the process; the next case's worker and inputs need it)."""
        gc.collect()
        libc = _libc()
        if not self.cuda and libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)

    def weigh_machine(self) -> None:
        """The memory the cases are weighed against (check_fits), read once the worker is set up and before
        the submission's code has run: memory the submission takes later (to have a case it gets wrong
        skipped, or the score cover only its fast cases) cannot make a case skip."""
        self.memory_at_start = available_memory() if not self.cuda else None

    def check_fits(self, case: TestCase) -> None:
        """On the CPU, where the judge, the worker and their copies of an input share the machine's
        memory: CaseSkipped if the case would not fit, judged from its sizes before anything is generated."""
        estimate = getattr(self.reference, "input_bytes", None)
        available = self.memory_at_start if estimate is not None else None
        if available is None:
            return
        one = estimate(**case.args)
        if HARNESS_MEMORY_FACTOR * one > available:
            raise CaseSkipped(f"skipped: its input is about {one / 1e9:.1f} GB (from its sizes) and a run of it needs "
                              f"about {HARNESS_MEMORY_FACTOR} times that, more than the {available / 1e9:.1f} GB this "
                              f"machine had available when the run began")

    def unfit_cases(self, cases: list) -> list:
        """(index, why) of each case that cannot run on this machine (check_fits), all weighed before any runs."""
        unfit = []
        for i, case in enumerate(cases):
            try:
                self.check_fits(case)
            except CaseSkipped as e:
                unfit.append((i, str(e)))
        return unfit

    def ensure_started(self, worker: WorkerProcess, timeout: float) -> None:
        """A worker that is set up: the one spawned at start, or a new one after a failure."""
        deadline = time.monotonic() + timeout
        self._step()
        if not worker.running:
            WorkerProcess.killed_because = ""  # reported with the case it failed
        if worker.running and not worker.confinement:
            worker.handshake(deadline)
        elif not worker.running:
            if worker.proc is not None:
                worker.stop()
            worker.start(deadline)

    @property
    def workers(self) -> list:
        return [w for w in (self.worker, self.null, self.other) if w is not None]

    def stop_workers(self) -> None:
        """Every worker stopped (with what it started); ensure_started starts fresh ones when needed."""
        for w in self.workers:
            w.stop()

    def _step(self) -> None:
        if self.watchdog is not None:
            self.watchdog.step()

    def close(self) -> None:
        self.stop_workers()  # first: what a worker left on the GPU goes with it, and a probe in flight ends
        if self.watchdog is not None:
            self.watchdog.stop()
        kill_descendants(keep=set())

    def remove_sandboxes(self) -> None:
        """After the last result line (close() has ended every process): a sandbox the submission filled
        with a million entries takes a while to remove, and that must not hold the report back."""
        for sandbox in self.sandboxes:
            sandbox.remove()

    # -- inputs ------------------------------------------------------------------------------
    def prepare(self, data, form_too: bool) -> Prepared:
        """The judge's side of one input: its layout, its check (expected results computed once) and,
        for a case's first input, the output form every call must return (from the reference)."""
        self._step()
        torch, ref = self.torch, self.reference
        if form_too:
            expected = ref.ref_kernel(data)
            self.form = (tuple(expected.shape), str(expected.dtype), expected.device.type,
                         expected.numel() * expected.element_size())
            del expected
        make = getattr(ref, "make_checker", None)
        check = make(data) if make else (lambda out, data=data: ref.check_implementation(data, out))
        floor = None
        if self.peak_bw and hasattr(ref, "min_bytes"):
            floor = ref.min_bytes(data) / self.peak_bw * 1e9
        layout = InputLayout(data)
        if self.cuda:
            torch.cuda.synchronize()
        return Prepared(layout, check, floor)

    def _fit(self, worker: WorkerProcess, arena_bytes: int, result_bytes: int) -> None:
        """Grows a worker's shared regions as inputs need (on a GPU old ones stay mapped until the judge
        exits; on the CPU they are let go). Each worker has regions of its own, so that nothing the judge
        writes for one (inputs, poison) can trigger work another left waiting on the GPU."""
        if worker.arena is None or worker.arena.nbytes < arena_bytes:
            if worker.arena is not None:
                worker.arena.replaced()
            self.regions += 1
            worker.arena = SharedRegion(arena_bytes * 5 // 4 + 4096, self.cuda, self.driver, worker.sandbox.dir,
                                        f"arena{self.regions}")
        if worker.result is None or worker.result.nbytes != max(result_bytes, 1):
            if worker.result is not None:
                worker.result.replaced()
            self.regions += 1
            worker.result = SharedRegion(result_bytes, self.cuda, self.driver, worker.sandbox.dir,
                                         f"result{self.regions}")

    def _map(self, worker: WorkerProcess, prep: Prepared, deadline: float) -> None:
        self._fit(worker, prep.layout.nbytes, self.form[3])
        key = (worker.arena.handle, worker.result.handle, prep.layout.structure, prep.layout.specs)
        if worker.mapped != key:
            worker.send(op="map", arena=worker.arena.handle, result=worker.result.handle,
                        layout=(prep.layout.structure, prep.layout.specs), form=self.form[:3],
                        fds=[r.fd for r in (worker.arena, worker.result) if r.handle[0] == "memfd"])
            worker.receive("mapped", deadline)
            worker.mapped = key

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def _collect(self, meta, raw) -> tuple[object, str]:
        """The output as the judge's own tensor, from its copy of the result region's bytes: (tensor, '')
        or (None, why the output cannot be checked)."""
        shape, dtype, device, nbytes = self.form
        if not isinstance(meta, dict) or not meta.get("tensor"):
            name = meta.get("type") if isinstance(meta, dict) else None
            return None, f"output must be a torch.Tensor, got {str(name)[:100]!r}"  # quoted: a class name is the submission's text
        dt = _dtypes().get(meta["dtype"]) if isinstance(meta.get("dtype"), str) else None
        got_shape = meta.get("shape")
        # type(n) is int: a JSON true is a bool, which isinstance counts as an int and reshape refuses
        if dt is None or not isinstance(got_shape, list) or not all(type(n) is int and n >= 0 for n in got_shape):
            return None, "the submission's process described its output incorrectly"
        if not meta.get("copied") or math.prod(got_shape) * dt.itemsize != nbytes:
            return None, (f"output is a {dt} tensor of shape {tuple(got_shape)}, expected {dtype} of shape "
                          f"{shape}")
        raw = raw[:nbytes]
        if nbytes and bool((raw == 0xFF).all()):
            return None, ("the output was never copied back: the judge's poison is still in its place (the "
                          "call did not finish in the submission's process)")
        out = raw.view(dt).reshape(got_shape)
        if meta.get("device") == "cpu" and out.is_cuda:
            out = out.cpu()
        return out, ""

    def check(self, prep: Prepared, returned) -> tuple[bool, str]:
        """returned: (the worker's description of the output, the judge's copy of its bytes)."""
        self._step()
        out, problem = self._collect(*returned)
        if out is None:
            return False, problem
        try:
            result = prep.check(out)
        except Exception as e:  # a check must not crash on a bad output, but if it does, it is a fail
            return False, f"check raised {type(e).__name__}: {e}"
        if isinstance(result, tuple):
            return bool(result[0]), str(result[1])
        return not result, str(result)

    # -- calls -------------------------------------------------------------------------------
    def _present(self, prep: Prepared, deadline: float, worker: WorkerProcess) -> None:
        """The input in the worker's arena, its result region poisoned: for an untimed call."""
        self._map(worker, prep, deadline)
        prep.layout.write(prep.layout.views(worker.arena.tensor))
        worker.result.tensor.fill_(0xFF)
        self._sync()

    def profile(self, prep: Prepared, deadline: float) -> str:
        """The worker's torch.profiler table of one call (untimed, unchecked)."""
        self._step()
        self._present(prep, deadline, self.worker)
        self.worker.send(op="profile")
        return from_submission(str(self.worker.receive("profile", deadline).get("table", "")))

    def call_once(self, prep: Prepared, deadline: float, worker=None) -> tuple[bool, str]:
        """One untimed call on the input (by the submission's worker, or the given one), checked."""
        self._step()
        worker = worker or self.worker
        self._present(prep, deadline, worker)
        worker.send(op="call")
        done = worker.receive("done", deadline)
        good, message = self.check(prep, (done.get("output"), worker.result.tensor.clone()))
        if done.get("changed") is True:
            return False, ("the output changed after custom_kernel returned: finish its work on the current "
                           "stream (join side streams to it) before returning")
        return good, message

    def _stamp(self, name: str) -> None:
        self.driver.launch(self.stamp_fn, 1, 1, self.torch.cuda.current_stream().cuda_stream,
                           [ctypes.c_uint64(self.stamps.data_ptr() + 8 * STAMPS.index(name))])

    def _release(self, worker: WorkerProcess, seq: int) -> None:
        self.driver.launch(self.release_fn, 1, 1, self.torch.cuda.current_stream().cuda_stream,
                           [ctypes.c_uint64(worker.flag_dev + RELEASE_AT), ctypes.c_uint32(hold_targets(seq)[1]),
                            ctypes.c_uint64(self.gate_dev + GATE_RELEASED_AT)])

    def _close_gate(self) -> int:
        self.gate_seq += 1
        self.driver.launch(self.gate_fn, *ONE_BLOCK_HOLD, self.torch.cuda.current_stream().cuda_stream,
                           [ctypes.c_uint64(self.gate_dev), ctypes.c_uint32(self.gate_seq),
                            ctypes.c_uint64(GATE_TIMEOUT_NS), ctypes.c_uint64(0), ctypes.c_uint64(0)])
        return self.gate_seq

    def _open_gate(self, seq: int) -> None:
        struct.pack_into("<i", self.gate_page, GATE_AT, seq)

    @staticmethod
    def _await(page, at: int, value: int, deadline: float, worker: WorkerProcess | None = None) -> int:
        """The judge's host spins (POLL_S, then in short sleeps) until the u32 at page[at] is value, and returns
        its clock at the sighting. worker: whose message before it (an error) ends the wait."""
        spin_until, checks = time.monotonic() + POLL_S, 0
        while struct.unpack_from("<I", page, at)[0] != value:
            checks += 1
            if checks % 256:
                continue
            now = time.monotonic()
            if now > deadline:
                raise CaseFailure("timed out (the time limit from task.yml)")
            if worker is None:
                if now > spin_until:
                    time.sleep(0.0002)
            elif select.select([worker.sock], [], [], 0 if now < spin_until else 0.0002)[0]:
                if struct.unpack_from("<I", page, at)[0] == value:
                    break
                worker.receive("done", deadline)  # an error, or a dead worker, fails the case here
                raise CaseFailure(f"the submission's process answered timed call {value} without signalling that "
                                  f"its output was staged")
        return time.perf_counter_ns()

    @staticmethod
    def _await_staged(worker: WorkerProcess, seq: int, deadline: float) -> tuple[int, int]:
        """The judge's host watches the worker's release page for its signal that call seq's output is staged:
        (its clock at the sighting, the digest beside the signal then)."""
        seen = Judge._await(worker.flag, STAGED_AT, seq, deadline, worker)
        return seen, list(struct.unpack_from("<2q", worker.flag, DIGEST_AT))

    def _take_output(self, worker: WorkerProcess, seq: int, deadline: float):
        """Once the worker has signalled call seq's output staged: a stamp, the judge's copy of the result
        region, the last stamp (the copy's time, for TimedCall.parts). Returns the host's clock at the signal's
        sighting, the copy and the digest the worker signalled with."""
        seen, digest = self._await_staged(worker, seq, deadline)
        self._stamp("staged")
        raw = worker.result.tensor.clone()
        self._stamp("end")
        return seen, raw, digest

    def timed(self, worker: WorkerProcess, prep: Prepared, deadline: float, mimic_ns: float = 0,
              null_early: bool = False) -> tuple[TimedCall, tuple]:
        """One call on the timed protocol. For the null worker: mimic_ns, how long its call takes, and
        null_early, whether it waits for its release like a call that had not returned in time."""
        self._step()
        self._map(worker, prep, deadline)
        if worker is not self.null:  # as confined as at its start (its priority above all) at every call
            unconfined = worker._not_as_confined()
            if unconfined:
                raise CaseFailure(f"the submission's process is no longer confined as it was: {unconfined}")
        worker.seq += 1
        seq, key = worker.seq, digest_key()
        views = prep.layout.views(worker.arena.tensor)
        now = time.perf_counter_ns
        if not self.cuda:
            prep.layout.write(views)
            worker.result.tensor.fill_(0xFF)
            t_go = now()
            worker.send(op="timed", seq=seq, key=key, mimic_ns=mimic_ns, early=null_early)
            done = worker.receive("done", deadline)
            t_done = now()
            raw = worker.result.tensor.clone()
            return TimedCall(_reported(done), t_done - t_go, t_done - t_go, False), (done.get("output"), raw)
        torch = self.torch
        prep.layout.poison(worker.arena.tensor)
        worker.result.tensor.fill_(0xFF)
        struct.pack_into("<I", worker.flag, STAGED_AT, 0)  # no signal left from a call of an earlier process
        struct.pack_into("<I", self.gate_page, GATE_RELEASED_AT, 0)  # nor a release of another worker's call
        torch.cuda.synchronize()
        worker.send(op="timed", seq=seq, key=key, mimic_ns=mimic_ns, early=null_early)
        try:
            enqueued = worker.receive("enqueued", min(deadline, time.monotonic() + RETURN_WAIT_S), or_none=True,
                                      poll=True)
        except CaseFailure:
            worker.release(seq)
            raise
        early = enqueued is None
        # The full-SM hold goes, the one-block hold behind it spins. Then all on the judge's stream, queued
        # behind the judge's gate, which opens once all of it is (so that the judge's launches are nowhere
        # in it): the first stamp; the call's inputs; L2 flushed and left clean; the release (the worker's
        # kernels start right after it, with nothing of the inputs in L2), which the judge's host sees on
        # its own page; a stamp. The clock starts before the inputs exist: work that the worker's context
        # does with them before the release, on any stream (its kernels time-slice with the judge's on the
        # GPU), is on the judge's clock too. Then the judge's host, spinning, sees the worker's signal that
        # the output is staged, with the output's digest beside it: the judge's clock is its GPU time from
        # the first stamp to the release plus its host time from the release to that sighting. Only then
        # does it queue its copy of the output, and the call fails unless the digest read at the signal is
        # that of the bytes copied under this call's key: a signal sent before the output was there carries
        # a wrong digest, and no output can be fitted to one in time (output_digest). The GPU's switch back
        # to the judge's context, which the worker's work could overlap, is off the clock.
        stream = torch.cuda.current_stream()
        if not worker.swap_holds(seq):
            worker.late_holds += 1
        struct.pack_into("<Q", worker.flag, LET_GO_AT, 0)
        self.driver.reset_persisting_l2()  # not stream-ordered: before the gate, whose stream it might wait on
        t_start = now()  # a late call's clock (host): from before its work is queued (the gate opens by itself)
        gate = self._close_gate()
        try:
            self._stamp("start")
            prep.layout.write(views)
            self.flush()
            self._release(worker, seq)
            self._stamp("released")
        finally:
            self._open_gate(gate)
        try:
            if early:
                # The call is still running on the host: the judge's clock is its host clock, from before
                # the inputs were written to the signal (the null's calls on this path measure the write,
                # flush and release with it).
                stream.synchronize()
                enqueued = worker.receive("enqueued", deadline, poll=True)
            else:
                t_released = self._await(self.gate_page, GATE_RELEASED_AT, hold_targets(seq)[1], deadline)
            t_signal, raw, digest = self._take_output(worker, seq, deadline)
            done = worker.receive("done", deadline, poll=True)
            stamps = dict(zip(STAMPS, self.stamps.tolist()))  # synchronises: raw is complete
            judge_ns = float(t_signal - t_start if early else stamps["released"] - stamps["start"] + t_signal - t_released)
            if output_digest(torch, raw, key).tolist() != digest:
                raise CaseFailure(f"the submission's process signalled timed call {seq}'s output staged before it "
                                  f"was: the digest it signalled with is not that of the bytes the judge then copied")
        except CaseFailure:
            worker.release(seq)
            raise
        let_go = struct.unpack_from("<Q", worker.flag, LET_GO_AT)[0]
        parts = (stamps["released"] - stamps["start"], let_go - stamps["start"] if let_go else math.nan, judge_ns,
                 stamps["end"] - stamps["staged"])
        host_ns = enqueued.get("host_ns")
        host_ns = float(host_ns) if isinstance(host_ns, (int, float)) and not isinstance(host_ns, bool) else math.nan
        return TimedCall(_reported(done), judge_ns, host_ns, early, parts), (done.get("output"), raw)

    def null_call(self, prep: Prepared, deadline: float, mimic_ns: float, early: bool = False) -> TimedCall:
        """One call of the null submission (for the protocol's own overhead) on a quiet machine: every other
        process the judge started is stopped, and on a GPU nothing else runs there (QUIET_PROBE_NS). So
        work the submission leaves behind between its calls (processes of its own, GPU work queued) cannot
        slow the null's calls and inflate the baseline its times are checked and ranked against. (nice 19
        alone would not do on the CPU: a kernel that groups processes by session for scheduling,
        sched_autogroup, weighs nice only within a session.)"""
        self._step()
        groups = [w.proc.pid for w in self.workers if w is not self.null and w.running]
        WorkerProcess.relaying.clear()
        try:
            with DescendantsStopped(keep={self.null.proc.pid}, groups=groups) as stopped:
                if self.cuda:
                    self._wait_until_quiet(deadline)
                call = self.timed(self.null, prep, deadline, mimic_ns, null_early=early)[0]
                if stopped.ran():
                    raise CaseFailure("a process of the submission's ran while the judge had stopped it for a call of "
                                      "the null submission (something sent it SIGCONT): the baseline its times are "
                                      "checked against cannot be trusted")
                return call
        finally:
            WorkerProcess.relaying.set()

    def _wait_until_quiet(self, deadline: float) -> None:
        give_up = time.monotonic() + QUIET_WAIT_S
        stream = self.torch.cuda.current_stream().cuda_stream
        while True:
            self.driver.launch(self.quiet_fn, 1, 1, stream, [ctypes.c_uint64(self.quiet_gap.data_ptr()),
                                                            ctypes.c_uint64(QUIET_PROBE_NS)])
            gap = int(self.quiet_gap.item())
            if WorkerProcess.killed_because:  # the GPU stopped running the judge's work altogether
                raise CaseFailure(WorkerProcess.killed_because)
            if gap <= QUIET_GAP_NS:
                return
            if time.monotonic() > deadline:
                raise CaseFailure("timed out (the time limit from task.yml)")
            if time.monotonic() > give_up:
                raise CaseFailure(
                    f"the GPU did not fall quiet between calls: with the submission's processes stopped, other "
                    f"work still took the GPU from the judge for up to {_fmt_ns(gap)} at a time for "
                    f"{QUIET_WAIT_S:.0f} s (GPU work the submission left queued after its call returned, or "
                    f"another process on this GPU); the judge measures its own overhead on a quiet GPU")


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _reported(done: dict) -> float:
    """The time the worker reports (ns), or NaN for anything that is not a number a float can hold."""
    value = done.get("device_ns")
    try:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")
    except OverflowError:  # an integer past float's range
        return float("nan")


def peak_bandwidth(torch) -> float | None:
    name = torch.cuda.get_device_properties(0).name
    for key, bw in PEAK_BANDWIDTH:
        if key in name:
            return bw
    return None


def null_overhead(nulls: list[TimedCall], early: bool) -> float:
    """The protocol's own overhead on the judge's clock (judge's clock minus reported time) for the null
    submission, on the path of calls released on time or of calls released before they returned."""
    kind = [n.judge_ns - n.device_ns for n in nulls if n.early == early]
    return trimmed_mean(kind) if kind else math.inf


def overhead_gap(calls: list[TimedCall], nulls: list[TimedCall]) -> float:
    """How much more the judge's clock saw per call than the submission's process reported, beyond the
    protocol's own overhead (what it is for the null submission). Calls released on time and calls
    released before they returned are timed on different clocks, each against nulls of its kind; the
    largest TRIM of the per-call residuals are left out, so one slow call cannot fail a case."""
    base = {early: null_overhead(nulls, early) for early in (False, True)}
    return trimmed_mean([c.judge_ns - c.device_ns - base[c.early] for c in calls])


def ranked_times(calls: list[TimedCall], nulls: list[TimedCall], cuda: bool, band: Band | None = None) -> list[float]:
    """The ranked time of each call (rank_calls)."""
    return [t for t, _ in rank_calls(calls, nulls, cuda, band)]


def rank_calls(calls: list[TimedCall], nulls: list[TimedCall], cuda: bool,
               band: Band | None = None, floor_ns: float = 0.0) -> list[tuple[float, str]]:
    """(ranked time, how it was ranked) of each call. band: the mode's (BANDS by default); floor_ns: the
    case's memory floor, under which no call on a GPU is ranked (a report under it fails the call; a call
    ranked on the judge's clock is raised to it).
    - "early": released before it returned (it synchronises, or its host path is slower): the judge's own
      host clock from before its inputs were written to the output in hand, less the null submission's
      overhead on that path; timed as it ran, host time included, and nothing the submission reports
      enters it.
    - On a GPU, released on time, j the judge's clock of it less the null's overhead and b CALL_BANDS bands:
      "report", the submission's device time, when it lies within b of j; "lifted" to j - b when it lies
      under that (verify_times holds a case's mean to one band but leaves out its largest residuals, so
      that one stall of the judge's cannot fail a case: this keeps a call among those from hiding more);
      "judge", j itself, when it lies over j + b (a stall of the worker's events the judge's clock did not
      see: the judge's clock is the authority both ways).
    - On the CPU, "judge": the judge's clock less the null's overhead. The worker's clock is checked
      (verify_times) but not ranked, so no report can take the CPU's wide band off a time."""
    band = band or BANDS["cuda" if cuda else "cpu"]
    on_time_base, early_base = null_overhead(nulls, False), null_overhead(nulls, True)
    ranked = []
    for c in calls:
        if c.early:  # without a usable null baseline, the judge's whole clock
            judged = c.judge_ns - early_base
            ranked.append((judged if math.isfinite(judged) and judged > 0 else c.judge_ns, "early"))
            continue
        judged = c.judge_ns - on_time_base
        if not math.isfinite(judged):
            ranked.append((c.device_ns if cuda else c.judge_ns, "report" if cuda else "judge"))
        elif not cuda:
            ranked.append((max(judged, 1.0), "judge"))
        elif c.device_ns < (lowest := judged - CALL_BANDS * band.at(c.device_ns)):
            ranked.append((lowest, "lifted"))
        elif c.device_ns > judged + CALL_BANDS * band.at(judged):
            ranked.append((max(judged, floor_ns, 1.0), "judge"))
        else:
            ranked.append((c.device_ns, "report"))
    return ranked


def without_slowest(times: list[float]) -> list[float]:
    """A case's ranked times less its slowest SLOWEST_SHARE (one at least, of two or more)."""
    return [times[i] for i in fastest(times)]


def fastest(times: list[float]) -> list[int]:
    """The indices of the times without_slowest keeps, in order."""
    drop = max(1, int(SLOWEST_SHARE * len(times))) if len(times) > 1 else 0
    return sorted(sorted(range(len(times)), key=times.__getitem__)[:len(times) - drop])


def kept_calls(late: list[bool]) -> list[bool]:
    """Which of a case's calls (or compare's pairs) its ranking keeps, given which were released before they
    returned: all, unless those are stragglers (at most STRAGGLER_SHARE of them, one at least, the others in
    time, and the last in time, so that a late call cannot both end the timing loop and leave it)."""
    n, k = len(late), sum(late)
    if 0 < k < n and k <= max(1, int(STRAGGLER_SHARE * n)) and not late[-1]:
        return [not x for x in late]
    return [True] * n


def ranked_calls(calls: list[TimedCall]) -> list[TimedCall]:
    """The calls whose times a case ranks (kept_calls)."""
    return [c for c, keep in zip(calls, kept_calls([c.early for c in calls])) if keep]


def timing_gap(calls: list[TimedCall], nulls: list[TimedCall], band: Band | None = None) -> tuple[float, float] | None:
    """(reported mean, gap to the judge's clock beyond the null's overhead) over the calls released on time;
    None if there are none (a late call's ranked time is the judge's clock: rank_calls). band: on a GPU, the
    mode's band: a report rank_calls ranks on the judge's clock (over it by more than CALL_BANDS bands) is
    taken as ranked, so that one inflated report can neither widen the band nor offset the other calls'
    gaps (it is neither in the ranking)."""
    calls = [c for c in calls if not c.early]
    if not calls:
        return None
    if band is not None:
        calls = [dataclasses.replace(c, device_ns=t) if how == "judge" else c
                 for c, (t, how) in zip(calls, rank_calls(calls, nulls, True, band))]
    return sum(c.device_ns for c in calls) / len(calls), overhead_gap(calls, nulls)


def mean_timing(timings: list) -> tuple[float, float] | None:
    """(reported mean, gap) averaged over a case's timings (timing_gap of each; None ones left out)."""
    timings = [t for t in timings if t is not None]
    if not timings:
        return None
    return sum(t[0] for t in timings) / len(timings), sum(t[1] for t in timings) / len(timings)


def verify_times(calls: list[TimedCall], nulls: list[TimedCall], band: Band, earlier: list = (),
                 cuda: bool = True) -> str:
    """'' if the reported times agree with the judge's clock, else why not. Per call, the judge's clock
    minus the reported time is the protocol's overhead; the same protocol with the null submission says
    what that overhead is. A case whose overhead exceeds the null's by more than band.at(its reported mean)
    reported less time than its calls took. earlier: timing_gap of the case's earlier timings on other
    processes; what is checked is the mean over all of them (a process of slow switches weighs half). cuda:
    whether reports are ranked (timing_gap); on the CPU the judge's clock is, and every report is checked."""
    return check_timings([*earlier, timing_gap(calls, nulls, band if cuda else None)], band)


def check_timings(timings: list, band: Band) -> str:
    """verify_times over a case's timings (timing_gap of each). A last timing with no call released on time
    passes: all of its ranked time is the judge's clock."""
    if timings and timings[-1] is None:
        return ""
    mean = mean_timing(timings)
    if mean is None:
        return ""
    claimed, gap = mean
    allowed = band.at(claimed)
    if gap <= allowed:
        return ""
    n = sum(t is not None for t in timings)
    over = f" (the mean of {n} timings, each on fresh processes)" if n > 1 else ""
    return (f"the times reported from the submission's process (mean {_fmt_ns(claimed)}) are below what the "
            f"judge's clock allows: its calls took {_fmt_ns(claimed + gap)} each by the judge's clock{over}, with "
            f"the judge's own overhead (measured on the same protocol with a null submission) taken out; the band "
            f"is {_fmt_ns(allowed)} ({_fmt_ns(band.abs_ns)} + {band.rel:.0%} of the report)")


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------
class Report:
    """Human-readable lines on stdout, protocol lines on POPCORN_FD when given. The submission's own
    output is relayed on stdout with a prefix, so that it can never pass for the report."""

    def __init__(self, fd_file=None):
        self.fd_file = fd_file
        self.lock = threading.Lock()
        self.relayed = 0
        self.cases = []  # one dict per case, for --json
        self.checked = False  # whether the verdict line is out

    def skipped(self, key: str, case: "TestCase", why: str, line: str) -> None:
        """A case that could not run here: `key` its protocol prefix (test.N, benchmark.N, or '' for none),
        `line` its line in the readable report."""
        if key:
            self.log(f"{key}.status", "skip")
            self.log(f"{key}.message", _first_line(why))
        self.record(spec=case.spec, status="skip", message=why)
        self.say(line)

    def record(self, **case) -> None:
        self.cases.append(case)

    def log(self, key, value):
        if key == "check":
            self.checked = True
        if self.fd_file is not None and not self.fd_file.closed:
            print(f"{key}: {value}", file=self.fd_file, flush=True)

    def say(self, text=""):
        with self.lock:
            print(text, flush=True)

    def relay(self, role: str, line: str) -> None:
        with self.lock:
            self.relayed += 1
            if self.relayed <= RELAY_LINE_LIMIT:
                print(f"  {role}> {printable(line[:RELAY_LINE_CHARS])}", flush=True)
            elif self.relayed == RELAY_LINE_LIMIT + 1:
                print(f"  {role}> ... (further output of the submission dropped)", flush=True)


def _fmt_ns(ns: float) -> str:
    return f"{ns / 1e6:.4f} ms" if ns >= 1e5 else f"{ns / 1e3:.2f} us"


def _indented(text: str, spaces: int) -> str:
    """A message under its case's line: every line indented, so that none (a line of the submission's text
    in it above all) starts where the report's own lines do."""
    return "\n".join(" " * spaces + line for line in str(text).strip().splitlines())


def _first_line(message: str, limit: int = REPORT_LINE_LIMIT) -> str:
    text = " | ".join(line.strip() for line in str(message).strip().splitlines() if line.strip())
    return text if len(text) <= limit else text[:limit] + " ..."


@dataclasses.dataclass
class Outcome:
    ok: bool
    summary: list  # human lines printed after every worker process is gone


def run_tests(report: Report, judge: Judge, cases: list[TestCase], clock: "RunClock") -> Outcome:
    report.log("test-count", len(cases))
    passed = skipped = 0
    for i, case in enumerate(cases):
        report.log(f"test.{i}.spec", case.spec)
        start = time.perf_counter()
        try:
            clock.start_case(len(cases) - i)
            judge.check_fits(case)
            judge.ensure_started(judge.worker, clock.left())
            good, message = judge.call_once(judge.prepare(judge.reference.generate_input(**case.args), form_too=True),
                                            clock.deadline)
        except CaseSkipped as e:
            skipped += 1
            report.skipped(f"test.{i}", case, str(e), f"[SKIP] test {i}: {case.spec}\n       {e}")
            continue
        except Exception as e:
            good, message = False, failure_text(e)
            judge.worker.stop()
        finally:
            judge.release_memory()  # the case's input is gone before the next one is weighed and made
        took = time.perf_counter() - start
        report.log(f"test.{i}.status", "pass" if good else "fail")
        report.log(f"test.{i}.{'message' if good else 'error'}", _first_line(message))
        passed += good
        report.record(spec=case.spec, status="pass" if good else "fail", message=message)
        report.say(f"[{'PASS' if good else 'FAIL'}] test {i}: {case.spec}  ({took:.1f} s)")
        report.say(_indented(_first_line(message) if good else message, 7))
    summary = f"\n{passed}/{len(cases) - skipped} tests passed" + (f", {skipped} skipped (memory)" if skipped else "")
    if skipped == len(cases):
        return Outcome(False, [summary, "no case could run on this machine"])
    if skipped:  # memory a submission left behind (in /dev/shm, from an earlier run) must not pass a case
        return Outcome(False, [summary, "not every case could run on this machine, so the run does not pass"])
    return Outcome(passed == len(cases), [summary])


def refuse_unfit_cases(report: Report, mode: str, cases: list, unfit: list) -> Outcome:
    """test and leaderboard modes, whose check and score cover every case, on a machine that cannot run some of
    them: said before any case runs (each weighed from its sizes), with what to do instead."""
    key = "test" if mode == "test" else "benchmark"
    report.log(f"{key}-count", len(cases))
    reasons = dict(unfit)
    for i, case in enumerate(cases):  # every case gets its lines (a reader stops at the first without them)
        report.log(f"{key}.{i}.spec", case.spec)
        why = reasons.get(i, f"not run: {'case' if len(unfit) == 1 else 'cases'} "
                             f"{', '.join(str(j) for j, _ in unfit)} cannot run on this machine")
        report.skipped(f"{key}.{i}", case, why, f"[SKIP] case {i}: {case.spec}\n       {why}")
    covers = "a check" if mode == "test" else "a ranked score"
    return Outcome(False, [f"\n{mode}: {len(unfit)} of the {len(cases)} cases cannot run on this machine, and {covers} "
                           f"covers every case, so no case was run. Run on a machine with more memory (a GPU "
                           f"machine runs every case of task.yml), or give a tests file of smaller cases: "
                           f"python eval.py {mode} my_cases.txt (one case a line, as in task.yml)"])


@dataclasses.dataclass
class CaseTimes:
    """A timed case: its statistics and the judge's figures (stats), or why it failed (error); the raw
    calls and null calls either way (for --json)."""
    error: str = ""
    skipped: str = ""
    stats: dict = dataclasses.field(default_factory=dict)
    calls: list = dataclasses.field(default_factory=list)
    nulls: list = dataclasses.field(default_factory=list)


def benchmark_case(judge: Judge, case: TestCase, clock: "RunClock", cases_left: int, ranked: bool) -> CaseTimes:
    result = CaseTimes()
    try:
        share_s = clock.start_case(cases_left)
        judge.check_fits(case)
        result.error = _time_case(judge, case, clock, share_s, ranked, result)
    except CaseSkipped as e:
        result.skipped = str(e)
    except Exception as e:
        result.error = failure_text(e)
    return result


def _prepare_timed(judge: Judge, clock: "RunClock", args: dict, form_too: bool) -> Prepared:
    """A case's input, generated and prepared by the judge; that work is credited to the clock (on the
    CPU it takes seconds a call and must not count against the submission's limit)."""
    made = time.monotonic()
    prep = judge.prepare(judge.reference.generate_input(**args), form_too=form_too)
    clock.credit(time.monotonic() - made)
    return prep


def _warm_up(judge: Judge, worker: WorkerProcess, prep: Prepared, deadline: float) -> float:
    """WARMUP_CALLS timed calls of the worker; how long the null's calls are to take (their median)."""
    warm = [judge.timed(worker, prep, deadline)[0].device_ns for _ in range(WARMUP_CALLS)]
    return _median(warm) if all(math.isfinite(x) and x > 0 for x in warm) else 0.0


def _calibrate_nulls(judge: Judge, worker: WorkerProcess, prep: Prepared, deadline: float) -> list:
    """The worker warmed up, the null too, then NULL_CALIBRATION null calls that take as long as its calls."""
    mimic = _warm_up(judge, worker, prep, deadline)
    judge.null_call(prep, deadline, mimic)  # its warm-up: a process's first call loads kernels (~30 ms on the H200)
    return [judge.null_call(prep, deadline, mimic) for _ in range(NULL_CALIBRATION)]


def _timed_checked_call(judge: Judge, worker: WorkerProcess, prep: Prepared, deadline: float, i: int,
                        calls: list, nulls: list, periodic_nulls: bool = True) -> str:
    """Timed call i of a case: checked, its reported time sane and over the memory floor, appended to
    calls, with the null calls that keep its kind calibrated appended to nulls (the periodic ones only if
    periodic_nulls; compare mode schedules those itself). '' or why it failed."""
    gc.disable()
    try:
        call, returned = judge.timed(worker, prep, deadline)
    finally:
        gc.enable()
    good, message = judge.check(prep, returned)
    if not good:
        return f"timed call {i}: {message}"
    if not math.isfinite(call.device_ns) or call.device_ns <= 0:
        return f"timed call {i}: the submission's process reported a time of {call.device_ns} ns"
    if prep.floor_ns is not None and call.device_ns < prep.floor_ns:
        return (f"timed call {i}: the submission's process reported {_fmt_ns(call.device_ns)}, under the memory "
                f"floor of this input ({_fmt_ns(prep.floor_ns)}: the bytes it must move at the device's peak "
                f"bandwidth)")
    calls.append(call)
    kind = [c.device_ns for c in calls if c.early == call.early]
    if call.early and not any(n.early for n in nulls):  # the first call released before it returned
        nulls.extend(judge.null_call(prep, deadline, _median(kind), early=True) for _ in range(NULL_CALIBRATION))
    if periodic_nulls and len(calls) % NULL_EVERY == 0:
        _periodic_null(judge, prep, deadline, calls, nulls)
    return ""


def _periodic_null(judge: Judge, prep: Prepared, deadline: float, calls: list, nulls: list) -> None:
    """The null call _timed_checked_call adds after every NULL_EVERY-th call, for a caller that places it."""
    kind = [c.device_ns for c in calls if c.early == calls[-1].early]
    nulls.append(judge.null_call(prep, deadline, _median(kind), early=calls[-1].early))


def _time_case(judge: Judge, case: TestCase, clock: "RunClock", share_s: float, ranked: bool,
               result: CaseTimes) -> str:
    """Fills result.calls, .nulls and .stats; returns '' or why the case failed. share_s: the case's
    share of the run's time left; its timing loops stop after a part of it. A case whose reports lie under
    the judge's clock by more than the band is timed again on fresh processes (RETIMES) before it fails."""
    band = BANDS["cuda" if judge.cuda else "cpu"]
    case_start = time.monotonic()
    late_holds = judge.worker.late_holds
    first, timings = None, []
    for attempt in range(1 + RETIMES):
        if attempt:
            judge.stop_workers()  # fresh processes, and so fresh CUDA contexts
            result.calls.clear()
            result.nulls.clear()
        judge.ensure_started(judge.worker, clock.left())
        judge.ensure_started(judge.null, clock.left())
        first = first or _prepare_timed(judge, clock, case.args, form_too=True)
        good, message = judge.call_once(first, clock.deadline)
        if not good:
            return message
        share_left = max(share_s - (time.monotonic() - case_start), 0.0)
        problem = _timing_loop(judge, case, first, clock, share_left, ranked, result.calls, result.nulls)
        if problem:
            return problem
        timings.append(timing_gap(result.calls, result.nulls, band if judge.cuda else None))
        # A process whose switches (or, on the CPU, whose null calls) ran slow is not the submission's doing:
        # a second draw of processes; what fails is what both draws say.
        kept, how, used_calls = case_ranking(result.calls, result.nulls, judge.cuda, first.floor_ns)
        problem = check_timings(timings, band) or ("" if judge.cuda else _baseline_problem(kept, how, used_calls))
        if not problem:
            break
    else:
        return problem
    calls, nulls = result.calls, result.nulls
    times = [t for t, _ in how]
    used = [times[i] for i in used_calls]
    stats = result.stats = dataclasses.asdict(calculate_stats(used))
    host = [c.host_ns for c in kept if math.isfinite(c.host_ns)]
    stats["host"] = sum(host) / len(host) if judge.cuda and host else float("nan")  # as the worker measured it
    stats["floor"] = first.floor_ns if first.floor_ns is not None else float("nan")
    stats["judge"] = sum(c.device_ns for c in kept) / len(kept) + overhead_gap(kept, nulls)
    claimed, gap = mean_timing(timings) or (math.nan, math.nan)  # what check_timings held to the band
    stats["band"] = band.at(claimed) if math.isfinite(claimed) else math.nan
    stats["gap"] = gap
    stats["early"] = sum(c.early for c in calls)
    stats["stragglers"] = len(calls) - len(kept)
    stats["slowest"] = len(times) - len(used)
    stats["lifted"] = sum(h == "lifted" for _, h in how)
    stats["above"] = sum(h == "judge" for _, h in how) if judge.cuda else 0
    stats["retimed"] = attempt
    stats["late_holds"] = judge.worker.late_holds - late_holds
    return ""


def case_ranking(calls: list, nulls: list, cuda: bool, floor_ns: float | None) -> tuple[list, list, list]:
    """A case's ranking: the calls it ranks (ranked_calls), how each is ranked (rank_calls), and the indices of
    those its statistics use (fastest)."""
    kept = ranked_calls(calls)
    how = rank_calls(kept, nulls, cuda, floor_ns=floor_ns or 0.0)
    return kept, how, fastest([t for t, _ in how])


def _baseline_problem(kept: list, how: list, used: list) -> str:
    """On the CPU, where the judge's clock is ranked (case_ranking's figures): '' unless the calls' ranked
    mean (the judge's clock less the null's overhead) is under a quarter of what they report, which an
    honest call's is not (about what it reports) and a null baseline inflated by the submission's doing is."""
    reported = [kept[i].device_ns for i in used if not kept[i].early]
    if not reported:
        return ""
    ranked, claimed = sum(how[i][0] for i in used) / len(used), sum(reported) / len(reported)
    if ranked >= 0.25 * claimed:
        return ""
    return (f"the submission's process reports its calls as taking {_fmt_ns(claimed)} each and the judge's "
            f"clock, less the null submission's overhead, saw {_fmt_ns(ranked)}: the report or the baseline "
            f"cannot be trusted")


def _timing_loop(judge: Judge, case: TestCase, prep: Prepared, clock: "RunClock", share_s: float, ranked: bool,
                 calls: list, nulls: list) -> str:
    """A case's null calibration and timed calls (on prep, or in ranked mode on a fresh input each), until
    the stopping rule; '' or why a call failed."""
    nulls.extend(_calibrate_nulls(judge, judge.worker, prep, clock.deadline))
    repeats, max_time = (RANKED_MAX_REPEATS, RANKED_MAX_TIME_NS) if ranked else (BENCH_MAX_REPEATS, BENCH_MAX_TIME_NS)
    repeats = repeats if judge.cuda else min(repeats, CPU_MAX_REPEATS)
    wall_start = time.perf_counter_ns()
    wall_limit = min(WALL_LIMIT_NS, LOOP_SHARE * share_s * 1e9)
    for i in range(repeats):
        if ranked:  # a fresh input from a secret seed: nothing of it exists before this call
            prep = _prepare_timed(judge, clock, dict(case.args, seed=secrets.randbits(63)), form_too=False)
        problem = _timed_checked_call(judge, judge.worker, prep, clock.deadline, i, calls, nulls)
        if problem:
            return problem
        if i + 1 >= MIN_RUNS:  # what is ranked, never a bare report
            s = calculate_stats(without_slowest(ranked_times(calls, nulls, judge.cuda)))
            if (s.err / s.mean < 0.001 or s.mean * s.runs > max_time
                    or time.perf_counter_ns() - wall_start > wall_limit):
                break
    return ""


def run_benchmarks(report: Report, judge: Judge, cases: list[TestCase], clock: "RunClock", ranked: bool) -> Outcome:
    if not judge.cuda:
        report.say("NOTE: no CUDA device: the times below are CPU wall-clock times of whatever path the "
                   "submission takes on the CPU, not GPU kernel times.\n")
    report.log("benchmark-count", len(cases))
    header = (f"{'#':>2}  {'case':52s} {'mean':>11s} {'+-err':>9s} {'best':>11s} {'runs':>5s} "
              f"{'host/call':>10s} {'floor':>10s} {'%floor':>6s}")
    report.say(header)
    report.say("-" * len(header))
    means, bests, notes, failed = [], [], [], []
    for i, case in enumerate(cases):
        report.log(f"benchmark.{i}.spec", case.spec)
        times = benchmark_case(judge, case, clock, len(cases) - i, ranked)
        judge.release_memory()
        if times.skipped:
            report.skipped(f"benchmark.{i}", case, times.skipped, f"{i:>2}  {case.spec:52s} SKIP\n      {times.skipped}")
            if ranked:  # a ranked score covers every case: one skipped (for memory) cannot leave a fast subset
                return Outcome(False, [f"\nleaderboard: case {i} could not run on this machine, so the run ends "
                                       f"here: no score"])
            notes.append(f"case {i} skipped: the score covers the other cases only")
            continue
        report.record(spec=case.spec, status="fail" if times.error else "pass", error=times.error, stats=times.stats,
                      calls=[dataclasses.astuple(c) for c in times.calls],
                      nulls=[dataclasses.astuple(c) for c in times.nulls])
        if times.error:
            report.log(f"benchmark.{i}.status", "fail")
            report.log(f"benchmark.{i}.error", _first_line(times.error))
            report.say(f"{i:>2}  {case.spec:52s} FAIL\n{_indented(times.error, 6)}")
            failed.append(i)
            judge.stop_workers()  # one may still be stuck in the failed call: fresh ones for the next case
            if ranked:  # as GPU MODE: a failed case ends a ranked run; benchmark mode goes on
                return Outcome(False, [f"\nleaderboard: case {i} failed, so the run ends here: no score"])
            continue
        result = times.stats
        for key, value in result.items():
            if not (isinstance(value, float) and math.isnan(value)):
                report.log(f"benchmark.{i}.{key}", value)
        means.append(result["mean"])
        bests.append(result["best"])
        host = _fmt_ns(result["host"]) if math.isfinite(result["host"]) else "-"
        floor = _fmt_ns(result["floor"]) if math.isfinite(result["floor"]) else "-"
        pct = f"{100 * result['floor'] / result['mean']:.0f}%" if math.isfinite(result["floor"]) else "-"
        report.say(f"{i:>2}  {case.spec:52s} {_fmt_ns(result['mean']):>11s} {_fmt_ns(result['err']):>9s} "
                   f"{_fmt_ns(result['best']):>11s} {result['runs']:>5d} {host:>10s} {floor:>10s} {pct:>6s}")
        timed = result["runs"] + result["stragglers"] + result["slowest"]
        if result["stragglers"]:
            notes.append(f"case {i}: {result['stragglers']} of {timed} calls had not "
                         f"returned {RETURN_WAIT_S * 1e3:g} ms after they were made while the others had (a stall of "
                         f"the host): left out of the ranked statistics, checked")
        elif result["early"]:
            notes.append(f"case {i}: {result['early']} of {timed} calls had not returned "
                         f"{RETURN_WAIT_S * 1e3:g} ms after they were made (custom_kernel waits on the GPU, or its "
                         f"host path is slower): those are timed on the judge's clock as they ran, host time included")
        if result["lifted"] or result["above"]:
            notes.append(f"case {i}: of {timed} calls, {result['lifted']} reported more than {CALL_BANDS} bands under "
                         f"the judge's clock were ranked at that bound, {result['above']} reported more than "
                         f"{CALL_BANDS} bands over it (a stall the judge's clock did not see) on the judge's clock")
        if result["retimed"]:
            notes.append(f"case {i}: its reports lay under the judge's clock by more than the band, so it was timed "
                         f"again on fresh processes; over both timings, {_fmt_ns(result['gap'])} (the band "
                         f"{_fmt_ns(result['band'])})")
        if result["late_holds"]:
            notes.append(f"case {i}: in {result['late_holds']} calls the one-block hold did not run within "
                         f"{HOLD_SWAP_WAIT_S * 1e3:g} ms of the full-SM hold's release (kernels of the submission's on "
                         f"other streams held the SMs, or the holds were dropped): the judge's work then took the SMs "
                         f"from whatever held them, which slows the call that follows")
    if failed:
        return Outcome(False, [*notes, f"\n{len(failed)} of {len(cases)} cases failed ({', '.join(map(str, failed))}): "
                                       f"no score"])
    if not means:
        return Outcome(False, [*notes, "\nno case could run on this machine: no score"])
    geo = math.exp(sum(math.log(m) for m in means) / len(means))
    best = math.exp(sum(math.log(b) for b in bests) / len(bests))
    band = BANDS["cuda" if judge.cuda else "cpu"]
    summary = [*notes, f"\ngeometric mean of the means (ranking score): {_fmt_ns(geo)}",
               f"geometric mean of the best calls (not ranked): {_fmt_ns(best)}",
               f"every case's times agree with the judge's clock (band {_fmt_ns(band.abs_ns)} + {band.rel:.0%} of "
               f"the report); the slowest {SLOWEST_SHARE:.0%} of each case's calls (one at least) left out"]
    return Outcome(True, summary)


def run_profiles(report: Report, judge: Judge, cases: list[TestCase], clock: "RunClock") -> Outcome:
    report.log("benchmark-count", len(cases))
    ok = True
    for i, case in enumerate(cases):
        report.log(f"benchmark.{i}.spec", case.spec)
        try:
            clock.start_case(len(cases) - i)
            judge.check_fits(case)
            judge.ensure_started(judge.worker, clock.left())
            prep = judge.prepare(judge.reference.generate_input(**case.args), form_too=True)
            table = judge.profile(prep, clock.deadline)
            del prep
        except CaseSkipped as e:
            report.skipped(f"benchmark.{i}", case, str(e), f"profile {i}: {case.spec}: SKIP\n{e}")
            continue
        except Exception as e:
            ok = False
            judge.worker.stop()
            why = failure_text(e)
            report.log(f"benchmark.{i}.status", "fail")
            report.log(f"benchmark.{i}.error", _first_line(why))
            report.record(spec=case.spec, status="fail", error=why)
            report.say(f"profile {i}: {case.spec}: FAIL\n{_indented(why, 6)}")
            continue
        report.record(spec=case.spec, status="pass", table=table)
        report.log(f"benchmark.{i}.report", base64.b64encode(table.encode(), b"+*").decode())
        report.say(f"profile {i}: {case.spec}\n{_indented(table, 2)}")
    return Outcome(ok, [])


def _log_ratio(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean and standard error of log(a_i / b_i) over paired calls."""
    logs = [math.log(x / y) for x, y in zip(a, b) if x > 0 and y > 0]
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / max(len(logs) - 1, 1))
    return mean, sd / math.sqrt(len(logs))


def _bounds(log_mean: float, log_se: float, spread: float) -> tuple[float, float]:
    half = COMPARE_Z * log_se + math.log1p(spread)
    return math.exp(log_mean - half), math.exp(log_mean + half)


def _interval(log_mean: float, log_se: float, spread: float) -> str:
    lo, hi = _bounds(log_mean, log_se, spread)
    return f"{math.exp(log_mean):.3f} [{lo:.3f}, {hi:.3f}]"


_TURNS = (("A", "B"), ("B", "A"))


def compare_order(i: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Compare mode's pair i: the order of its two calls, and the null calls after it (one per side, after
    every NULL_EVERY pairs, never inside a pair). A call right after a null call runs slower, and so does
    the first null call of two in a row (on two CPU cores the side these fell to read 4 to 10 % slower),
    so A and B take turns at both: at going first in a pair, in the pair after each block of nulls, and in
    each block."""
    block = i // NULL_EVERY
    return _TURNS[(i + block) % 2], (_TURNS[block % 2] if (i + 1) % NULL_EVERY == 0 else ())


def compare_case(judge: Judge, case: TestCase, clock: RunClock, share_s: float) -> tuple[str, dict]:
    """A against B on one input: ('', figures) or (why the case failed, {}). Both are checked, then
    timed in the turns compare_order gives, on the same protocol, each against nulls that take as long as
    its calls; the ratio is the geometric mean of the per-pair ratios of their ranked times."""
    sides = {"A": judge.worker, "B": judge.other}
    for w in (*sides.values(), judge.null):
        judge.ensure_started(w, clock.left())
    prep = _prepare_timed(judge, clock, case.args, form_too=True)
    for name, w in sides.items():
        good, message = judge.call_once(prep, clock.deadline, worker=w)
        if not good:
            return f"{name}: {message}", {}
    calls = {name: [] for name in sides}
    band = COMPARE_BANDS["cuda" if judge.cuda else "cpu"]
    mimic = {name: _warm_up(judge, w, prep, clock.deadline) for name, w in sides.items()}
    nulls = {name: [] for name in sides}
    for k in range(NULL_CALIBRATION):
        for name in _TURNS[k % 2]:
            nulls[name].append(judge.null_call(prep, clock.deadline, mimic[name]))
    wall_start, wall_limit = time.perf_counter_ns(), min(WALL_LIMIT_NS, LOOP_SHARE * share_s * 1e9)
    for i in range(BENCH_MAX_REPEATS if judge.cuda else CPU_MAX_REPEATS):
        pair, nulls_after = compare_order(i)
        for name in pair:
            problem = _timed_checked_call(judge, sides[name], prep, clock.deadline, i, calls[name], nulls[name],
                                          periodic_nulls=False)
            if problem:
                return f"{name}: {problem}", {}
        for name in nulls_after:
            _periodic_null(judge, prep, clock.deadline, calls[name], nulls[name])
        if i + 1 >= MIN_RUNS:
            _, se = _log_ratio(ranked_times(calls["A"], nulls["A"], judge.cuda, band),
                               ranked_times(calls["B"], nulls["B"], judge.cuda, band))
            if se < 0.001 or time.perf_counter_ns() - wall_start > wall_limit:
                break
    for name in sides:
        problem = verify_times(calls[name], nulls[name], band, cuda=judge.cuda)
        if problem:
            return f"{name}: {problem}", {}
    keep = kept_calls([a.early or b.early for a, b in zip(calls["A"], calls["B"])])  # stragglers, by pair
    ranked = {name: [t for t, k in zip(ranked_times(calls[name], nulls[name], judge.cuda, band), keep) if k]
              for name in sides}
    log_mean, log_se = _log_ratio(ranked["A"], ranked["B"])
    return "", {"A": sum(ranked["A"]) / len(ranked["A"]), "B": sum(ranked["B"]) / len(ranked["B"]),
                "log_ratio": log_mean, "log_se": log_se, "pairs": len(ranked["A"])}


def run_compare(report: Report, judge: Judge, cases: list[TestCase], clock: RunClock, names: tuple) -> Outcome:
    report.say(f"A = {names[0]}\nB = {names[1]}\n")
    if not judge.cuda:
        report.say("NOTE: no CUDA device: CPU wall-clock times of whatever path each submission takes on the CPU.\n")
    header = f"{'#':>2}  {'case':52s} {'A mean':>11s} {'B mean':>11s} {'pairs':>5s}  A/B [95 % interval]"
    report.say(header)
    report.say("-" * len(header))
    logs, variances, failed, skipped = [], [], [], []
    spread = COMPARE_PROCESS_SPREAD["cuda" if judge.cuda else "cpu"]
    for i, case in enumerate(cases):
        try:
            share_s = clock.start_case(len(cases) - i)
            judge.check_fits(case)
            error, fig = compare_case(judge, case, clock, share_s)
        except CaseSkipped as e:
            report.skipped("", case, str(e), f"{i:>2}  {case.spec:52s} SKIP\n      {e}")
            skipped.append(i)
            continue
        except Exception as e:
            error, fig = failure_text(e), {}
        judge.release_memory()
        report.record(spec=case.spec, status="fail" if error else "pass", error=error, stats=fig)
        if error:
            failed.append(i)
            judge.stop_workers()
            report.say(f"{i:>2}  {case.spec:52s} FAIL\n{_indented(error, 6)}")
            continue
        logs.append(fig["log_ratio"])
        variances.append(fig["log_se"] ** 2)
        report.say(f"{i:>2}  {case.spec:52s} {_fmt_ns(fig['A']):>11s} {_fmt_ns(fig['B']):>11s} {fig['pairs']:>5d}  "
                   f"{_interval(fig['log_ratio'], fig['log_se'], spread)}")
    if failed or not logs:
        return Outcome(False, [f"\n{len(failed)} of {len(cases)} cases failed: no comparison" if failed
                               else "\nno case could run: no comparison"])
    mean = sum(logs) / len(logs)
    se = math.sqrt(sum(variances)) / len(logs)
    lo, hi = _bounds(mean, se, spread)
    verdict = ("A is faster" if hi < 1 else "A is slower" if lo > 1 else
               "no difference the run can tell (the interval holds 1)")
    over = f"the {len(logs)} cases that ran" if skipped else "the cases"
    return Outcome(True, [f"\ngeometric mean of A/B over {over}: {_interval(mean, se, spread)} (95 %, widened by "
                          f"the {spread:.1%} two processes of one file differ by): {verdict}"])


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------
class FileGuard:
    """The problem's files and this harness as they were when the run began, bytes and metadata, and the
    interpreter's metadata and start-up files (startup_files): a run during which any of them changed
    fails, naming them (they are not put back: the change may be a person's edit). Metadata too, because Landlock does not rule it: a worker of
    the files' owner can chmod, chown to a group of its own, set times and extended attributes."""

    def __init__(self, problem: Path):
        paths = {Path(__file__).resolve(), ROOT / "utils.py"}
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

    def changed(self) -> list[str]:
        changed = []
        for path, (content, metadata) in self.saved.items():
            try:
                same = self._metadata(path) == metadata and (content is None or path.read_bytes() == content)
            except OSError:
                same = False
            if not same:
                changed.append(str(path))
        changed += sorted(str(p) for p in self.startup_files() - set(self.saved))  # added during the run
        return changed


def triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except ImportError:
        return "not installed"


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
    if argv[:1] == ["--worker"]:
        return worker_main(argv[1:])
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
            report.log("error", _first_line(why))
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
    guard = FileGuard(problem)
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
