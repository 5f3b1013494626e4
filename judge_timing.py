"""The Judge: one run's workers, inputs, calls and checks, and the timed protocol of a call on the judge's
own clock (Judge.timed), with the GPU kernels only the judge launches (its stamps, the release, the quiet
probe) and the GPU watchdog."""
import ctypes
import dataclasses
import gc
import math
import mmap
import secrets
import select
import signal
import struct
import threading
import time
from pathlib import Path

from judge_cases import TestCase
from judge_process import (
    CaseFailure, CaseSkipped, DescendantsStopped, InputLayout, Sandbox, SharedRegion, Warden, WorkerProcess,
    _descendants, _signal_all, available_memory, bytecode_from_source, kill_descendants)
from judge_report import Report, from_submission, triton_version
from judge_stats import TimedCall, fmt_ns, peak_bandwidth
from judge_worker import (
    DIGEST_AT, DIGEST_BLOCK, DIGEST_LEVELS, HOLD_PTX, LET_GO_AT, ONE_BLOCK_HOLD, POLL_S, RELEASE_AT, STAGED_AT,
    CudaDriver, IpcHandle, _dtypes, _libc, digest_words, hold_targets)


class JudgeDriver(CudaDriver):
    """The worker's driver calls and the judge's own: its shared regions' memory and IPC handles, and the
    reset of L2 lines a submission marked persisting."""

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self._call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(nbytes))
        return ptr.value

    def ipc_handle(self, ptr: int) -> bytes:
        handle = IpcHandle()
        self._call("cuIpcGetMemHandle", ctypes.byref(handle), ctypes.c_uint64(ptr))
        return bytes(handle)  # all 64 bytes (the field itself would stop at the first zero byte)

    def reset_persisting_l2(self) -> None:
        """Lines a submission marked persisting (cudaAccessPolicyWindow) become evictable again."""
        self._call("cuCtxResetPersistingL2Cache")


# The judge's side of the output's digest (judge_worker.py says what it is and why): a key per call, and
# the digest of the bytes the judge copied, in torch ops, independent of the worker's Triton kernel.
_DIGEST_MULTIPLIER = 0xBF58476D1CE4E5B9  # splitmix64's


def _as_int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def digest_key() -> list[int]:
    """A fresh key for one timed call: one signed 64-bit integer per lane."""
    return [_as_int64(secrets.randbits(64)) for _ in range(2)]


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


# On the CPU the judge, the worker and their copies of an input share the machine's memory: a case runs
# only when this many times its input (reference.input_bytes) is available. eval.py test peaks at 3.2x
# the input at 64 x 8192; a ranked run holds two inputs while it generates the next.
HARNESS_MEMORY_FACTOR = 6

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
# The judge's gate (Judge.timed) opens by itself this long after it starts, should the judge's host be held
# up queuing a call's work behind it (the call is then timed with that delay in it, not lost).
GATE_TIMEOUT_NS = 1_000_000_000


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


@dataclasses.dataclass
class Prepared:
    """One input, as the judge holds it: where its pristine tensors go in the arena, its check, and the
    memory floor of a call on it."""
    layout: InputLayout
    check: object
    floor_ns: float | None


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

        with bytecode_from_source():  # torch first: only the problem's own modules compile from source here
            import reference
            import utils

        self.torch, self.reference = torch, reference
        self.cuda = torch.cuda.is_available()
        self.flush = utils.L2Flush() if self.cuda else None  # also makes torch's context current
        self.driver = JudgeDriver() if self.cuda else None
        self.peak_bw = peak_bandwidth(torch) if self.cuda else None
        for w in self.workers:
            w.attach(self.cuda, self.driver)
        if self.cuda:
            self.stamp_fn = self.driver.function(_STAMP_PTX, "eval_stamp")
            self.release_fn = self.driver.function(_RELEASE_PTX, "eval_release")
            # The gate: the judge's own hold (on a page no worker maps), which keeps its stream from starting
            # a timed call's work until all of it is queued (Judge.timed).
            self.gate_fn = self.driver.function(HOLD_PTX, "eval_hold")
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
        struct.pack_into("<2q", worker.flag, DIGEST_AT, 0, 0)
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
                    f"work still took the GPU from the judge for up to {fmt_ns(gap)} at a time for "
                    f"{QUIET_WAIT_S:.0f} s (GPU work the submission left queued after its call returned, or "
                    f"another process on this GPU); the judge measures its own overhead on a quiet GPU")


def _reported(done: dict) -> float:
    """The time the worker reports (ns), or NaN for anything that is not a number a float can hold."""
    value = done.get("device_ns")
    try:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")
    except OverflowError:  # an integer past float's range
        return float("nan")
