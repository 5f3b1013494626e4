"""Does how eval.py hands a call its inputs change the call's GPU time? (GPU)

Does eval.py rank a call as tools/problem_loader.median_gpu_us times the same call in one process
(docs/judge.md, "The ranked time against a one-process timer")? Per benchmark case, this times
the same custom_kernel call, interleaved call by call, with the inputs placed and the GPU held these ways:

- fresh: generate_input's own tensors, the one-process timer (flush, a 200 us one-thread spin, call);
- arena: copies of them in one raw driver allocation at eval.py's InputLayout offsets, same timer;
- ipc: that arena allocated and written by a second process and mapped here by IPC handle, as eval.py's
  worker maps the judge's;
- ipc+turn: as ipc, with the L2 flush run by the second process in its own context (so the GPU switches
  contexts before the call, as it does between eval.py's judge and worker);
- hold: fresh inputs, but the call queued behind eval.py's hold (a kernel filling every SM, released
  by a host write) instead of the one-thread spin;
- held-1ms: as hold, released only after ~1 ms of spinning (as long as eval.py's hold spins);
- held+turn: ipc inputs, the call queued behind the hold, which the second process's flush preempts
  (its context takes the GPU from the spinning hold, as eval.py's judge does), then released;
- held+write+turn: as held+turn, the second process also rewriting the inputs before its flush, as
  eval.py's judge does before every call;
- held+turn+flush, held+turn+touch: as held+turn, with an L2 flush in this context, or a read of one
  byte per 2 MB of the inputs, queued between the hold and the start event;
- held+turn+flush1x: as held+turn+flush, the flush reading once the L2's size instead of twice;
- ipc-flush1x: as ipc, with that smaller flush;
- slim-held+turn: as held+turn, the hold one warp per block, 32 blocks an SM (as many blocks as an SM
  holds, half the threads);
- rev-held+write+turn(+flush): the arena allocated here and mapped by the second process, which
  rewrites it and flushes while the hold spins (without, or with, an L2 flush here after the hold);
- vmm-held+write+turn(+flush): as held+write+turn(+flush), the second process's arena made with the
  driver's virtual memory calls (cuMemCreate, 2 MB granules) and shared as a file descriptor instead of
  a legacy IPC handle;
- held+ce-turn, held+ce-write+turn: as held+turn and held+write+turn, the second process's work on its
  copy engines only (the flush a device-to-host copy of twice the L2, the write a device-to-device copy
  of the inputs), no kernel in its context: does it still take the SMs from the hold?
- tiny-held+write+turn: as held+write+turn, the hold one block of 32 threads;
- two-phase+write+turn: the full-SM hold lets go first (while the host would enqueue the call), then a
  one-block hold spins while the second process rewrites the inputs and flushes, then lets go.

    python tools/judge/placement_probe.py [--problem problems/paged_mqa_logits] [--cases 0,3,6] [--reps 20]
                                    [--out results/placement_probe_h200.md]
"""
import argparse
import contextlib
import ctypes
import io
import mmap
import multiprocessing as mp
import multiprocessing.reduction
import os
import statistics
import struct
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib")]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import problem_loader  # noqa: E402

import judge_process  # noqa: E402  (the judge's own InputLayout, driver calls and hold)
import judge_timing  # noqa: E402
import judge_worker  # noqa: E402

VARIANTS = ("fresh", "arena", "ipc", "ipc+turn", "hold", "held-1ms", "held+turn", "held+write+turn", "held+turn+flush",
            "held+turn+touch", "held+turn+flush1x", "ipc-flush1x", "slim-held+turn",
            "rev-held+write+turn", "rev-held+write+turn+flush",
            "vmm-held+write+turn", "vmm-held+write+turn+flush", "held+ce-turn", "held+ce-write+turn",
            "tiny-held+write+turn", "two-phase+write+turn")


def arena_copy(data):
    """data copied into one raw driver allocation at eval.py's InputLayout offsets: (pointer, bytes,
    layout, the arena as a uint8 tensor)."""
    import torch

    layout = judge_process.InputLayout(data)
    nbytes = layout.nbytes + 4096
    ptr = judge_timing.JudgeDriver().alloc(nbytes)
    arena = torch.as_tensor(judge_worker.CudaArray(ptr, nbytes))
    layout.write(layout.views(arena))
    torch.cuda.synchronize()
    return ptr, nbytes, layout, arena


class _AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requested_handle_types", ctypes.c_int), ("location_type", ctypes.c_int),
                ("location_id", ctypes.c_int), ("win32_metadata", ctypes.c_void_p), ("compression", ctypes.c_ubyte),
                ("rdma", ctypes.c_ubyte), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location_type", ctypes.c_int), ("location_id", ctypes.c_int), ("flags", ctypes.c_int)]


_PINNED, _POSIX_FD, _ON_DEVICE, _READ_WRITE, _GRANULE = 1, 1, 1, 3, 2 << 20


def _vmm_map(driver, handle: int, size: int) -> int:
    ptr = ctypes.c_uint64()
    driver._call("cuMemAddressReserve", ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(_GRANULE),
                 ctypes.c_uint64(0), ctypes.c_uint64(0))
    driver._call("cuMemMap", ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_uint64(handle),
                 ctypes.c_uint64(0))
    access = _AccessDesc(location_type=_ON_DEVICE, location_id=0, flags=_READ_WRITE)
    driver._call("cuMemSetAccess", ptr, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1))
    return ptr.value


def vmm_export(driver, nbytes: int) -> tuple[int, int, int]:
    """A device allocation of at least nbytes in 2 MB granules, mapped here: (pointer, size, its POSIX fd)."""
    prop = _AllocationProp(type=_PINNED, requested_handle_types=_POSIX_FD, location_type=_ON_DEVICE, location_id=0)
    size = -(-nbytes // _GRANULE) * _GRANULE
    handle, fd = ctypes.c_uint64(), ctypes.c_int()
    driver._call("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_uint64(0))
    driver._call("cuMemExportToShareableHandle", ctypes.byref(fd), handle, ctypes.c_int(_POSIX_FD), ctypes.c_uint64(0))
    return _vmm_map(driver, handle.value, size), size, fd.value


def vmm_import(driver, fd: int, size: int) -> int:
    handle = ctypes.c_uint64()
    driver._call("cuMemImportFromShareableHandle", ctypes.byref(handle), ctypes.c_void_p(fd), ctypes.c_int(_POSIX_FD))
    return _vmm_map(driver, handle.value, size)


def _arena_owner(problem: str, args: dict, conn) -> None:
    """The second process: the case's input in an arena of its own, shared by IPC handle; then flushes
    L2 in its context whenever asked."""
    import torch

    mods = problem_loader.load(problem)

    ptr, nbytes, layout, arena = arena_copy(mods.reference.generate_input(**args))
    flush = problem_loader.l2_flush()
    conn.send((judge_timing.JudgeDriver().ipc_handle(ptr), nbytes, layout.structure, layout.specs))
    views = layout.views(arena)
    pristine = arena.clone()
    flush_source = flush.buffer
    flush_sink = torch.empty(flush_source.shape, dtype=flush_source.dtype, pin_memory=True)
    their_handle, their_bytes = conn.recv()
    theirs = layout.views(torch.as_tensor(judge_worker.CudaArray(judge_timing.JudgeDriver().ipc_open(their_handle),
                                                             their_bytes)))
    try:
        vmm_ptr, vmm_size, vmm_fd = vmm_export(judge_timing.JudgeDriver(), nbytes)
        vmm_views = layout.views(torch.as_tensor(judge_worker.CudaArray(vmm_ptr, vmm_size)))
        layout.write(vmm_views)
        torch.cuda.synchronize()
        conn.send(vmm_size)
        multiprocessing.reduction.send_handle(conn, vmm_fd, os.getppid())
    except RuntimeError as e:
        conn.send(str(e))
    asks = ("flush", "write+flush", "rev-write+flush", "vmm-write+flush", "ce-flush", "ce-write+flush")
    while (ask := conn.recv()) in asks:
        if ask.startswith("ce-"):
            if ask == "ce-write+flush":
                arena.copy_(pristine, non_blocking=True)
            flush_sink.copy_(flush_source, non_blocking=True)
            torch.cuda.synchronize()
            conn.send("ok")
            continue
        if ask == "write+flush":
            layout.write(views)
        elif ask == "rev-write+flush":
            layout.write(theirs)
        elif ask == "vmm-write+flush":
            layout.write(vmm_views)
        flush()
        torch.cuda.synchronize()
        conn.send("ok")


class FlagHold:
    """eval.py's hold: a kernel over every SM's thread slots that spins until a host word reaches a value."""

    def __init__(self, slim=False, tiny=False):
        import torch

        torch.zeros(1, device="cuda")  # the primary context current before the driver calls
        self.driver = judge_timing.JudgeDriver()
        self.page = mmap.mmap(-1, 4096)  # page-aligned, as cuMemHostRegister wants
        self.dev = self.driver.host_register(ctypes.addressof(ctypes.c_char.from_buffer(self.page)), 4096)
        self.fn = self.driver.function(judge_worker.HOLD_PTX, "eval_hold")
        self.shape = judge_worker.hold_grid(torch)
        self.one_block = judge_worker.ONE_BLOCK_HOLD
        self.release_at, self.announce_at = judge_worker.RELEASE_AT, judge_worker.ANNOUNCE_AT
        self.swap_wait_s = judge_process.HOLD_SWAP_WAIT_S
        if slim:
            self.shape = (torch.cuda.get_device_properties(0).multi_processor_count * 32, 32)
        if tiny:
            self.shape = self.one_block
        self.seq = 0

    def launch(self, target: int, shape=None, announce: int = 0) -> None:
        import torch

        self.driver.launch(self.fn, *(shape or self.shape), torch.cuda.current_stream().cuda_stream,
                           [ctypes.c_uint64(self.dev + self.release_at), ctypes.c_uint32(target),
                            ctypes.c_uint64(10_000_000_000), ctypes.c_uint64(announce), ctypes.c_uint64(0)])

    def two_phase_gpu_us(self, fn, before_release) -> float:
        """eval.py's two holds: the full hold, then a one-block hold, then the call. The full hold lets go;
        once the one-block hold says it runs, before_release() runs on the host; then that lets go."""
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        self.seq += 2
        self.launch(self.seq - 1)
        self.launch(self.seq, self.one_block, announce=self.dev + self.announce_at)
        start.record()
        fn()
        end.record()
        struct.pack_into("<i", self.page, self.release_at, self.seq - 1)
        give_up = time.perf_counter() + self.swap_wait_s
        while struct.unpack_from("<i", self.page, self.announce_at)[0] != self.seq and time.perf_counter() < give_up:
            pass
        before_release()
        struct.pack_into("<i", self.page, self.release_at, self.seq)
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3

    def gpu_us(self, fn, flush) -> float:
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        flush()
        self.seq += 1
        self.launch(self.seq)
        start.record()
        fn()
        end.record()
        struct.pack_into("<i", self.page, self.release_at, self.seq)
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3

    def held_gpu_us(self, fn, before_release, settle=None) -> float:
        """The call queued behind the hold, which spins while before_release() runs on the host; settle:
        queued between the hold and the start event."""
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        self.seq += 1
        self.launch(self.seq)
        if settle is not None:
            settle()
        start.record()
        fn()
        end.record()
        before_release()
        struct.pack_into("<i", self.page, self.release_at, self.seq)
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3


def _spin_host(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def probe_case(problem: str, mods, case, reps: int, hold: FlagHold, slim: FlagHold, tiny: FlagHold,
               variants: tuple) -> dict:
    import torch

    kernel = mods.submission.custom_kernel
    fresh = mods.reference.generate_input(**case.args)
    own_ptr, own_bytes, layout, own = arena_copy(fresh)
    in_arena = judge_worker.build_input(layout.structure, layout.views(own))
    driver = judge_timing.JudgeDriver()

    parent, child = mp.get_context("spawn").Pipe()
    owner = mp.get_context("spawn").Process(target=_arena_owner, args=(problem, case.args, child), daemon=True)
    owner.start()
    handle, nbytes, structure, specs = parent.recv()
    parent.send((driver.ipc_handle(own_ptr), own_bytes))
    vmm_size = parent.recv()
    in_vmm = None
    if isinstance(vmm_size, str):
        print(f"no vmm variants: {vmm_size}", flush=True)
    else:
        vmm = torch.as_tensor(judge_worker.CudaArray(vmm_import(driver, multiprocessing.reduction.recv_handle(parent),
                                                            vmm_size), vmm_size))
        in_vmm = judge_worker.build_input(structure, [judge_worker.arena_view(vmm, s) for s in specs])
    mapped = torch.as_tensor(judge_worker.CudaArray(driver.ipc_open(handle), nbytes))
    in_ipc = judge_worker.build_input(structure, [judge_worker.arena_view(mapped, s) for s in specs])

    def other(ask):
        parent.send(ask)
        parent.recv()

    def other_flush():
        other("flush")

    flush = problem_loader.l2_flush()
    pages = mapped[:: 2 << 20]
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    small = torch.full((l2_bytes // 4,), 7, dtype=torch.int32, device="cuda")
    sink = torch.empty((), dtype=torch.int64, device="cuda")

    def flush1x():
        torch.sum(small, 0, dtype=torch.int64, out=sink)

    def touch():
        pages.sum(dtype=torch.int64)

    timers = {
        "fresh": lambda: problem_loader.queued_gpu_us(lambda: kernel(fresh), flush),
        "arena": lambda: problem_loader.queued_gpu_us(lambda: kernel(in_arena), flush),
        "ipc": lambda: problem_loader.queued_gpu_us(lambda: kernel(in_ipc), flush),
        "ipc+turn": lambda: problem_loader.queued_gpu_us(lambda: kernel(in_ipc), other_flush),
        "hold": lambda: hold.gpu_us(lambda: kernel(fresh), flush),
        "held-1ms": lambda: (flush(), hold.held_gpu_us(lambda: kernel(fresh), lambda: _spin_host(1e-3)))[1],
        "held+turn": lambda: hold.held_gpu_us(lambda: kernel(in_ipc), other_flush),
        "held+write+turn": lambda: hold.held_gpu_us(lambda: kernel(in_ipc), lambda: other("write+flush")),
        "held+turn+flush": lambda: hold.held_gpu_us(lambda: kernel(in_ipc), other_flush, flush),
        "held+turn+touch": lambda: hold.held_gpu_us(lambda: kernel(in_ipc), other_flush, touch),
        "held+turn+flush1x": lambda: hold.held_gpu_us(lambda: kernel(in_ipc), other_flush, flush1x),
        "ipc-flush1x": lambda: problem_loader.queued_gpu_us(lambda: kernel(in_ipc), flush1x),
        "slim-held+turn": lambda: slim.held_gpu_us(lambda: kernel(in_ipc), other_flush),
        "rev-held+write+turn": lambda: hold.held_gpu_us(lambda: kernel(in_arena), lambda: other("rev-write+flush")),
        "rev-held+write+turn+flush": lambda: hold.held_gpu_us(lambda: kernel(in_arena),
                                                              lambda: other("rev-write+flush"), flush),
        "vmm-held+write+turn": lambda: hold.held_gpu_us(lambda: kernel(in_vmm), lambda: other("vmm-write+flush")),
        "vmm-held+write+turn+flush": lambda: hold.held_gpu_us(lambda: kernel(in_vmm),
                                                              lambda: other("vmm-write+flush"), flush),
    }
    timers["held+ce-turn"] = lambda: hold.held_gpu_us(lambda: kernel(in_ipc), lambda: other("ce-flush"))
    timers["held+ce-write+turn"] = lambda: hold.held_gpu_us(lambda: kernel(in_ipc), lambda: other("ce-write+flush"))
    timers["tiny-held+write+turn"] = lambda: tiny.held_gpu_us(lambda: kernel(in_ipc), lambda: other("write+flush"))
    timers["two-phase+write+turn"] = lambda: hold.two_phase_gpu_us(lambda: kernel(in_ipc), lambda: other("write+flush"))
    if in_vmm is None:
        for v in ("vmm-held+write+turn", "vmm-held+write+turn+flush"):
            timers[v] = lambda: float("nan")
    reference_out = kernel(fresh).clone()
    same = all(torch.equal(kernel(d), reference_out) for d in (in_arena, in_ipc, in_vmm) if d is not None)
    for _ in range(3):  # compiled, routed and warm
        for v in variants:
            timers[v]()
    times = {v: [] for v in variants}
    for _ in range(reps):
        for v in variants:
            times[v].append(timers[v]())
    parent.send("exit")
    owner.join(timeout=30)
    return {"same": same, **{v: statistics.median(t) for v, t in times.items()}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problem", default=".")
    parser.add_argument("--cases", help="benchmark case indices, comma-separated (default: all)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--variants", help="placements to time, comma-separated (default: all)")
    parser.add_argument("--out", help="results file to append this run's output to (a fenced block)")
    args = parser.parse_args()
    mods = problem_loader.load(args.problem)

    cases = mods.cases if not args.cases else [mods.cases[int(i)] for i in args.cases.split(",")]
    variants = tuple(args.variants.split(",")) if args.variants else VARIANTS
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    hold, slim, tiny = FlagHold(), FlagHold(slim=True), FlagHold(tiny=True)
    lines = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    say(problem_loader.results_stamp("python tools/judge/placement_probe.py " + " ".join(sys.argv[1:])))
    rows = []
    for case in cases:
        r = probe_case(args.problem, mods, case, args.reps, hold, slim, tiny, variants)
        say(f"{case.spec}: same output {r['same']}; " + ", ".join(f"{v} {r[v]:.2f}" for v in variants))
        rows.append((case.spec, *(r[v] for v in variants)))
    table = io.StringIO()
    with contextlib.redirect_stdout(table):
        problem_loader.print_case_table(variants, rows)
    say("GPU time, median us\n" + table.getvalue().rstrip("\n"))
    if args.out:
        with open(args.out, "a") as f:
            f.write("```\n" + "\n".join(lines) + "\n```\n\n")


if __name__ == "__main__":
    main()
