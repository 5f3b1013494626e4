"""What the tools share (bench_mla, tune_mla, kernel_times, ncu_case, the SASS tools, bench_paged):
a problem directory's modules, imported as eval.py's worker imports them; the judge's L2 flush; one timer,
GPU time with the call queued behind a hold, as eval.py ranks it; the SASS of a kernel compiled for sm_90
(no GPU needed) and its instruction counts; the measured copy rate the tools' memory floors use
(PEAK_BW); and the stamp a results file starts with."""
import collections
import datetime
import importlib.util
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"  # every results file, each written by the tool that measured it
sys.path.insert(0, str(ROOT))
import judge_stats  # noqa: E402

PEAK_BW = judge_stats.COPY_BANDWIDTH_H200  # bytes/s: the tools' memory floor, defined beside the judge's


def load(problem: str = ".") -> SimpleNamespace:
    """reference, utils and submission modules of a problem directory (relative to the repo root), and
    its benchmark cases as eval.py makes them (task.yml's seeds)."""
    path = (ROOT / problem).resolve()
    sys.path[:0] = [str(path), str(ROOT)]
    import judge_cases
    import reference
    import utils

    spec = importlib.util.spec_from_file_location("submission", path / "submission.py")
    submission = importlib.util.module_from_spec(spec)
    sys.modules["submission"] = submission
    spec.loader.exec_module(submission)
    cases = judge_cases.make_cases(judge_cases.load_task(path)["benchmarks"], None)
    return SimpleNamespace(reference=reference, utils=utils, submission=submission, cases=cases)


def hold_gpu(seconds: float) -> None:
    """Queue a spin of about this long on the current stream (cycles from the device's clock), so that
    the host can queue what follows before the GPU reaches it."""
    import torch

    torch.cuda._sleep(int(seconds * torch.cuda.get_device_properties(0).clock_rate * 1e3))


def queued_gpu_us(fn, flush, warm=None) -> float:
    """GPU time of fn() in us after flush(), with the GPU held ~200 us so that the host queues the
    whole call before the GPU reaches it: no host time in it (the flush's after-effects are).
    warm: run between the flush and the timed call (untimed), e.g. to bring code back into L2."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    flush()
    if warm is not None:
        warm()
    hold_gpu(200e-6)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3


_judge_flush = []


def l2_flush():
    """The judge's L2 flush (utils.L2Flush: a read of twice the L2, which leaves its lines clean), made once."""
    if not _judge_flush:
        sys.path.insert(0, str(ROOT))
        import utils

        _judge_flush.append(utils.L2Flush())
    return _judge_flush[0]


# How long the timer runs the call before timing it. eval.py times a case after seconds of the case's own
# work (the submission's calls, the null's, the flushes); the tools warm the GPU the same way, with the
# call, not with other work (a case timed after a warm-up of full-power GEMMs read high: docs/judge.md).
WARM_S = 0.05


def median_gpu_us(fn, reps=20, warmup=3, flush=None) -> float:
    """Median over reps of queued_gpu_us(fn, flush), after at least warmup untimed calls and WARM_S of
    them; flush: the judge's by default."""
    import time

    import torch

    flush = flush or l2_flush()
    calls, until = 0, time.perf_counter() + WARM_S
    while calls < warmup or time.perf_counter() < until:
        fn()
        calls += 1
        if calls % 16 == 0:
            torch.cuda.synchronize()  # the wall time is the GPU's, not the host's queueing
    times = sorted(queued_gpu_us(fn, flush) for _ in range(reps))
    return times[len(times) // 2]


def geomean(values) -> float:
    """The geometric mean; nan where any value is nan (a column a tool could not measure everywhere)."""
    values = list(values)
    return math.exp(sum(map(math.log, values)) / len(values)) if not any(map(math.isnan, values)) else float("nan")


def print_case_table(columns, rows, width=70):
    """rows: (case spec, one number per column); prints them, then each column's geometric mean."""
    print(f"{'case':{width}s} " + " ".join(f"{c:>9s}" for c in columns))
    for spec, *values in rows:
        print(f"{spec[:width]:{width}s} " + " ".join(f"{v:9.1f}" for v in values))
    geomeans = [geomean(r[i] for r in rows) for i in range(1, len(columns) + 1)]
    print(f"{'geomean':{width}s} " + " ".join(f"{v:9.1f}" for v in geomeans))


def results_stamp(command: str) -> str:
    """The line a results file starts with: when, on what GPU, with which torch and Triton, by what command."""
    import torch
    import triton

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{when}, {device}, torch {torch.__version__}, triton {triton.__version__}; `{command}`"


def triton_bin(tool: str) -> str:
    """A binary Triton ships for its NVIDIA backend (ptxas, cuobjdump, nvdisasm)."""
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)


def sass_of(kernel, path=None) -> str:
    """cuobjdump -sass of a compiled kernel (its cubin written to path + '.cubin', or to a temp file)."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = (path or os.path.join(tmp, "k")) + ".cubin"
        with open(cubin, "wb") as f:
            f.write(kernel.asm["cubin"])
        return subprocess.run([triton_bin("cuobjdump"), "-sass", cubin], capture_output=True, text=True,
                              check=True).stdout


def registers_of(cubin_path: str) -> str:
    """The registers a thread of the cubin's kernel uses (cuobjdump -res-usage), or '?'."""
    usage = subprocess.run([triton_bin("cuobjdump"), "-res-usage", cubin_path], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+)", usage)
    return found.group(1) if found else "?"


def mma_loop(sass: str) -> list:
    """The instructions (opcode and operands) of the loop around a kernel's MMAs: from the target of the
    first backward branch after the last HGMMA/QGMMA/HMMA that jumps back before the first one, to that
    branch. What one iteration (one page, one key block) costs a thread."""
    listing = [(int(m.group(1), 16), m.group(2).strip())
               for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    mma = [a for a, text in listing if re.search(r"\b(HGMMA|QGMMA|HMMA)\b", text)]
    if not mma:
        return []
    for a, text in listing:
        back = re.search(r"\bBRA (?:!?U?P\w+, )?0x([0-9a-f]+)", text)
        if back and a > mma[-1] and int(back.group(1), 16) <= mma[0]:
            return [text for b, text in listing if int(back.group(1), 16) <= b <= a]
    return []


def opcode_counts(sass: str):
    """Instructions of a SASS listing by opcode (predicates and modifiers stripped: `@P0 LOP3.LUT` is LOP3)."""
    return collections.Counter(m.group(1).split(".")[0]
                               for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass))
