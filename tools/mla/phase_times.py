"""Where a short MLA call's GPU time goes: the Gluon kernel's phases, timed with %globaltimer stamps (GPU;
--offline compiles the stamped kernel for sm_90 on the CPU and counts its stamps).

The tool makes a stamped copy of submission.py: at each `# phase: NAME [if CONDITION]` comment in the Gluon
kernel (_mla_fp8_wgmma_kernel) and its helpers, the program reads %globaltimer and stores it to
stamps[program, phase]. submission.py itself is unchanged (its PTX: tools/mla/ptx_diff.py). The phases,
in the order a program passes them:

    start       the program runs (its first instruction after reading its ids)
    bounds      the split's cache rows known: kv_indptr and the cache scale loaded (a round trip)
    tma_issued  the first STAGES tiles requested
    q_ready     q loaded (prefetched to L2 at start), split into fp8 hi/lo and stored to shared memory
    first_tile  the first tile has arrived (its mbarrier wait is over)
    tiles_done  every tile's scores, softmax and P.V done
    stored      the output (or the split's partial and its lse) stored
    merge_wait  (split plans) every split of the query row has stored its partial
    end         the row's columns merged and stored (split plans); the program ends

Per benchmark shape (task.yml's, --shapes to choose), each call runs through the copy's Triton launch
(_launch: the plan's grid, constexprs and cooperative launch as custom_kernel's route), after the judge's
L2 flush and queued behind a hold (problem_loader.queued_gpu_us, whose GPU time is printed beside). Per
phase: the median over calls of the median and of the latest program's time since the call's first
program started, in us. Writes results/mla_phases_h200.md with --write.

    python tools/mla/phase_times.py [--shapes 4x1024,4x8192,32x1024,64x1024] [--reps 20] [--write]
    python tools/mla/phase_times.py --offline      # CPU: the stamped kernel compiles for sm_90
"""
import argparse
import atexit
import importlib.util
import os
import re
import shutil
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [ROOT, HERE, os.path.join(os.path.dirname(HERE), "lib")]
import problem_loader  # noqa: E402
import sass_offline  # noqa: E402

PHASES = ("start", "bounds", "tma_issued", "q_ready", "first_tile", "tiles_done", "stored", "merge_wait", "end")
KERNEL = "_mla_fp8_wgmma_kernel"
HELPERS = ("_gluon_tile", "_combine_in_kernel")  # stamped helpers: they take the program's stamp row first
MARKER = re.compile(r"^(?P<indent>\s*)# phase: (?P<name>\w+)(?: if (?P<condition>.+))?$")
RESULTS = os.path.join(ROOT, "results", "mla_phases_h200.md")

STAMP_HELPER = '''

if gluon is not None:
    @gluon.jit
    def _phase_stamp(at, k: gl.constexpr):
        """%globaltimer (ns) into at[k]: every thread reads it, one value lands."""
        now = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,l", [at], dtype=gl.int64,
                                        is_pure=False, pack=1)
        gl.store(at + k, now)
'''


def stamped_source(source: str) -> str:
    """submission.py's text with its phase comments turned into stamps: the kernel takes `stamp_ptr`
    after its runtime arguments, each program's row (stamp_at) is made at `start`, and the helpers get
    it as their first argument."""
    lines = []
    for line in source.splitlines():
        found = MARKER.match(line)
        if not found:
            lines.append(line)
            continue
        name, indent, condition = found["name"], found["indent"], found["condition"]
        if name not in PHASES:
            raise ValueError(f"submission.py: unknown phase {name!r} (tools/mla/phase_times.py PHASES)")
        if name == "start":
            lines.append(f"{indent}stamp_at = stamp_ptr + (pid_q * num_splits + pid_s) * {len(PHASES)}")
        stamp = f"_phase_stamp(stamp_at, {PHASES.index(name)})"
        lines += [f"{indent}if {condition}:", f"{indent}    {stamp}"] if condition else [indent + stamp]
    text = "\n".join(lines)
    signature = "qk_scale, q_seq_len, num_splits,"
    head = text.index(f"def {KERNEL}(")
    at = text.index(signature, head) + len(signature)
    text = text[:at] + " stamp_ptr," + text[at:]
    for helper in HELPERS:  # its definition and its calls (code lines, not comments)
        text = re.sub(rf"^(?!\s*#)(.*\b){helper}\(", rf"\g<1>{helper}(stamp_at, ", text, flags=re.M)
    missing = [p for p in PHASES if f"_phase_stamp(stamp_at, {PHASES.index(p)})" not in text]
    if missing:
        raise ValueError(f"submission.py has no `# phase:` comment for {missing}")
    return text + STAMP_HELPER


def load_stamped():
    """The stamped copy as a module (from a file: Triton reads a kernel's source from it)."""
    with open(os.path.join(ROOT, "submission.py")) as f:
        text = stamped_source(f.read())
    folder = tempfile.mkdtemp(prefix="mla_phases_")
    atexit.register(shutil.rmtree, folder, True)
    path = os.path.join(folder, "submission_phases.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location("submission_phases", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["submission_phases"] = module
    spec.loader.exec_module(module)
    return module


class StampedLaunch:
    """Stands in for the copy's kernel in its _launch_jit: the same launch, with the stamp buffer."""

    def __init__(self, kernel, stamps):
        self.kernel, self.stamps = kernel, stamps

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.kernel[grid](*args, stamp_ptr=self.stamps, **kwargs)


def call_phases(stamps, programs: int):
    """One call's stamps (programs x phases, ns) -> per phase (median, latest) us since the first start;
    None for a phase no program passed."""
    rows = stamps[:programs].tolist()
    t0 = min(row[0] for row in rows)
    out = []
    for k in range(len(PHASES)):
        seen = [(row[k] - t0) / 1e3 for row in rows if row[k]]
        out.append((statistics.median(seen), max(seen)) if seen else None)
    return out


def measure(module, shipped, data, reps: int):
    """(the plan; per phase (median, latest) us, median over calls; the stamped calls' median GPU time and
    the shipped kernel's, launched the same way, interleaved, us)."""
    import torch

    q, kv_data, qo_indptr, kv_indptr, config = data
    plan = module.plan_for(len(kv_indptr) - 1, config["kv_seq_len"], config["q_seq_len"])
    if plan.kernel != module.KERNEL_GLUON:
        raise ValueError(f"plan {tuple(plan)} does not run the Gluon kernel")
    programs = q.shape[0] * module._fit_to_device(plan, q.shape[0], q.device).splits  # the grid as launched
    stamps = torch.zeros(programs, len(PHASES), dtype=torch.int64, device=q.device)
    if not isinstance(module.__dict__[KERNEL], StampedLaunch):
        module.__dict__[KERNEL] = StampedLaunch(module.__dict__[KERNEL], stamps)
    module.__dict__[KERNEL].stamps = stamps

    def call():
        return module._launch(q, kv_data, kv_indptr, config, plan)

    def unstamped():
        return shipped._launch(q, kv_data, kv_indptr, config, plan)

    flush = problem_loader.l2_flush()
    problem_loader.median_gpu_us(call, reps=1, flush=flush)  # compiled and warm
    problem_loader.median_gpu_us(unstamped, reps=1, flush=flush)
    calls, gpu, gpu_shipped = [], [], []
    for _ in range(reps):
        gpu.append(problem_loader.queued_gpu_us(call, flush, warm=stamps.zero_))  # the reset off the clock
        calls.append(call_phases(stamps, programs))
        gpu_shipped.append(problem_loader.queued_gpu_us(unstamped, flush))
    table = []
    for k in range(len(PHASES)):
        seen = [c[k] for c in calls if c[k] is not None]
        table.append((statistics.median(s[0] for s in seen), statistics.median(s[1] for s in seen)) if seen else None)
    return plan, table, statistics.median(gpu), statistics.median(gpu_shipped)


def offline() -> None:
    """The stamped kernel compiled for sm_90 without a GPU: its %globaltimer reads, registers, spills."""
    module = load_stamped()
    for split in (True, False):
        kernel = compile_stamped(module, split)
        with tempfile.TemporaryDirectory() as tmp:
            sass = problem_loader.sass_of(kernel, os.path.join(tmp, "k"))  # and its cubin, k.cubin
            registers = problem_loader.registers_of(os.path.join(tmp, "k.cubin"))
        print(f"SPLIT={split}: %globaltimer reads in the PTX {kernel.asm['ptx'].count('%globaltimer')}, "
              f"registers {registers}, local loads/stores {sass.count('LDL')}/{sass.count('STL')}")


def compile_stamped(module, split: bool):
    """The stamped kernel compiled for sm_90 (tools/mla/sass_offline.py's compile, with the stamp buffer)."""
    return sass_offline.compile_gluon(split, 4, module=module, extra=(("stamp_ptr", "*i64"),))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4x1024,4x8192,32x1024,64x1024", help="batch x kv, comma-separated")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--write", action="store_true", help=f"write {os.path.relpath(RESULTS, ROOT)}")
    ap.add_argument("--offline", action="store_true", help="compile the stamped kernel for sm_90 (CPU)")
    args = ap.parse_args()
    if args.offline:
        return offline()
    import reference as R
    import submission as shipped

    module = load_stamped()
    stamp = problem_loader.results_stamp("python tools/mla/phase_times.py " + " ".join(sys.argv[1:]))
    head = ("| shape | plan | GPU time | unstamped | " + " | ".join(PHASES) + " |\n|---|---|---|---|"
            + "---|" * len(PHASES))
    lines = [f"# MLA phases of the Gluon kernel\n\n{stamp}. Per phase (tools/mla/phase_times.py's docstring): "
             "us since the call's first program started, median over programs / latest program, each the "
             f"median of {args.reps} calls; GPU time: the stamped call's, as the bench tools time it; unstamped: "
             "the shipped kernel's, launched the same way, interleaved (what the stamps cost).\n", head]
    print(head)
    for shape in args.shapes.split(","):
        batch, kv = (int(x) for x in shape.lower().split("x"))
        data = R.generate_input(batch, 1, kv, 1234)
        plan, table, gpu, gpu_shipped = measure(module, shipped, data, args.reps)
        cells = [f"{t[0]:.1f} / {t[1]:.1f}" if t is not None else "-" for t in table]
        row = f"| {batch} x {kv} | {tuple(plan)} | {gpu:.1f} | {gpu_shipped:.1f} | " + " | ".join(cells) + " |"
        lines.append(row)
        print(row, flush=True)
    if args.write:
        with open(RESULTS, "w") as f:
            f.write("\n".join(lines) + "\n")
        print("wrote", RESULTS)


if __name__ == "__main__":
    main()
