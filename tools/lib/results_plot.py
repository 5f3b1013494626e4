"""The picture a bench tool draws beside its results file: per benchmark shape, the submission's GPU time
and the peer's where it was timed, on a log scale, each bar topped by its share of its own format's
memory floor (the bytes that format must move, at 4.2 TB/s), and the problem's floor (its fewest bytes,
reference.min_bytes, at 4.2 TB/s: no correct call is faster) as a dashed line. Needs matplotlib (a
tools-only dependency: the kit itself never imports it); without it the tools write their tables and say
that the picture was skipped.

    draw(path, title, shapes, {"submission.py": (ms, floor_ms), "FlashMLA": (ms, floor_ms)}, problem_floor_ms, stamp)
"""
import math


def draw(path: str, title: str, shapes: list[str], series: dict[str, tuple[list[float], list[float]]],
         problem_floor: list[float], stamp: str) -> str:
    """Writes the picture to path (any format matplotlib writes: .png, .svg); returns what happened, as a
    line for the tool's output. series: name -> (time per shape, that format's floor per shape), in ms; a
    missing time (None or nan) leaves a gap."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"picture skipped: matplotlib does not import (pip install matplotlib), {path} not written"
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(shapes) + 2), 4.2), dpi=110)
    for k, (name, (values, floors)) in enumerate(series.items()):
        xs = [i - 0.4 + width * (k + 0.5) for i in range(len(shapes))]
        ys = [v if v is not None and not math.isnan(v) else 0.0 for v in values]
        bars = ax.bar(xs, ys, width, label=name)
        for bar, y, floor in zip(bars, ys, floors):
            if y > 0 and floor > 0:
                ax.annotate(f"{floor / y:.2f}", (bar.get_x() + bar.get_width() / 2, y), ha="center",
                            va="bottom", fontsize=7, xytext=(0, 1), textcoords="offset points")
    ax.hlines(problem_floor, [i - 0.45 for i in range(len(shapes))], [i + 0.45 for i in range(len(shapes))],
              colors="black", linestyles="dashed", label="problem's floor (fewest bytes at 4.2 TB/s)")
    ax.set_yscale("log")
    ax.set_xticks(range(len(shapes)), shapes, fontsize=8)
    ax.set_ylabel("GPU time per call, ms (log)")
    ax.set_title(f"{title}\nover each bar: its format's floor / its time", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.text(0.01, 0.01, stamp, fontsize=6, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return f"picture: {path}"
