"""The judge's side of a worker: the judge kept out of the worker's reach, the sandbox a worker runs in, its
process and its messages, the memory they share, and the clean-up of everything a worker started (the
warden, process groups, DescendantsStopped)."""
import contextlib
import ctypes
import fcntl
import json
import mmap
import os
import pickle
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
from pathlib import Path

from judge_report import RELAY_LINE_CHARS, Report, first_line, printable_message, from_submission
from judge_worker import (
    ANNOUNCE_AT, CudaArray, OTHER_SUBMISSION, POLL_S, PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE, RELEASE_AT,
    _libc, arena_view, hold_targets, recv_frame, send_frame)

ROOT = Path(__file__).resolve().parent
# How long the judge waits, once it has let the full-SM hold go, for the one-block hold behind it to say
# it runs (so that the full hold has left the SMs before the judge's own work needs them); past this it
# goes on regardless, and the report counts such calls (`late_holds`). The wait is before the judge's
# clock starts: it costs the run wall time, not a call time.
HOLD_SWAP_WAIT_S = 0.01
WORKER_FRAME_LIMIT = 8 << 20


def protect_judge() -> None:
    """The judge is not dumpable, so that a process of the same user (the worker) can neither ptrace
    it nor open its /proc files (fd, mem, environ); and it is the subreaper of everything it starts,
    so that a worker's detached descendants stay in its tree, where stop() finds them."""
    libc = _libc()
    if libc is None or not sys.platform.startswith("linux"):
        return
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _read_or_empty(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


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
            self.tensor = torch.as_tensor(CudaArray(ptr, self.nbytes))
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


class CaseFailure(Exception):
    """The case could not produce a result: exception, crash or timeout in the worker."""


def failure_text(e: Exception) -> str:
    """Why a case failed: a CaseFailure's own words. Any other exception is the judge's own work on the case
    failing (on a GPU most often for memory that the submission's processes hold), said so, not as a
    traceback that ends the run."""
    if isinstance(e, CaseFailure):
        return str(e)
    text = f"the judge's own work on this case failed: {type(e).__name__}: {first_line(str(e))}"
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


@contextlib.contextmanager
def bytecode_from_source():
    """Imports inside compile the modules they load from source into a private folder, and read no .pyc
    beside them: for the problem's modules (reference, task, utils), which a worker able to write their
    folder could otherwise have planted compiled code beside for a later run. (Only around those imports:
    torch and the rest of site-packages keep their own.)"""
    saved = sys.pycache_prefix
    private = tempfile.mkdtemp(prefix="eval-bytecode-")
    sys.pycache_prefix = private
    try:
        yield
    finally:
        sys.pycache_prefix = saved
        shutil.rmtree(private, ignore_errors=True)


# The worker's code (judge_worker.py) as the judge read it before any submission ran, for the workers to
# start from. A worker started from a file in its sandbox would run whatever a previous worker wrote there,
# before it confines itself (the confinement is that file's code): so the judge starts every worker from a
# sealed copy.
WORKER_CODE = ROOT / "judge_worker.py"
_worker_code = []


def worker_code_fd() -> int | None:
    if not _worker_code:
        _worker_code.append(sealed_copy(WORKER_CODE.read_bytes(), "judge-worker.py"))
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
            shutil.copy2(WORKER_CODE, self.dir / WORKER_CODE.name)
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
        script = f"/proc/self/fd/{code}" if code is not None else str(self.sandbox.dir / WORKER_CODE.name)
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
                msg = printable_message(json.loads(recv_frame(self.sock, WORKER_FRAME_LIMIT,
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
