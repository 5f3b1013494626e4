"""How finely the judge's clock tells one worker process from another (GPU).

Per benchmark case of a problem, on eval.py's own protocol (its Judge, its timed calls, its null calls
on a quiet GPU): the submission's worker and two null workers (A, the judge's own, and B, a second
process running the same null) are timed in turn, NULL_EVERY calls of the submission, then one of A and
one of B (in turn, each first as often), as eval.py places its null calls. Per worker, the overhead of a call is the judge's clock less
the time the worker reports; per case and round, the gap of the submission's overhead to A's (what
eval.py's timing check measures) and of B's to A's (two processes running the same code: what the judge
cannot tell apart), each as eval.py's trimmed mean. Every round starts fresh worker processes. Where the
judge's clock went (TimedCall.parts) is averaged per worker: the judge's work up to the release, the
release to the one-block hold letting go, the call's end to the judge's host seeing the signal that its
output is staged (the clock's end), and, off the clock, the judge's copy of the output.

    python tools/judge/judge_resolution.py [--problem DIR] [--rounds 3] [--iterations 24] [--json RAW.json]
                                     [--write FILE.md]
"""
import argparse
import dataclasses
import json
import os
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TITLE = "# How finely the judge's clock tells processes apart (tools/judge/judge_resolution.py)"
sys.path.insert(0, str(ROOT))
import judge_cases  # noqa: E402  (the judge itself: its protocol is what is measured)
import judge_modes
import judge_process
import judge_report
import judge_stats
import judge_timing


def overheads(calls) -> list[float]:
    return [c.judge_ns - c.device_ns for c in calls]


def parts_us(calls) -> str:
    """Mean us of: start to release, release to let-go, call end to the staged signal seen, the judge's copy."""
    rows = [(c.parts, c.device_ns) for c in calls if len(c.parts) == 4 and all(math.isfinite(x) for x in c.parts)]
    if not rows:
        return "-"
    released = statistics.mean(p[0] for p, _ in rows)
    let_go = statistics.mean(p[1] - p[0] for p, _ in rows)
    to_staged = statistics.mean(p[2] - p[1] - d for p, d in rows)
    copy = statistics.mean(p[3] for p, _ in rows)
    return " / ".join(f"{x / 1e3:.1f}" for x in (released, let_go, to_staged, copy))


def time_case(judge, null_b, case, iterations: int, deadline: float) -> dict:
    prep = judge.prepare(judge.reference.generate_input(**case.args), form_too=True)
    good, message = judge.call_once(prep, deadline)
    if not good:
        raise SystemExit(f"{case.spec}: the submission fails its check: {message}")
    warm = [judge.timed(judge.worker, prep, deadline)[0].device_ns for _ in range(judge_modes.WARMUP_CALLS)]
    mimic = statistics.median(warm)
    judge.null_call(prep, deadline, mimic)  # warm-ups, as eval.py's: a process's first call loads its kernels
    judge.null, null_b = null_b, judge.null
    try:
        judge.null_call(prep, deadline, mimic)
    finally:
        judge.null, null_b = null_b, judge.null
    runs = {"submission": [], "A": [], "B": []}
    for _ in range(iterations):
        for _ in range(judge_stats.NULL_EVERY):
            runs["submission"].append(judge.timed(judge.worker, prep, deadline)[0])
        for name in ("A", "B") if len(runs["A"]) % 2 == 0 else ("B", "A"):  # each first as often
            if name == "A":
                runs["A"].append(judge.null_call(prep, deadline, mimic))
                continue
            judge.null, null_b = null_b, judge.null  # B in the judge's null seat for one call
            try:
                runs["B"].append(judge.null_call(prep, deadline, mimic))
            finally:
                judge.null, null_b = null_b, judge.null
    return runs


def gaps(runs: dict) -> dict:
    """One round of one case: the reported mean, the submission's and B's gap to A (eval.py's trimmed mean),
    the submission's per-call spread of its overhead (its slowest TRIM left out), all in ns."""
    over = {k: overheads(v) for k, v in runs.items()}
    a = judge_stats.trimmed_mean(over["A"])
    kept = sorted(over["submission"])[:len(over["submission"]) - int(judge_stats.TRIM * len(over["submission"]))]
    return {"mean": statistics.mean(c.device_ns for c in runs["submission"]),
            "submission": judge_stats.trimmed_mean([o - a for o in over["submission"]]),
            "B": judge_stats.trimmed_mean(over["B"]) - a, "spread": statistics.pstdev(kept)}


def summary_row(spec: str, rounds: list) -> str:
    """Per case over its rounds: what eval.py's band allows at the case's time, and what a report could take
    off unseen: the band less the smallest honest gap measured (a report's gap is the honest gap plus what
    it takes off)."""
    g = [gaps(r) for r in rounds]
    mean = statistics.mean(x["mean"] for x in g)
    band = judge_stats.BANDS["cuda"].at(mean)
    sub = [x["submission"] for x in g]
    sub_gaps = " / ".join(f"{x / 1e3:+.1f}" for x in sub)
    null_gaps = " / ".join(f"{x['B'] / 1e3:+.1f}" for x in g)
    spread = max(x["spread"] for x in g)
    return (f"| {spec} | {mean / 1e3:.2f} | {sub_gaps} | {null_gaps} | {spread / 1e3:.1f} | {band / 1e3:.1f} | "
            f"{(band - min(sub)) / 1e3:.1f} |")


def parts_row(spec: str, rounds: list) -> str:
    return (f"| {spec} | {parts_us([c for r in rounds for c in r['submission']])} | "
            f"{parts_us([c for r in rounds for c in r['A']])} | {parts_us([c for r in rounds for c in r['B']])} |")


def tables(head: str, results: dict) -> str:
    band = judge_stats.BANDS["cuda"]
    return "\n".join([
        head, "",
        f"Per case, each round on fresh processes: the gap of the submission's overhead to null A's and of null "
        f"B's to A's (trimmed means, us); the largest per-call spread of the submission's overhead; eval.py's band "
        f"at the case's time ({band.abs_ns / 1e3:g} us + {band.rel:.0%}); and what a report could take off unseen "
        f"(the band less the smallest honest gap).", "",
        "| case | reported mean us | submission - A | B - A | spread us | band us | a report could take off us |",
        "|---|---|---|---|---|---|---|",
        *(summary_row(spec, rounds) for spec, rounds in results.items()), "",
        "Where the judge's clock goes, mean us per call: the judge's work up to the release / the release to the "
        "one-block hold letting go (the worker's word) / the call's end to the judge's host seeing its signal that "
        "the output is staged (the clock's end) / the judge's copy of the output, off the clock.", "",
        "| case | submission | null A | null B |", "|---|---|---|---|",
        *(parts_row(spec, rounds) for spec, rounds in results.items()), ""])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problem", default=str(ROOT))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=24)
    parser.add_argument("--json", help="every timed call, per case, round and worker")
    parser.add_argument("--write", help="append the tables, as markdown, to this file")
    args = parser.parse_args()
    problem = Path(args.problem).resolve()
    sys.path[:0] = [str(problem), str(ROOT)]
    cases = judge_cases.make_cases(judge_cases.load_task(problem)["benchmarks"], None)
    report = judge_report.Report(None)
    judge = judge_timing.Judge(problem, problem / "submission.py", report, timed=True)
    null_b = judge_process.WorkerProcess(judge_process.Sandbox(problem, None), "null", report)
    null_b.spawn()
    null_b.attach(judge.cuda, judge.driver)
    if not judge.cuda:
        raise SystemExit("judge_resolution.py measures the GPU protocol: no CUDA device here")
    deadline = time.monotonic() + 3600
    results = {}
    try:
        for rnd in range(args.rounds):
            for w in (judge.worker, judge.null, null_b):
                judge.ensure_started(w, 600)
            for case in cases:
                runs = time_case(judge, null_b, case, args.iterations, deadline)
                results.setdefault(case.spec, []).append(runs)
                g = gaps(runs)
                print(f"{case.spec}: round {rnd}: submission - A {g['submission'] / 1e3:+.2f} us, "
                      f"B - A {g['B'] / 1e3:+.2f} us", flush=True)
            judge.stop_workers()  # fresh processes (and CUDA contexts) for the next round
            null_b.stop()
    finally:
        judge.close()
        null_b.stop()
        judge.remove_sandboxes()
    p = judge.torch.cuda.get_device_properties(0)
    name = "MLA (repository root)" if problem == ROOT else problem.name
    head = (f"## {name}\n\n{time.strftime('%Y-%m-%d')}; {p.name}; torch {judge.torch.__version__}, triton "
            f"{judge_report.triton_version()}; `python tools/judge/judge_resolution.py --problem "
            f"{os.path.relpath(problem, ROOT)} --rounds {args.rounds} --iterations {args.iterations}`")
    text = tables(head, results)
    print(text)
    if args.write:
        new = not Path(args.write).exists()
        with open(args.write, "a") as f:
            f.write((f"{TITLE}\n\n" if new else "") + text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({spec: [{k: [dataclasses.astuple(c) for c in v] for k, v in r.items()}
                                                      for r in rounds] for spec, rounds in results.items()}))


if __name__ == "__main__":
    main()
