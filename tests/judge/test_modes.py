"""judge_modes: the run's time limits and compare mode's turns."""
import time

import pytest

import judge_modes
import judge_process
import judge_stats


def test_the_run_clock_ends_a_run_before_its_limit():
    clock = judge_modes.RunClock(3.0, "benchmark_timeout", per_case=False)
    assert 0 < clock.left() <= 3.0 - 0.3  # a reserve to finish the report
    assert clock.start_case(cases_left=2) == pytest.approx(clock.left() / 2, rel=0.01)
    time.sleep(clock.left() + 0.05)
    with pytest.raises(judge_process.CaseFailure, match=r"not run: the run's time limit \(3 s, task.yml `benchmark_timeout`\)"):
        clock.start_case(cases_left=1)
    per_case = judge_modes.RunClock(3.0, "test_timeout", per_case=True)
    time.sleep(0.1)
    assert per_case.start_case(cases_left=5) == 3.0 and per_case.left() > 2.9
    per_case.credit(5.0)  # the judge's own work in a case does not count against the CPU's per-case limit
    assert per_case.left() > 7.9
    clock.credit(5.0)
    assert clock.left() < 0  # on a GPU the run's limit is kernelbot's, absolute


def test_compare_gives_a_and_b_the_same_turns():
    """What a call follows changes its time (a null call before it, or one null call before another), so
    over compare's pairs A and B each come as often first in a pair, right after a null call, and first
    in a block of null calls."""
    events = []
    for i in range(40 * judge_stats.NULL_EVERY):
        pair, nulls_after = judge_modes.compare_order(i)
        assert sorted(pair) == ["A", "B"] and sorted(nulls_after) in ([], ["A", "B"])
        events += [("call", pair[0], "first"), ("call", pair[1], "second")] + [("null", n, "") for n in nulls_after]
    assert sum(e[0] == "null" for e in events) == 2 * 40  # one of each per NULL_EVERY pairs
    turns = {}
    for side in "AB":
        firsts = [e for e in events if e == ("call", side, "first")]
        after_null = [b for a, b in zip(events, events[1:]) if a[0] == "null" and b[:2] == ("call", side)]
        null_first = [b for a, b in zip(events, events[1:]) if a[0] == "call" and b == ("null", side, "")]
        turns[side] = (len(firsts), len(after_null), len(null_first))
    assert turns["A"][0] == turns["B"][0] == 20 * judge_stats.NULL_EVERY
    assert turns["A"][2] == turns["B"][2] == 20
    assert sorted((turns["A"][1], turns["B"][1])) == [19, 20]  # the last block of nulls ends the run

