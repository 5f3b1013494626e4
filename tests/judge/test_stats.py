"""judge_stats: the band a report must fall in, which calls are ranked and on which clock, and the per-case
statistics, on calls shaped as the H200 measured them."""
import random

import pytest

import judge_stats
GPU_BAND = judge_stats.BANDS["cuda"]

# ---------------------------------------------------------------------------------------------
# The judge's pieces
# ---------------------------------------------------------------------------------------------
def _calls(device, overhead):
    return [judge_stats.TimedCall(d, d + o, 0.0, False) for d, o in zip(device, overhead)]


def test_verify_times_passes_honest_calls_and_rare_hiccups():
    nulls = _calls([2e3] * 40, [100e3 + 3e3 * (i % 5) for i in range(40)])
    honest = _calls([300e3] * 100, [100e3 + 3e3 * (i % 7) for i in range(100)])
    assert judge_stats.verify_times(honest, nulls, GPU_BAND) == ""
    hiccups = _calls([300e3] * 100, [100e3 + (5e6 if i % 25 == 0 else 0) for i in range(100)])  # 4 %
    assert judge_stats.verify_times(hiccups, nulls, GPU_BAND) == ""
    # one call released late on a host hiccup, timed on the host clock against nulls of its kind
    late = honest[:-1] + [judge_stats.TimedCall(300e3, 100e6, 0.0, True)]
    early_nulls = nulls + [judge_stats.TimedCall(2e3, 400e3, 0.0, True)] * 10
    assert judge_stats.verify_times(late, early_nulls, GPU_BAND) == ""


@pytest.mark.parametrize("fraction,factor", [(1.0, 0.7), (0.3, 0.1), (1.0, 0.0)])
def test_verify_times_fails_reported_times_under_the_judges_clock(fraction, factor):
    nulls = _calls([2e3] * 40, [100e3] * 40)
    true = [300e3] * 100
    faked = [t * factor if i < fraction * len(true) else t for i, t in enumerate(true)]
    calls = [judge_stats.TimedCall(f, t + 100e3, 0.0, False) for f, t in zip(faked, true)]
    assert "below what the judge's clock allows" in judge_stats.verify_times(calls, nulls, GPU_BAND)


def _h200_case(true_ns, reported, n=100, gap_ns=1.5e3, seed=0):
    """Calls and nulls shaped as the H200 measured them (results/judge_resolution_h200.md): the protocol's overhead
    ~512 us a call with a spread of ~1.2 us, the honest call's overhead above the null's by gap_ns."""
    rng = random.Random(seed)
    nulls = [judge_stats.TimedCall(true_ns, true_ns + 512e3 + rng.gauss(0, 1.2e3), 0.0, False) for _ in range(35)]
    calls = []
    for i in range(n):
        t = true_ns + rng.gauss(0, 0.05e3)
        calls.append(judge_stats.TimedCall(reported(i, t), t + 512e3 + gap_ns + rng.gauss(0, 1.2e3), 0.0, False))
    return calls, nulls


def _ranked_mean(calls, nulls):
    times = judge_stats.without_slowest(judge_stats.ranked_times(calls, nulls, cuda=True))
    return sum(times) / len(times)


@pytest.mark.parametrize("forged", ["quarter", "floor"])
def test_a_report_forged_on_a_short_call_fails_inside_the_old_margin(forged):
    """The forged short-call reports that won leaderboard mode on the H200 (4 x 1024, 10.8 us a call: reported
    as a quarter of it, or as 1.05 x its memory floor, 0.3 us): under the old margin, max(20 us, 15 %), the
    gap (8-10.5 us) passed; the band measured for the judge's clock fails it."""
    report = {"quarter": lambda i, t: t / 4, "floor": lambda i, t: 0.3e3}[forged]
    calls, nulls = _h200_case(10.8e3, report)
    gap = judge_stats.overhead_gap(calls, nulls)
    assert gap < max(20e3, 0.15 * 10.8e3)  # what eval.py allowed before the band was measured
    assert "below what the judge's clock allows" in judge_stats.verify_times(calls, nulls, GPU_BAND)
    honest, honest_nulls = _h200_case(10.8e3, lambda i, t: t)
    assert judge_stats.verify_times(honest, honest_nulls, GPU_BAND) == ""
    # timed again on fresh processes, the case is judged on the mean of both timings: a luckier draw of
    # processes (a null whose switches ran 4 us slower) is not a second chance
    luckier, luckier_nulls = _h200_case(10.8e3, report, gap_ns=-4e3, seed=1)
    if forged == "quarter":
        assert judge_stats.verify_times(luckier, luckier_nulls, GPU_BAND) == ""  # alone, it would pass
    assert "2 timings" in judge_stats.verify_times(luckier, luckier_nulls, GPU_BAND, [judge_stats.timing_gap(calls, nulls)])
    assert judge_stats.verify_times(honest, honest_nulls, GPU_BAND, [(10.8e3, GPU_BAND.at(10.8e3) + 3e3)]) == ""


def test_a_report_inside_the_band_gains_at_most_the_band():
    """What the judge cannot see: a report shaved by less than the band passes, and its gain is bounded by the
    band at its time (the per-case bounds in docs/judge.md)."""
    for true_ns in (10.8e3, 50e3, 300e3):
        honest = _ranked_mean(*_h200_case(true_ns, lambda i, t: t))
        shave = (GPU_BAND.at(true_ns) - 3e3) / (1 + GPU_BAND.rel)  # inside: the gap is shave + 1.5 us
        calls, nulls = _h200_case(true_ns, lambda i, t: t - shave)
        assert judge_stats.verify_times(calls, nulls, GPU_BAND) == ""
        assert honest - _ranked_mean(calls, nulls) <= GPU_BAND.at(true_ns)


def test_a_report_inflated_above_the_judges_clock_is_ranked_on_it():
    """A stall of the worker's events that the judge's clock did not see (kernelbot's run on the H200: one call
    of 100 at 32 x 1024 reported 2.32 ms, the judge's clock ~17.7 us): ranked on the judge's clock, and the
    case's mean moves by under 1 %; under the old rule it moved 11 %."""
    honest_calls, nulls = _h200_case(16.2e3, lambda i, t: t)
    stalled = [judge_stats.TimedCall(2.32e6 if i == 37 else c.device_ns, c.judge_ns, 0.0, False)
               for i, c in enumerate(honest_calls)]
    how = judge_stats.rank_calls(stalled, nulls, cuda=True)
    assert how[37][1] == "judge" and abs(how[37][0] - 16.2e3) < 10e3
    assert [h for i, (_, h) in enumerate(how) if i != 37] == ["report"] * 99
    assert abs(_ranked_mean(stalled, nulls) / _ranked_mean(honest_calls, nulls) - 1) < 0.01
    old_mean = sum(c.device_ns for c in stalled) / len(stalled)  # the report, ranked as it was
    assert old_mean / _ranked_mean(honest_calls, nulls) > 1.1


@pytest.mark.parametrize("true_ns", [20e3, 100e3, 1e6])
def test_one_inflated_report_cannot_cover_the_others_shaved(true_ns):
    """One report of 1e300 ns (or a few ms) per case, ranked on the judge's clock and dropped as the slowest,
    would have widened the band and offset the other calls' gaps, so that every other call could shave three
    bands: the check takes it as ranked. Re-timed, the same holds."""
    x = (true_ns - 3 * GPU_BAND.abs_ns) / (1 + 3 * GPU_BAND.rel)  # each other call's report: 3 bands under
    for inflated in (1e300, 5e6):
        calls, nulls = _h200_case(true_ns, lambda i, t: inflated if i == 57 else x)
        assert "below what the judge's clock allows" in judge_stats.verify_times(calls, nulls, GPU_BAND)
        earlier = judge_stats.timing_gap(_h200_case(true_ns, lambda i, t: x, seed=2)[0], nulls, GPU_BAND)
        assert "2 timings" in judge_stats.verify_times(calls, nulls, GPU_BAND, [earlier])


def test_a_call_ranked_on_the_judges_clock_is_not_ranked_under_the_memory_floor():
    nulls = _calls([2e3] * 40, [100e3] * 40)
    seen_short = judge_stats.TimedCall(5e6, 100e3 + 1e3, 0.0, False)  # reported 5 ms, the judge saw 1 us
    assert judge_stats.rank_calls([seen_short], nulls, cuda=True, floor_ns=4e3) == [(4e3, "judge")]


def test_a_retiming_with_no_call_on_time_passes_on_the_judges_clock():
    """Its ranked time is all the judge's clock: the earlier timing's gap does not fail it alone."""
    assert judge_stats.check_timings([(10e3, 50e3), None], GPU_BAND) == ""
    assert judge_stats.check_timings([(10e3, 50e3)], GPU_BAND) != ""


@pytest.mark.parametrize("clock", ["both", "judge"])
def test_one_stalled_call_in_a_hundred_moves_the_mean_by_under_one_percent(clock):
    """A call stalled for milliseconds on both clocks (the GPU taken by another context mid-call) or on the
    judge's alone (the judge descheduled): the slowest 1 % of a case's calls are left out."""
    honest_calls, nulls = _h200_case(16.2e3, lambda i, t: t)
    stalled = [judge_stats.TimedCall(c.device_ns + (3e6 if i == 50 and clock == "both" else 0), c.judge_ns
                                 + (3e6 if i == 50 else 0), 0.0, False) for i, c in enumerate(honest_calls)]
    assert abs(_ranked_mean(stalled, nulls) / _ranked_mean(honest_calls, nulls) - 1) < 0.01
    assert judge_stats.without_slowest([1.0] * 199 + [5.0]) == [1.0] * 198  # 1 % of 200
    assert judge_stats.without_slowest([1.0] * 9 + [5.0]) == [1.0] * 9  # one at least
    assert judge_stats.without_slowest([3.0]) == [3.0]


def test_a_call_released_before_it_returned_is_ranked_on_the_judges_clock():
    nulls = _calls([2e3] * 10, [100e3] * 10) + [judge_stats.TimedCall(1e6, 1.4e6, 0.0, True)] * 10  # early: 0.4 ms
    on_time = judge_stats.TimedCall(300e3, 400e3, 0.0, False)
    honest_early = judge_stats.TimedCall(2e6, 2.5e6, 0.0, True)  # the judge saw 2.5 ms - 0.4 ms of protocol
    faked_early = judge_stats.TimedCall(0.2e6, 2.5e6, 0.0, True)  # claims a tenth of the same call
    assert judge_stats.ranked_times([on_time, honest_early, faked_early], nulls, cuda=True) == [300e3, 2.1e6, 2.1e6]
    assert judge_stats.verify_times([honest_early, faked_early], nulls, GPU_BAND) == ""  # no report to check
    # without a null baseline for that path, the judge's whole clock: never the report
    assert judge_stats.ranked_times([faked_early], nulls[:10], cuda=True) == [2.5e6]


def test_a_call_cannot_hide_work_among_the_residuals_the_check_leaves_out():
    """verify_times leaves out a case's largest residuals; a call among them (here every 20th hides 150 ms)
    is still ranked at what the judge's clock saw of it, less a few bands, on a GPU; on the CPU every call
    is ranked on the judge's clock, so a report can take nothing off (not even the CPU's wide band)."""
    nulls = _calls([2e3] * 40, [100e3] * 40)  # the protocol's overhead: 100 us
    calls = [judge_stats.TimedCall(300e3, 400e3 + (150e6 if i % 20 == 0 else 0), 0.0, False) for i in range(100)]
    assert judge_stats.verify_times(calls, nulls, GPU_BAND) == ""  # the trimmed check cannot see them
    gpu = judge_stats.ranked_times(calls, nulls, cuda=True)
    assert gpu[1] == 300e3 and gpu[0] == pytest.approx(150e6 + 300e3 - judge_stats.CALL_BANDS * GPU_BAND.at(300e3))
    tiny = [judge_stats.TimedCall(1.0, 400e3, 0.0, False)] * 10  # 300 us of work reported as 1 ns
    assert judge_stats.ranked_times(tiny, nulls, cuda=False) == [300e3] * 10


def test_a_rare_call_stalled_on_the_host_is_left_out_of_the_ranking():
    """One call of a hundred released late (a host stall) does not move the mean by milliseconds; a
    submission whose calls are late more often than that is ranked on the judge's clock, every call."""
    on_time = [judge_stats.TimedCall(20e3, 120e3, 0.0, False)] * 99
    stalled = judge_stats.TimedCall(20e3, 95e6, 0.0, True)
    assert judge_stats.ranked_calls(on_time[:50] + [stalled] + on_time[50:]) == on_time
    twice = [stalled] * 2 + on_time[:98]
    assert judge_stats.ranked_calls(twice) == twice
    short = [stalled] + on_time[:9]  # one at least, even in a case of ten calls
    assert judge_stats.ranked_calls(short) == on_time[:9]
    two = [stalled] + on_time[:99] + [stalled] + on_time[:99]  # 1 % of 200
    assert judge_stats.ranked_calls(two) == on_time[:99] * 2
    assert judge_stats.ranked_calls([stalled] * 10) == [stalled] * 10  # a submission that always waits
    # a late last call is ranked: it cannot end the timing loop (a report of 1e12 ns) and be left out too
    ended_late = on_time[:99] + [judge_stats.TimedCall(1e12, 95e6, 0.0, True)]
    assert judge_stats.ranked_calls(ended_late) == ended_late
    # and the loop's stopping rule reads what is ranked: the judge's clock for it
    assert judge_stats.ranked_times(ended_late, [], cuda=True)[-1] == 95e6


def test_trimmed_mean_leaves_out_the_largest():
    assert judge_stats.trimmed_mean([1.0] * 19 + [1000.0]) == 1.0
    assert judge_stats.trimmed_mean([5.0]) == 5.0

