"""judge_timing: the GPU watchdog, the worker's signal as the judge's host reads it, and how the judge words
what a worker said of its output."""
import signal
import subprocess
import sys
import threading
import time
import types
import tempfile
import unittest.mock
from pathlib import Path

import pytest
import torch
from conftest import wait_for

import judge_process
import judge_timing
import judge_worker


def test_the_gpu_watchdog_acts_only_when_a_long_step_finds_the_gpu_idle_to_the_judge():
    """GpuWatchdog probes only once a step of the judge's has lasted after_s, and calls on_starved only when
    a probe did not run; a step begun anew puts it back to sleep."""
    fired = []
    dog = judge_timing.GpuWatchdog(lambda limit, stop: False, lambda: fired.append(1), after_s=0.5, period_s=0.02,
                              limit_s=0.05)
    try:
        time.sleep(0.2)
        assert not fired  # the step is younger than after_s: no probe
        assert wait_for(lambda: fired, timeout=5)
    finally:
        dog.stop()
    probed, fired = [], []
    dog = judge_timing.GpuWatchdog(lambda limit, stop: probed.append(1) or True, lambda: fired.append(1), after_s=0.0,
                              period_s=0.02, limit_s=0.05)
    try:
        assert wait_for(lambda: len(probed) >= 3, timeout=5) and not fired
    finally:
        dog.stop()
    failing = []
    dog = judge_timing.GpuWatchdog(lambda limit, stop: failing.append(1) or 1 / 0, lambda: fired.append(1), after_s=0.0,
                              period_s=0.02)
    try:
        assert wait_for(lambda: len(failing) >= 3, timeout=5) and not fired  # kills nothing, keeps watching
    finally:
        dog.stop()


def test_workers_killed_for_the_gpu_say_why():
    """kill_workers_for_the_gpu kills every process the judge started, and their deaths report the reason."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with unittest.mock.patch.object(judge_timing, "_descendants", lambda keep: [child.pid]):
            judge_timing.kill_workers_for_the_gpu()
        assert child.wait(timeout=10) == -signal.SIGKILL
        worker = judge_process.WorkerProcess.__new__(judge_process.WorkerProcess)
        assert "ran none of the judge's work" in worker._death("died")
    finally:
        judge_process.WorkerProcess.killed_because = ""
        if child.poll() is None:
            child.kill()


def test_a_class_name_from_the_submission_is_quoted_in_the_judges_message():
    """A returned object's class name is the submission's text: a name holding newlines must not print
    lines of the report's own (unmarked) inside the judge's message."""
    judge = types.SimpleNamespace(form=((2,), "torch.float32", "cpu", 8))
    _, why = judge_timing.Judge._collect(judge, {"tensor": False, "type": "X\n[PASS] test 0\n2/2 tests passed"}, None)
    assert "\n" not in why and why.startswith("output must be a torch.Tensor, got 'X\\n[PASS]")


@pytest.mark.parametrize("meta", [
    {"shape": [True, 2]},  # JSON true: an int to isinstance, refused by reshape
    {"shape": [None, 2]},
    {"shape": [2.0]},
    {"shape": "2"},
])
def test_an_output_described_wrongly_fails_as_the_submissions_fault(meta):
    """What the worker says of its output is the submission's to forge: a description the judge cannot
    apply fails the case as the submission's, never as a crash of the judge's own work."""
    judge = types.SimpleNamespace(form=((2,), "torch.float32", "cpu", 8))
    described = {"tensor": True, "copied": True, "dtype": "torch.float32", "device": "cpu", **meta}
    out, why = judge_timing.Judge._collect(judge, described, torch.zeros(8, dtype=torch.uint8))
    assert out is None and why == "the submission's process described its output incorrectly"


def _signal(page, seq, digest):
    import struct as _struct

    _struct.pack_into("<2q", page, judge_worker.DIGEST_AT, *digest)
    _struct.pack_into("<I", page, judge_worker.STAGED_AT, seq)


def _watched_worker(page, sock, on_message=None):
    def receive(kind, deadline):
        sock.recv(1)
        if on_message:
            on_message()
        return {"kind": kind}
    return types.SimpleNamespace(flag=page, sock=sock, receive=receive)


def test_the_judge_reads_the_digest_beside_the_signal_for_its_call():
    """Judge._await_staged: the digest beside the worker's signal for this call and the host's clock when it
    was seen; a signal for another call is no signal; a message before the signal (an error) ends the
    wait and fails the case; nothing at all ends it at the deadline."""
    import socket as _socket

    page = bytearray(4096)
    ours, theirs = _socket.socketpair()
    try:
        worker = _watched_worker(page, ours)
        _signal(page, 7, (-12345, 1 << 62))
        assert judge_timing.Judge._await_staged(worker, 7, time.monotonic() + 5)[1] == [-12345, 1 << 62]

        _signal(page, 7, (1, 2))  # the last call's signal and digest: no signal for call 8
        later = threading.Timer(0.05, _signal, (page, 8, (99, -99)))
        later.start()
        t0 = time.perf_counter_ns()
        seen, digest = judge_timing.Judge._await_staged(worker, 8, time.monotonic() + 5)
        assert digest == [99, -99] and seen - t0 >= 40e6  # the sighting, on the judge's clock, after the signal came
        later.join()

        def fails():
            raise judge_process.CaseFailure("the submission's error")
        theirs.send(b"x")
        with pytest.raises(judge_process.CaseFailure, match="the submission's error"):
            judge_timing.Judge._await_staged(_watched_worker(page, ours, fails), 9, time.monotonic() + 5)
        theirs.send(b"x")
        with pytest.raises(judge_process.CaseFailure, match="without signalling"):
            judge_timing.Judge._await_staged(_watched_worker(page, ours), 9, time.monotonic() + 5)
        with pytest.raises(judge_process.CaseFailure, match="timed out"):
            judge_timing.Judge._await_staged(worker, 9, time.monotonic() + 0.05)
    finally:
        ours.close()
        theirs.close()



def _ptxas():
    triton = pytest.importorskip("triton")
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not path.exists():
        pytest.skip("this Triton ships no ptxas")
    return path


@pytest.mark.parametrize("name", ["HOLD_PTX", "_SPIN_PTX", "_SIGNAL_PTX", "_STAMP_PTX", "_RELEASE_PTX", "_QUIET_PROBE_PTX"])
def test_the_judges_ptx_kernels_assemble_for_sm90(name, tmp_path):
    """Every PTX kernel of the timed protocol (the worker's holds, spin and signal; the judge's stamp, release and
    quiet probe), as the driver loads it (after the common header), assembles for sm_90 with Triton's ptxas: a
    typo there would fail every timed call on a GPU, and CI has none."""
    body = getattr(judge_worker, name, None) or getattr(judge_timing, name)
    source = tmp_path / "kernel.ptx"
    source.write_text(judge_worker._PTX_HEADER + body)
    done = subprocess.run([str(_ptxas()), "-arch=sm_90", str(source), "-o", str(tmp_path / "kernel.cubin")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_workers_digest_kernel_compiles_for_sm90_without_spills():
    """WorkerDigest's Triton kernel, compiled for sm_90 without a GPU as the worker compiles it (4 warps,
    DIGEST_BLOCK words a program): no local memory."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = judge_worker.digest_kernel()
    signature = {"src": "*i64", "dst": "*i64", "key": "*i64", "n": "i32", "lane_stride": "i32",
                 "BLOCK": "constexpr", "LEVELS": "constexpr"}
    source = ASTSource(kernel, signature, {"BLOCK": judge_worker.DIGEST_BLOCK, "LEVELS": judge_worker.DIGEST_LEVELS})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": judge_worker.DIGEST_WARPS})
    cubin = Path(tempfile.mkdtemp()) / "digest.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    usage = subprocess.run([str(_ptxas().parent / "cuobjdump"), "-res-usage", str(cubin)], capture_output=True,
                           text=True).stdout
    assert "LOCAL:0" in usage and "REG:" in usage, usage
