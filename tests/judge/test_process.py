"""judge_process: the processes a run starts, stopped and resumed around the null's calls; the inputs'
layout in shared memory; the relay of a worker's output."""
import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import wait_for

import judge_process
import judge_report
import judge_worker


def _state(pid: int) -> str:
    return judge_process._stat_fields(f"/proc/{pid}/stat")[0]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_the_null_runs_with_every_other_process_stopped():
    """What null_call runs under: every process the judge started is stopped (SIGSTOP), a detached
    grandchild (setsid) included, except the subtree it keeps (the null's); all go on afterwards."""
    forks = "import os, time\nif os.fork() == 0:\n    os.setsid()\ntime.sleep(60)\n"
    worker = subprocess.Popen([sys.executable, "-c", forks])
    kept = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert wait_for(lambda: judge_process._process_tree().get(worker.pid))
        grandchild = judge_process._process_tree()[worker.pid][0]
        with judge_process.DescendantsStopped(keep={kept.pid}) as stopped:
            assert _state(worker.pid) == "T" and _state(grandchild) == "T"  # stopped before it returns
            assert _state(kept.pid) != "T" and stopped.ran() == []
        assert wait_for(lambda: _state(worker.pid) != "T" and _state(grandchild) != "T")
    finally:
        for pid in judge_process._descendants(keep=set()):
            os.kill(pid, signal.SIGKILL)
        for proc in (worker, kept):
            proc.wait()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_a_stopped_process_that_is_resumed_is_caught():
    """A process the judge stopped and something else resumed (a sibling's SIGCONT) shows in ran()."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True:\n    pass\n"])
    try:
        with judge_process.DescendantsStopped(keep=set()) as stopped:
            assert spinner.pid in stopped.cpu and stopped.ran() == []
            os.kill(spinner.pid, signal.SIGCONT)
            assert wait_for(lambda: spinner.pid in stopped.ran(), timeout=5)
    finally:
        spinner.kill()
        spinner.wait()


def test_input_layout_round_trip_preserves_values_and_strides():
    data = (torch.randn(3, 4).t(), {"a": torch.arange(5, dtype=torch.int32), "b": (torch.ones(2, 2, dtype=torch.bfloat16),)},
            [torch.empty(0, 3)], 7, 0.5, "x", None)
    layout = judge_process.InputLayout(data)
    arena = torch.zeros(layout.nbytes + 1024, dtype=torch.uint8)
    layout.write(layout.views(arena))
    views = [judge_worker.arena_view(arena, spec) for spec in layout.specs]
    rebuilt = judge_worker.build_input(layout.structure, views)
    assert torch.equal(rebuilt[0], data[0]) and rebuilt[0].stride() == data[0].stride()
    assert torch.equal(rebuilt[1]["a"], data[1]["a"]) and rebuilt[1]["b"][0].dtype == torch.bfloat16
    assert rebuilt[2][0].shape == (0, 3) and rebuilt[3:] == (7, 0.5, "x", None)
    assert all(spec[0] % judge_process.InputLayout.ALIGN == 0 for spec in layout.specs)
    layout.poison(arena)
    assert torch.isnan(views[0]).all() and (views[1] == 0).all()


def test_output_without_newlines_is_relayed_in_bounded_pieces(capsys):
    """A submission's 64 MB on stdout with no newline reaches the judge in pieces of at most
    RELAY_LINE_CHARS bytes, so the judge never holds it whole; past RELAY_LINE_LIMIT pieces it is dropped."""
    import io

    class Pipe(io.BytesIO):
        longest = 0

        def readline(self, size=-1):
            piece = super().readline(size)
            Pipe.longest = max(Pipe.longest, len(piece))
            return piece
    worker = types.SimpleNamespace(report=judge_report.Report(), role="submission")
    judge_process.WorkerProcess._relay_output(worker, Pipe(b"x" * (64 << 20)))
    assert 0 < Pipe.longest <= judge_report.RELAY_LINE_CHARS
    assert "further output of the submission dropped" in capsys.readouterr().out

