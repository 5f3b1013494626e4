"""Does how eval.py hands a call its inputs change the call's GPU time? (GPU)

eval.py ranks a call a few us slower than tools/problem_loader.median_gpu_us times the same call in one
process (docs/judge.md, "The ranked time against a one-process timer"). Per benchmark case, this times
the same custom_kernel call, interleaved call by call, with the inputs placed five ways:

- fresh: generate_input's own tensors, the one-process timer (flush, a 200 us one-thread spin, call);
- arena: copies of them in one raw driver allocation at eval.py's InputLayout offsets, same timer;
- ipc: that arena allocated and written by a second process and mapped here by IPC handle, as eval.py's
  worker maps the judge's;
- ipc+turn: as ipc, with the L2 flush run by the second process in its own context (so the GPU switches
  contexts before the call, as it does between eval.py's judge and worker);
- hold: fresh inputs, but the call queued behind eval.py's hold (a kernel filling every SM, released
  by a host write) instead of the one-thread spin.

    python tools/placement_probe.py [--problem problems/paged_mqa_logits] [--cases 0,3,6] [--reps 20]
"""
import argparse
import ctypes
import mmap
import multiprocessing as mp
import os
import statistics
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import problem_loader  # noqa: E402

VARIANTS = ("fresh", "arena", "ipc", "ipc+turn", "hold")


def arena_copy(harness, data):
    """data copied into one raw driver allocation at eval.py's InputLayout offsets: (pointer, bytes,
    layout, the arena as a uint8 tensor)."""
    import torch

    layout = harness.InputLayout(data)
    nbytes = layout.nbytes + 4096
    ptr = harness.CudaDriver().alloc(nbytes)
    arena = torch.as_tensor(harness._CudaArray(ptr, nbytes))
    layout.write(layout.views(arena))
    torch.cuda.synchronize()
    return ptr, nbytes, layout, arena


def _arena_owner(problem: str, args: dict, conn) -> None:
    """The second process: the case's input in an arena of its own, shared by IPC handle; then flushes
    L2 in its context whenever asked."""
    import torch

    mods = problem_loader.load(problem)
    import eval as harness

    ptr, nbytes, layout, _arena = arena_copy(harness, mods.reference.generate_input(**args))
    flush = problem_loader.l2_flush()
    conn.send((harness.CudaDriver().ipc_handle(ptr), nbytes, layout.structure, layout.specs))
    while conn.recv() == "flush":
        flush()
        torch.cuda.synchronize()
        conn.send("ok")


class FlagHold:
    """eval.py's hold: a kernel over every SM's thread slots that spins until a host word reaches a value."""

    def __init__(self, harness):
        import torch

        self.driver = harness.CudaDriver()
        self.page = mmap.mmap(-1, 4096)  # page-aligned, as cuMemHostRegister wants
        self.dev = self.driver.host_register(ctypes.addressof(ctypes.c_char.from_buffer(self.page)), 4096)
        self.fn = self.driver.function(harness._HOLD_PTX, "eval_hold")
        self.shape = harness.hold_grid(torch)
        self.seq = 0

    def gpu_us(self, fn, flush) -> float:
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        flush()
        self.seq += 1
        stream = torch.cuda.current_stream().cuda_stream
        self.driver.launch(self.fn, *self.shape, stream, [ctypes.c_uint64(self.dev), ctypes.c_uint32(self.seq),
                                                          ctypes.c_uint64(10_000_000_000)])
        start.record()
        fn()
        end.record()
        struct.pack_into("<i", self.page, 0, self.seq)
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3


def probe_case(problem: str, mods, harness, case, reps: int, hold: FlagHold) -> dict:
    import torch

    kernel = mods.submission.custom_kernel
    fresh = mods.reference.generate_input(**case.args)
    _, _, layout, own = arena_copy(harness, fresh)
    in_arena = harness.build_input(layout.structure, layout.views(own))
    driver = harness.CudaDriver()

    parent, child = mp.get_context("spawn").Pipe()
    owner = mp.get_context("spawn").Process(target=_arena_owner, args=(problem, case.args, child), daemon=True)
    owner.start()
    handle, nbytes, structure, specs = parent.recv()
    mapped = torch.as_tensor(harness._CudaArray(driver.ipc_open(handle), nbytes))
    in_ipc = harness.build_input(structure, [harness.arena_view(mapped, s) for s in specs])

    def other_flush():
        parent.send("flush")
        parent.recv()

    flush = problem_loader.l2_flush()
    timers = {
        "fresh": lambda: problem_loader.queued_gpu_us(lambda: kernel(fresh), flush),
        "arena": lambda: problem_loader.queued_gpu_us(lambda: kernel(in_arena), flush),
        "ipc": lambda: problem_loader.queued_gpu_us(lambda: kernel(in_ipc), flush),
        "ipc+turn": lambda: problem_loader.queued_gpu_us(lambda: kernel(in_ipc), other_flush),
        "hold": lambda: hold.gpu_us(lambda: kernel(fresh), flush),
    }
    reference_out = kernel(fresh).clone()
    same = all(torch.equal(kernel(d), reference_out) for d in (in_arena, in_ipc))
    for _ in range(3):  # compiled, routed and warm
        for timer in timers.values():
            timer()
    times = {v: [] for v in VARIANTS}
    for _ in range(reps):
        for v in VARIANTS:
            times[v].append(timers[v]())
    parent.send("exit")
    owner.join(timeout=30)
    return {"same": same, **{v: statistics.median(t) for v, t in times.items()}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problem", default=".")
    parser.add_argument("--cases", help="benchmark case indices, comma-separated (default: all)")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    mods = problem_loader.load(args.problem)
    import eval as harness

    cases = mods.cases if not args.cases else [mods.cases[int(i)] for i in args.cases.split(",")]
    hold = FlagHold(harness)
    print(problem_loader.results_stamp("python tools/placement_probe.py " + " ".join(sys.argv[1:])))
    rows = []
    for case in cases:
        r = probe_case(args.problem, mods, harness, case, args.reps, hold)
        print(f"{case.spec}: same output {r['same']}; " + ", ".join(f"{v} {r[v]:.2f}" for v in VARIANTS), flush=True)
        rows.append((case.spec, *(r[v] for v in VARIANTS)))
    print("GPU time, median us")
    problem_loader.print_case_table(VARIANTS, rows)


if __name__ == "__main__":
    main()
