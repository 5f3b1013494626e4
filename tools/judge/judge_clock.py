"""How the judge's clock and the submission's process agree, per case, from `eval.py --json` files
(runs on any machine, no GPU needed).

    python tools/judge/judge_clock.py RUN.json [RUN.json ...] [--write FILE.md]

For each timed case: the reported mean (the ranked number), the gap between the judge's clock and the
report beyond the protocol's own overhead (what eval.py compares with its band), the overhead of the
submission's calls and of the null submission's (median, and the spread per call), and the calls
released before they returned. A file may hold one run, or several under their names. First, per
problem and mode, each run's score (the geometric mean of its case means), how far the runs lie apart,
and leaderboard against benchmark.
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1] / "lib")]
import judge_stats  # noqa: E402  (the judge's own statistic)
from problem_loader import geomean  # noqa: E402


def runs_in(path: str):
    data = json.loads(Path(path).read_text())
    if "cases" in data:
        yield Path(path).name, data
    else:
        yield from sorted(data.items())


def case_row(case: dict) -> str:
    calls = [judge_stats.TimedCall(*c) for c in case["calls"]]
    nulls = [judge_stats.TimedCall(*n) for n in case["nulls"]]
    mean = sum(c.device_ns for c in calls) / len(calls)
    gap = judge_stats.overhead_gap(calls, nulls)
    over = [c.judge_ns - c.device_ns for c in calls]
    null_over = [n.judge_ns - n.device_ns for n in nulls]
    early = sum(c.early for c in calls)
    return (f"| {case['spec']} | {case['status']} | {mean / 1e3:.2f} | {gap / 1e3:+.1f} | "
            f"{statistics.median(over) / 1e3:.1f} ± {statistics.pstdev(over) / 1e3:.1f} | "
            f"{statistics.median(null_over) / 1e3:.1f} ± {statistics.pstdev(null_over) / 1e3:.1f} | "
            f"{len(calls)} / {len(nulls)} | {early} |")


def score(run: dict) -> float:
    """The run's geometric mean of the case means, in us, as eval.py ranks it."""
    means = [c["stats"]["mean"] / 1e3 for c in run["cases"] if c.get("stats")]
    return geomean(means) if means else float("nan")


def summary(runs: list) -> list[str]:
    """Per problem and mode: each run's score, the spread between them (largest / smallest - 1), and the
    leaderboard's mean score against the benchmark's."""
    scores = {}
    for _name, run in runs:
        where = Path(run["problem"])
        problem = where.name if where.parent.name == "problems" else "repository root (MLA)"
        scores.setdefault(problem, {}).setdefault(run["mode"], []).append(score(run))
    lines = ["| problem | mode | score per run, us | runs apart | against benchmark |", "|---|---|---|---|---|"]
    for problem, modes in scores.items():
        bench = modes.get("benchmark")
        for mode, values in modes.items():
            apart = max(values) / min(values) - 1
            against = (f"{statistics.mean(values) / statistics.mean(bench):.4f}"
                       if bench and mode != "benchmark" else "")
            lines.append(f"| {problem} | {mode} | {' / '.join(f'{v:.2f}' for v in values)} | {apart:.2%} | "
                         f"{against} |")
    return lines + [""]


def report(paths: list[str]) -> str:
    runs = [named for path in paths for named in runs_in(path)]
    lines = summary(runs)
    for name, run in runs:
        band = run.get("band", {})
        lines += [f"## {name}: {run['mode']}, {'pass' if run['ok'] else 'FAIL'}",
                  "", f"{run['date']}; {run['device']}; python {run.get('python')}; band "
                  f"{band.get('abs_ns', 0) / 1e3:g} us + {band.get('rel', 0):.0%}", "",
                  "| case | status | reported mean us | gap us | overhead us (median ± sd) | null overhead us | "
                  "calls / nulls | released early |", "|---|---|---|---|---|---|---|---|"]
        lines += [case_row(c) for c in run["cases"] if c.get("calls")]
        failed = [c for c in run["cases"] if c.get("error")]
        lines += [f"\nfailed: {c['spec']}: {c['error']}" for c in failed] + [""]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--write", metavar="FILE", help="also write the tables to FILE (markdown)")
    args = parser.parse_args()
    text = report(args.files)
    print(text)
    if args.write:
        Path(args.write).write_text(f"# The judge's clock against the submission's\n\nWritten by "
                                    f"`python tools/judge/judge_clock.py {' '.join(Path(f).name for f in args.files)}` "
                                    f"from `eval.py --json` runs.\n\n{text}")


if __name__ == "__main__":
    main()
