"""Timing statistics, computed by the judge from the times the worker reports and its own clock: the band a
report must fall in, the null submission's overhead, which calls are ranked, the per-case statistics, and
compare mode's ratios."""
import dataclasses
import math

# The judge's clock against the worker's. The judge's own overhead is measured on the same protocol with a
# null submission that takes as long as the measured calls (a spin on the GPU, a busy wait on the CPU):
# NULL_CALIBRATION calls before a case's timed calls, then one after every NULL_EVERY of them. Per call,
# the judge's clock less the null's overhead (trimmed mean: the slowest TRIM of its calls left out) is
# what the judge saw of the call; a report may lie under it by at most a band, band(t) = abs_ns + rel * t
# for a call reported at t (Band).
#
# The band is what the judge can tell apart, measured on the H200 with tools/judge/judge_resolution.py (the
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
# compare mode keeps three workers' contexts on the GPU, and its honest gaps to the null are larger: on the
# H200 the shipped MLA submission's gap read +20.0 to +21.0 us per case in compare against +5 to +8 us in
# leaderboard mode on the same machine. It checks reports against these bands (it ranks nothing).
COMPARE_BANDS = {"cuda": Band(40e3, 0.15), "cpu": Band(4e6, 0.15)}

# Peak device-memory bandwidth (datasheet, bytes/s) by device name; the memory floor of a case is the
# bytes its reference says one call must move (reference.min_bytes) over this. The largest figure of
# each name family, so that no correct call can be under its floor.
PEAK_BANDWIDTH = (("GH200", 4.9e12), ("H200", 4.8e12), ("H100", 3.9e12), ("H800", 3.35e12),
                  ("B200", 8.0e12), ("B100", 8.0e12), ("A100", 2.04e12))
# What results files and the README measure a time against (bytes / this): the H200's measured device copy
# rate (read + write), what a kernel can reach. The judge's floor above is a bound no correct call can pass
# on any GPU of a family, so it uses the datasheet; a kernel's distance to the floor is told against this.
COPY_BANDWIDTH_H200 = 4.2e12


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
    # and, off the clock, how long the judge's copy of the output took. For tools/judge/judge_resolution.py;
    # nothing ranks it.
    parts: tuple = ()


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


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
    return (f"the times reported from the submission's process (mean {fmt_ns(claimed)}) are below what the "
            f"judge's clock allows: its calls took {fmt_ns(claimed + gap)} each by the judge's clock{over}, with "
            f"the judge's own overhead (measured on the same protocol with a null submission) taken out; the band "
            f"is {fmt_ns(allowed)} ({fmt_ns(band.abs_ns)} + {band.rel:.0%} of the report)")


def fmt_ns(ns: float) -> str:
    return f"{ns / 1e6:.4f} ms" if ns >= 1e5 else f"{ns / 1e3:.2f} us"


def case_ranking(calls: list, nulls: list, cuda: bool, floor_ns: float | None) -> tuple[list, list, list]:
    """A case's ranking: the calls it ranks (ranked_calls), how each is ranked (rank_calls), and the indices of
    those its statistics use (fastest)."""
    kept = ranked_calls(calls)
    how = rank_calls(kept, nulls, cuda, floor_ns=floor_ns or 0.0)
    return kept, how, fastest([t for t, _ in how])


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
