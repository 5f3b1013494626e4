"""The modes: test, benchmark and leaderboard (a case's timing loop, its null calibration, the retime and
ranking), profile, and compare; each returns an Outcome the CLI (eval.py) reports."""
import base64
import dataclasses
import gc
import math
import secrets
import time

from judge_cases import TestCase
from judge_process import CaseFailure, CaseSkipped, HOLD_SWAP_WAIT_S, WorkerProcess, failure_text
from judge_report import Report, first_line, indented
from judge_stats import (
    BANDS, CALL_BANDS, COMPARE_BANDS, COMPARE_PROCESS_SPREAD, NULL_CALIBRATION, NULL_EVERY, RETIMES,
    SLOWEST_SHARE, _bounds, fmt_ns, _interval, _log_ratio, _median, calculate_stats, case_ranking,
    check_timings, kept_calls, mean_timing, overhead_gap, ranked_times, timing_gap, verify_times,
    without_slowest)
from judge_timing import Judge, Prepared, RETURN_WAIT_S

# Stopping rule (GPU MODE's, with a floor of MIN_RUNS so that the judge's clock has enough calls to
# check): stop when the standard error of the mean is under 0.1 % of the mean, when the summed time
# passes max_time, or after WALL_LIMIT_NS of wall-clock time.
BENCH_MAX_REPEATS, BENCH_MAX_TIME_NS = 1000, 50e9
RANKED_MAX_REPEATS, RANKED_MAX_TIME_NS = 100, 30e9
# Without CUDA, benchmark and compare stop after this many calls: CPU times are for trying a path, not
# for ranking, and their run-to-run spread dwarfs the error of a mean over this many.
CPU_MAX_REPEATS = 200
WALL_LIMIT_NS = 120e9
# The mode's time limit in task.yml is the whole run's; the judge keeps this much of it to end the run
# and write its report, and a case's timing loop stops after LOOP_SHARE of the case's share of the
# time left (its first call, compilation included, and the checks take the rest).
RUN_RESERVE_S, RUN_RESERVE_FRACTION = 10.0, 0.1
LOOP_SHARE = 0.5
MIN_RUNS = 10
WARMUP_CALLS = 3


class RunClock:
    """The time limits of a run. On a GPU, task.yml's limit for the mode is the whole eval.py process's,
    as kernelbot applies it (it kills the process then, and the results with it): the judge keeps a
    reserve to finish its report, a case that cannot start in time fails as not run, and a case's timing
    loop gets its share of the time left. Without CUDA (never a kernelbot run, and 10-100x slower) the
    same limit applies to each case instead."""

    def __init__(self, limit_s: float, key: str, per_case: bool, started: float | None = None):
        """started: when the process started (time.monotonic()); the judge's own start-up counts too."""
        self.limit_s, self.key, self.per_case = limit_s, key, per_case
        start = time.monotonic() if started is None else started
        self.deadline = start + limit_s - min(RUN_RESERVE_S, RUN_RESERVE_FRACTION * limit_s)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def start_case(self, cases_left: int) -> float:
        """Sets the case's deadline; returns its share of the time (seconds), cases_left counting it."""
        if self.per_case:
            self.deadline = time.monotonic() + self.limit_s
            return self.limit_s
        if self.left() <= 0:
            raise CaseFailure(f"not run: the run's time limit ({self.limit_s:g} s, task.yml `{self.key}`) was "
                              f"reached")
        return self.left() / max(cases_left, 1)

    def credit(self, seconds: float) -> None:
        """Without CUDA, the case's limit bounds the submission, not the judge: the judge's own work in a
        case (a ranked call's fresh input and its check) extends it. On a GPU the run's limit is absolute."""
        if self.per_case:
            self.deadline += seconds

    def start(self) -> float:
        """Time for the worker's start-up, before the first case."""
        return self.limit_s if self.per_case else self.left()


@dataclasses.dataclass
class Outcome:
    ok: bool
    summary: list  # human lines printed after every worker process is gone


def run_tests(report: Report, judge: Judge, cases: list[TestCase], clock: "RunClock") -> Outcome:
    report.log("test-count", len(cases))
    passed = skipped = 0
    for i, case in enumerate(cases):
        report.log(f"test.{i}.spec", case.spec)
        start = time.perf_counter()
        try:
            clock.start_case(len(cases) - i)
            judge.check_fits(case)
            judge.ensure_started(judge.worker, clock.left())
            good, message = judge.call_once(judge.prepare(judge.reference.generate_input(**case.args), form_too=True),
                                            clock.deadline)
        except CaseSkipped as e:
            skipped += 1
            report.skipped(f"test.{i}", case, str(e), f"[SKIP] test {i}: {case.spec}\n       {e}")
            continue
        except Exception as e:
            good, message = False, failure_text(e)
            judge.worker.stop()
        finally:
            judge.release_memory()  # the case's input is gone before the next one is weighed and made
        took = time.perf_counter() - start
        report.log(f"test.{i}.status", "pass" if good else "fail")
        report.log(f"test.{i}.{'message' if good else 'error'}", first_line(message))
        passed += good
        report.record(spec=case.spec, status="pass" if good else "fail", message=message)
        report.say(f"[{'PASS' if good else 'FAIL'}] test {i}: {case.spec}  ({took:.1f} s)")
        report.say(indented(first_line(message) if good else message, 7))
    summary = f"\n{passed}/{len(cases) - skipped} tests passed" + (f", {skipped} skipped (memory)" if skipped else "")
    if skipped == len(cases):
        return Outcome(False, [summary, "no case could run on this machine"])
    if skipped:  # memory a submission left behind (in /dev/shm, from an earlier run) must not pass a case
        return Outcome(False, [summary, "not every case could run on this machine, so the run does not pass"])
    return Outcome(passed == len(cases), [summary])


def refuse_unfit_cases(report: Report, mode: str, cases: list, unfit: list) -> Outcome:
    """test and leaderboard modes, whose check and score cover every case, on a machine that cannot run some of
    them: said before any case runs (each weighed from its sizes), with what to do instead."""
    key = "test" if mode == "test" else "benchmark"
    report.log(f"{key}-count", len(cases))
    reasons = dict(unfit)
    for i, case in enumerate(cases):  # every case gets its lines (a reader stops at the first without them)
        report.log(f"{key}.{i}.spec", case.spec)
        why = reasons.get(i, f"not run: {'case' if len(unfit) == 1 else 'cases'} "
                             f"{', '.join(str(j) for j, _ in unfit)} cannot run on this machine")
        report.skipped(f"{key}.{i}", case, why, f"[SKIP] case {i}: {case.spec}\n       {why}")
    covers = "a check" if mode == "test" else "a ranked score"
    return Outcome(False, [f"\n{mode}: {len(unfit)} of the {len(cases)} cases cannot run on this machine, and {covers} "
                           f"covers every case, so no case was run. Run on a machine with more memory (a GPU "
                           f"machine runs every case of task.yml), or give a tests file of smaller cases: "
                           f"python eval.py {mode} my_cases.txt (one case a line, as in task.yml)"])


@dataclasses.dataclass
class CaseTimes:
    """A timed case: its statistics and the judge's figures (stats), or why it failed (error); the raw
    calls and null calls either way (for --json)."""
    error: str = ""
    skipped: str = ""
    stats: dict = dataclasses.field(default_factory=dict)
    calls: list = dataclasses.field(default_factory=list)
    nulls: list = dataclasses.field(default_factory=list)


def benchmark_case(judge: Judge, case: TestCase, clock: "RunClock", cases_left: int, ranked: bool) -> CaseTimes:
    result = CaseTimes()
    try:
        share_s = clock.start_case(cases_left)
        judge.check_fits(case)
        result.error = _time_case(judge, case, clock, share_s, ranked, result)
    except CaseSkipped as e:
        result.skipped = str(e)
    except Exception as e:
        result.error = failure_text(e)
    return result


def _prepare_timed(judge: Judge, clock: "RunClock", args: dict, form_too: bool) -> Prepared:
    """A case's input, generated and prepared by the judge; that work is credited to the clock (on the
    CPU it takes seconds a call and must not count against the submission's limit)."""
    made = time.monotonic()
    prep = judge.prepare(judge.reference.generate_input(**args), form_too=form_too)
    clock.credit(time.monotonic() - made)
    return prep


def _warm_up(judge: Judge, worker: WorkerProcess, prep: Prepared, deadline: float) -> float:
    """WARMUP_CALLS timed calls of the worker; how long the null's calls are to take (their median)."""
    warm = [judge.timed(worker, prep, deadline)[0].device_ns for _ in range(WARMUP_CALLS)]
    return _median(warm) if all(math.isfinite(x) and x > 0 for x in warm) else 0.0


def _calibrate_nulls(judge: Judge, worker: WorkerProcess, prep: Prepared, deadline: float) -> list:
    """The worker warmed up, the null too, then NULL_CALIBRATION null calls that take as long as its calls."""
    mimic = _warm_up(judge, worker, prep, deadline)
    judge.null_call(prep, deadline, mimic)  # its warm-up: a process's first call loads kernels (~30 ms on the H200)
    return [judge.null_call(prep, deadline, mimic) for _ in range(NULL_CALIBRATION)]


def _timed_checked_call(judge: Judge, worker: WorkerProcess, prep: Prepared, deadline: float, i: int,
                        calls: list, nulls: list, periodic_nulls: bool = True) -> str:
    """Timed call i of a case: checked, its reported time sane and over the memory floor, appended to
    calls, with the null calls that keep its kind calibrated appended to nulls (the periodic ones only if
    periodic_nulls; compare mode schedules those itself). '' or why it failed."""
    gc.disable()
    try:
        call, returned = judge.timed(worker, prep, deadline)
    finally:
        gc.enable()
    good, message = judge.check(prep, returned)
    if not good:
        return f"timed call {i}: {message}"
    if not math.isfinite(call.device_ns) or call.device_ns <= 0:
        return f"timed call {i}: the submission's process reported a time of {call.device_ns} ns"
    if prep.floor_ns is not None and call.device_ns < prep.floor_ns:
        return (f"timed call {i}: the submission's process reported {fmt_ns(call.device_ns)}, under the memory "
                f"floor of this input ({fmt_ns(prep.floor_ns)}: the bytes it must move at the device's peak "
                f"bandwidth)")
    calls.append(call)
    kind = [c.device_ns for c in calls if c.early == call.early]
    if call.early and not any(n.early for n in nulls):  # the first call released before it returned
        nulls.extend(judge.null_call(prep, deadline, _median(kind), early=True) for _ in range(NULL_CALIBRATION))
    if periodic_nulls and len(calls) % NULL_EVERY == 0:
        _periodic_null(judge, prep, deadline, calls, nulls)
    return ""


def _periodic_null(judge: Judge, prep: Prepared, deadline: float, calls: list, nulls: list) -> None:
    """The null call _timed_checked_call adds after every NULL_EVERY-th call, for a caller that places it."""
    kind = [c.device_ns for c in calls if c.early == calls[-1].early]
    nulls.append(judge.null_call(prep, deadline, _median(kind), early=calls[-1].early))


def _time_case(judge: Judge, case: TestCase, clock: "RunClock", share_s: float, ranked: bool,
               result: CaseTimes) -> str:
    """Fills result.calls, .nulls and .stats; returns '' or why the case failed. share_s: the case's
    share of the run's time left; its timing loops stop after a part of it. A case whose reports lie under
    the judge's clock by more than the band is timed again on fresh processes (RETIMES) before it fails."""
    band = BANDS["cuda" if judge.cuda else "cpu"]
    case_start = time.monotonic()
    late_holds = judge.worker.late_holds
    first, timings = None, []
    for attempt in range(1 + RETIMES):
        if attempt:
            judge.stop_workers()  # fresh processes, and so fresh CUDA contexts
            result.calls.clear()
            result.nulls.clear()
        judge.ensure_started(judge.worker, clock.left())
        judge.ensure_started(judge.null, clock.left())
        first = first or _prepare_timed(judge, clock, case.args, form_too=True)
        good, message = judge.call_once(first, clock.deadline)
        if not good:
            return message
        share_left = max(share_s - (time.monotonic() - case_start), 0.0)
        problem = _timing_loop(judge, case, first, clock, share_left, ranked, result.calls, result.nulls)
        if problem:
            return problem
        timings.append(timing_gap(result.calls, result.nulls, band if judge.cuda else None))
        # A process whose switches (or, on the CPU, whose null calls) ran slow is not the submission's doing:
        # a second draw of processes; what fails is what both draws say.
        kept, how, used_calls = case_ranking(result.calls, result.nulls, judge.cuda, first.floor_ns)
        problem = check_timings(timings, band) or ("" if judge.cuda else _baseline_problem(kept, how, used_calls))
        if not problem:
            break
    else:
        return problem
    calls, nulls = result.calls, result.nulls
    times = [t for t, _ in how]
    used = [times[i] for i in used_calls]
    stats = result.stats = dataclasses.asdict(calculate_stats(used))
    host = [c.host_ns for c in kept if math.isfinite(c.host_ns)]
    stats["host"] = sum(host) / len(host) if judge.cuda and host else float("nan")  # as the worker measured it
    stats["floor"] = first.floor_ns if first.floor_ns is not None else float("nan")
    stats["judge"] = sum(c.device_ns for c in kept) / len(kept) + overhead_gap(kept, nulls)
    claimed, gap = mean_timing(timings) or (math.nan, math.nan)  # what check_timings held to the band
    stats["band"] = band.at(claimed) if math.isfinite(claimed) else math.nan
    stats["gap"] = gap
    stats["early"] = sum(c.early for c in calls)
    stats["stragglers"] = len(calls) - len(kept)
    stats["slowest"] = len(times) - len(used)
    stats["lifted"] = sum(h == "lifted" for _, h in how)
    stats["above"] = sum(h == "judge" for _, h in how) if judge.cuda else 0
    stats["retimed"] = attempt
    stats["late_holds"] = judge.worker.late_holds - late_holds
    return ""


def _baseline_problem(kept: list, how: list, used: list) -> str:
    """On the CPU, where the judge's clock is ranked (case_ranking's figures): '' unless the calls' ranked
    mean (the judge's clock less the null's overhead) is under a quarter of what they report, which an
    honest call's is not (about what it reports) and a null baseline inflated by the submission's doing is."""
    reported = [kept[i].device_ns for i in used if not kept[i].early]
    if not reported:
        return ""
    ranked, claimed = sum(how[i][0] for i in used) / len(used), sum(reported) / len(reported)
    if ranked >= 0.25 * claimed:
        return ""
    return (f"the submission's process reports its calls as taking {fmt_ns(claimed)} each and the judge's "
            f"clock, less the null submission's overhead, saw {fmt_ns(ranked)}: the report or the baseline "
            f"cannot be trusted")


def _timing_loop(judge: Judge, case: TestCase, prep: Prepared, clock: "RunClock", share_s: float, ranked: bool,
                 calls: list, nulls: list) -> str:
    """A case's null calibration and timed calls (on prep, or in ranked mode on a fresh input each), until
    the stopping rule; '' or why a call failed."""
    nulls.extend(_calibrate_nulls(judge, judge.worker, prep, clock.deadline))
    repeats, max_time = (RANKED_MAX_REPEATS, RANKED_MAX_TIME_NS) if ranked else (BENCH_MAX_REPEATS, BENCH_MAX_TIME_NS)
    repeats = repeats if judge.cuda else min(repeats, CPU_MAX_REPEATS)
    wall_start = time.perf_counter_ns()
    wall_limit = min(WALL_LIMIT_NS, LOOP_SHARE * share_s * 1e9)
    for i in range(repeats):
        if ranked:  # a fresh input from a secret seed: nothing of it exists before this call
            prep = _prepare_timed(judge, clock, dict(case.args, seed=secrets.randbits(63)), form_too=False)
        problem = _timed_checked_call(judge, judge.worker, prep, clock.deadline, i, calls, nulls)
        if problem:
            return problem
        if i + 1 >= MIN_RUNS:  # what is ranked, never a bare report
            s = calculate_stats(without_slowest(ranked_times(calls, nulls, judge.cuda)))
            if (s.err / s.mean < 0.001 or s.mean * s.runs > max_time
                    or time.perf_counter_ns() - wall_start > wall_limit):
                break
    return ""


def run_benchmarks(report: Report, judge: Judge, cases: list[TestCase], clock: "RunClock", ranked: bool) -> Outcome:
    if not judge.cuda:
        report.say("NOTE: no CUDA device: the times below are CPU wall-clock times of whatever path the "
                   "submission takes on the CPU, not GPU kernel times.\n")
    report.log("benchmark-count", len(cases))
    header = (f"{'#':>2}  {'case':52s} {'mean':>11s} {'+-err':>9s} {'best':>11s} {'runs':>5s} "
              f"{'host/call':>10s} {'floor':>10s} {'%floor':>6s}")
    report.say(header)
    report.say("-" * len(header))
    means, bests, notes, failed = [], [], [], []
    for i, case in enumerate(cases):
        report.log(f"benchmark.{i}.spec", case.spec)
        times = benchmark_case(judge, case, clock, len(cases) - i, ranked)
        judge.release_memory()
        if times.skipped:
            report.skipped(f"benchmark.{i}", case, times.skipped, f"{i:>2}  {case.spec:52s} SKIP\n      {times.skipped}")
            if ranked:  # a ranked score covers every case: one skipped (for memory) cannot leave a fast subset
                return Outcome(False, [f"\nleaderboard: case {i} could not run on this machine, so the run ends "
                                       f"here: no score"])
            notes.append(f"case {i} skipped: the score covers the other cases only")
            continue
        report.record(spec=case.spec, status="fail" if times.error else "pass", error=times.error, stats=times.stats,
                      calls=[dataclasses.astuple(c) for c in times.calls],
                      nulls=[dataclasses.astuple(c) for c in times.nulls])
        if times.error:
            report.log(f"benchmark.{i}.status", "fail")
            report.log(f"benchmark.{i}.error", first_line(times.error))
            report.say(f"{i:>2}  {case.spec:52s} FAIL\n{indented(times.error, 6)}")
            failed.append(i)
            judge.stop_workers()  # one may still be stuck in the failed call: fresh ones for the next case
            if ranked:  # as GPU MODE: a failed case ends a ranked run; benchmark mode goes on
                return Outcome(False, [f"\nleaderboard: case {i} failed, so the run ends here: no score"])
            continue
        result = times.stats
        for key, value in result.items():
            if not (isinstance(value, float) and math.isnan(value)):
                report.log(f"benchmark.{i}.{key}", value)
        means.append(result["mean"])
        bests.append(result["best"])
        host = fmt_ns(result["host"]) if math.isfinite(result["host"]) else "-"
        floor = fmt_ns(result["floor"]) if math.isfinite(result["floor"]) else "-"
        pct = f"{100 * result['floor'] / result['mean']:.0f}%" if math.isfinite(result["floor"]) else "-"
        report.say(f"{i:>2}  {case.spec:52s} {fmt_ns(result['mean']):>11s} {fmt_ns(result['err']):>9s} "
                   f"{fmt_ns(result['best']):>11s} {result['runs']:>5d} {host:>10s} {floor:>10s} {pct:>6s}")
        timed = result["runs"] + result["stragglers"] + result["slowest"]
        if result["stragglers"]:
            notes.append(f"case {i}: {result['stragglers']} of {timed} calls had not "
                         f"returned {RETURN_WAIT_S * 1e3:g} ms after they were made while the others had (a stall of "
                         f"the host): left out of the ranked statistics, checked")
        elif result["early"]:
            notes.append(f"case {i}: {result['early']} of {timed} calls had not returned "
                         f"{RETURN_WAIT_S * 1e3:g} ms after they were made (custom_kernel waits on the GPU, or its "
                         f"host path is slower): those are timed on the judge's clock as they ran, host time included")
        if result["lifted"] or result["above"]:
            notes.append(f"case {i}: of {timed} calls, {result['lifted']} reported more than {CALL_BANDS} bands under "
                         f"the judge's clock were ranked at that bound, {result['above']} reported more than "
                         f"{CALL_BANDS} bands over it (a stall the judge's clock did not see) on the judge's clock")
        if result["retimed"]:
            notes.append(f"case {i}: its reports lay under the judge's clock by more than the band, so it was timed "
                         f"again on fresh processes; over both timings, {fmt_ns(result['gap'])} (the band "
                         f"{fmt_ns(result['band'])})")
        if result["late_holds"]:
            notes.append(f"case {i}: in {result['late_holds']} calls the one-block hold did not run within "
                         f"{HOLD_SWAP_WAIT_S * 1e3:g} ms of the full-SM hold's release (kernels of the submission's on "
                         f"other streams held the SMs, or the holds were dropped): the judge's work then took the SMs "
                         f"from whatever held them, which slows the call that follows")
    if failed:
        return Outcome(False, [*notes, f"\n{len(failed)} of {len(cases)} cases failed ({', '.join(map(str, failed))}): "
                                       f"no score"])
    if not means:
        return Outcome(False, [*notes, "\nno case could run on this machine: no score"])
    geo = math.exp(sum(math.log(m) for m in means) / len(means))
    best = math.exp(sum(math.log(b) for b in bests) / len(bests))
    band = BANDS["cuda" if judge.cuda else "cpu"]
    summary = [*notes, f"\ngeometric mean of the means (ranking score): {fmt_ns(geo)}",
               f"geometric mean of the best calls (not ranked): {fmt_ns(best)}",
               f"every case's times agree with the judge's clock (band {fmt_ns(band.abs_ns)} + {band.rel:.0%} of "
               f"the report); the slowest {SLOWEST_SHARE:.0%} of each case's calls (one at least) left out"]
    return Outcome(True, summary)


def run_profiles(report: Report, judge: Judge, cases: list[TestCase], clock: "RunClock") -> Outcome:
    report.log("benchmark-count", len(cases))
    ok = True
    for i, case in enumerate(cases):
        report.log(f"benchmark.{i}.spec", case.spec)
        try:
            clock.start_case(len(cases) - i)
            judge.check_fits(case)
            judge.ensure_started(judge.worker, clock.left())
            prep = judge.prepare(judge.reference.generate_input(**case.args), form_too=True)
            table = judge.profile(prep, clock.deadline)
            del prep
        except CaseSkipped as e:
            report.skipped(f"benchmark.{i}", case, str(e), f"profile {i}: {case.spec}: SKIP\n{e}")
            continue
        except Exception as e:
            ok = False
            judge.worker.stop()
            why = failure_text(e)
            report.log(f"benchmark.{i}.status", "fail")
            report.log(f"benchmark.{i}.error", first_line(why))
            report.record(spec=case.spec, status="fail", error=why)
            report.say(f"profile {i}: {case.spec}: FAIL\n{indented(why, 6)}")
            continue
        report.record(spec=case.spec, status="pass", table=table)
        report.log(f"benchmark.{i}.report", base64.b64encode(table.encode(), b"+*").decode())
        report.say(f"profile {i}: {case.spec}\n{indented(table, 2)}")
    return Outcome(ok, [])


_TURNS = (("A", "B"), ("B", "A"))


def compare_order(i: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Compare mode's pair i: the order of its two calls, and the null calls after it (one per side, after
    every NULL_EVERY pairs, never inside a pair). A call right after a null call runs slower, and so does
    the first null call of two in a row (on two CPU cores the side these fell to read 4 to 10 % slower),
    so A and B take turns at both: at going first in a pair, in the pair after each block of nulls, and in
    each block."""
    block = i // NULL_EVERY
    return _TURNS[(i + block) % 2], (_TURNS[block % 2] if (i + 1) % NULL_EVERY == 0 else ())


def compare_case(judge: Judge, case: TestCase, clock: RunClock, share_s: float) -> tuple[str, dict]:
    """A against B on one input: ('', figures) or (why the case failed, {}). Both are checked, then
    timed in the turns compare_order gives, on the same protocol, each against nulls that take as long as
    its calls; the ratio is the geometric mean of the per-pair ratios of their ranked times."""
    sides = {"A": judge.worker, "B": judge.other}
    for w in (*sides.values(), judge.null):
        judge.ensure_started(w, clock.left())
    prep = _prepare_timed(judge, clock, case.args, form_too=True)
    for name, w in sides.items():
        good, message = judge.call_once(prep, clock.deadline, worker=w)
        if not good:
            return f"{name}: {message}", {}
    calls = {name: [] for name in sides}
    band = COMPARE_BANDS["cuda" if judge.cuda else "cpu"]
    mimic = {name: _warm_up(judge, w, prep, clock.deadline) for name, w in sides.items()}
    nulls = {name: [] for name in sides}
    for k in range(NULL_CALIBRATION):
        for name in _TURNS[k % 2]:
            nulls[name].append(judge.null_call(prep, clock.deadline, mimic[name]))
    wall_start, wall_limit = time.perf_counter_ns(), min(WALL_LIMIT_NS, LOOP_SHARE * share_s * 1e9)
    for i in range(BENCH_MAX_REPEATS if judge.cuda else CPU_MAX_REPEATS):
        pair, nulls_after = compare_order(i)
        for name in pair:
            problem = _timed_checked_call(judge, sides[name], prep, clock.deadline, i, calls[name], nulls[name],
                                          periodic_nulls=False)
            if problem:
                return f"{name}: {problem}", {}
        for name in nulls_after:
            _periodic_null(judge, prep, clock.deadline, calls[name], nulls[name])
        if i + 1 >= MIN_RUNS:
            _, se = _log_ratio(ranked_times(calls["A"], nulls["A"], judge.cuda, band),
                               ranked_times(calls["B"], nulls["B"], judge.cuda, band))
            if se < 0.001 or time.perf_counter_ns() - wall_start > wall_limit:
                break
    for name in sides:
        problem = verify_times(calls[name], nulls[name], band, cuda=judge.cuda)
        if problem:
            return f"{name}: {problem}", {}
    keep = kept_calls([a.early or b.early for a, b in zip(calls["A"], calls["B"])])  # stragglers, by pair
    ranked = {name: [t for t, k in zip(ranked_times(calls[name], nulls[name], judge.cuda, band), keep) if k]
              for name in sides}
    log_mean, log_se = _log_ratio(ranked["A"], ranked["B"])
    return "", {"A": sum(ranked["A"]) / len(ranked["A"]), "B": sum(ranked["B"]) / len(ranked["B"]),
                "log_ratio": log_mean, "log_se": log_se, "pairs": len(ranked["A"])}


def run_compare(report: Report, judge: Judge, cases: list[TestCase], clock: RunClock, names: tuple) -> Outcome:
    report.say(f"A = {names[0]}\nB = {names[1]}\n")
    if not judge.cuda:
        report.say("NOTE: no CUDA device: CPU wall-clock times of whatever path each submission takes on the CPU.\n")
    header = f"{'#':>2}  {'case':52s} {'A mean':>11s} {'B mean':>11s} {'pairs':>5s}  A/B [95 % interval]"
    report.say(header)
    report.say("-" * len(header))
    logs, variances, failed, skipped = [], [], [], []
    spread = COMPARE_PROCESS_SPREAD["cuda" if judge.cuda else "cpu"]
    for i, case in enumerate(cases):
        try:
            share_s = clock.start_case(len(cases) - i)
            judge.check_fits(case)
            error, fig = compare_case(judge, case, clock, share_s)
        except CaseSkipped as e:
            report.skipped("", case, str(e), f"{i:>2}  {case.spec:52s} SKIP\n      {e}")
            skipped.append(i)
            continue
        except Exception as e:
            error, fig = failure_text(e), {}
        judge.release_memory()
        report.record(spec=case.spec, status="fail" if error else "pass", error=error, stats=fig)
        if error:
            failed.append(i)
            judge.stop_workers()
            report.say(f"{i:>2}  {case.spec:52s} FAIL\n{indented(error, 6)}")
            continue
        logs.append(fig["log_ratio"])
        variances.append(fig["log_se"] ** 2)
        report.say(f"{i:>2}  {case.spec:52s} {fmt_ns(fig['A']):>11s} {fmt_ns(fig['B']):>11s} {fig['pairs']:>5d}  "
                   f"{_interval(fig['log_ratio'], fig['log_se'], spread)}")
    if failed or not logs:
        return Outcome(False, [f"\n{len(failed)} of {len(cases)} cases failed: no comparison" if failed
                               else "\nno case could run: no comparison"])
    mean = sum(logs) / len(logs)
    se = math.sqrt(sum(variances)) / len(logs)
    lo, hi = _bounds(mean, se, spread)
    verdict = ("A is faster" if hi < 1 else "A is slower" if lo > 1 else
               "no difference the run can tell (the interval holds 1)")
    over = f"the {len(logs)} cases that ran" if skipped else "the cases"
    return Outcome(True, [f"\ngeometric mean of A/B over {over}: {_interval(mean, se, spread)} (95 %, widened by "
                          f"the {spread:.1%} two processes of one file differ by): {verdict}"])
