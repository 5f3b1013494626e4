"""judge_worker: the worker's seccomp filter per architecture, and the output's digest (the judge's torch ops
and the worker's Triton kernel)."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import judge_process
import judge_timing
import judge_worker

def _run_seccomp(program: bytes, arch: int, nr: int, args=(0,) * 6) -> int:
    """What a classic-BPF seccomp program returns for one call (the loads, jumps and returns it uses)."""
    import struct as _struct

    data = _struct.pack("<iIQ6Q", nr, arch, 0, *args)  # seccomp_data: nr, arch, instruction pointer, args
    code = [_struct.unpack("<HBBI", program[i:i + 8]) for i in range(0, len(program) - len(program) % 8, 8)]
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        if op == 0x20:
            acc = _struct.unpack_from("<I", data, k)[0]
        elif op in (0x15, 0x35):
            pc += jt if (acc == k if op == 0x15 else acc >= k) else jf
        elif op == 0x06:
            return k
        else:
            raise AssertionError(f"opcode {op:#x} at {pc}")
        pc += 1


def test_the_worker_syscall_filter_per_arch():
    """Every arch's numbers, not only this machine's: denied calls fail, calls aimed at the caller (0) pass
    and at another process fail, the rest pass, and a call of an unknown arch kills the process."""
    import errno as _errno

    program, allow, deny = judge_worker.worker_syscall_filter(), 0x7FFF0000, 0x00050000 | _errno.EPERM
    for arch, denied in judge_worker._DENIED_CALLS.items():
        for nr in denied:
            assert _run_seccomp(program, arch, nr) == deny
        for nr, arg in judge_worker._SELF_ONLY_CALLS[arch]:
            assert _run_seccomp(program, arch, nr) == allow
            other = [0] * 6
            other[arg] = 4242
            assert _run_seccomp(program, arch, nr, other) == deny
        for nr, arg, value in judge_worker._DENIED_WHEN[arch]:  # ioprio_set(IOPRIO_WHO_USER, 0): every process of the user
            when = [0] * 6
            when[arg] = value
            assert _run_seccomp(program, arch, nr, when) == deny
            when[arg] = 1  # IOPRIO_WHO_PROCESS, who 0: the caller
            assert _run_seccomp(program, arch, nr, when) == allow
        assert _run_seccomp(program, arch, 0) == allow and _run_seccomp(program, arch, 1000) == allow
    assert _run_seccomp(program, 0xC000003E, judge_worker._X32_SYSCALL_BIT | 1) == deny  # x32
    assert _run_seccomp(program, 0x12345678, 112) == 0x80000000  # an unknown arch: killed


def test_the_output_digest_binds_every_byte_its_order_and_the_key():
    """judge_timing.output_digest: two int64 that change with one bit anywhere, with two words swapped, with the key, and
    with a bend that keeps the words' sum (what fits_its_output_to_an_early_digest does to a sum)."""
    g = torch.Generator().manual_seed(3)
    key = judge_timing.digest_key()
    for n in (0, 3, 8, 4099, 8 * judge_worker.DIGEST_BLOCK + 5, 1 << 16):
        flat = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
        digest = judge_timing.output_digest(torch, flat, key).tolist()
        assert len(digest) == 2 and judge_timing.output_digest(torch, flat.clone(), key).tolist() == digest
        assert judge_timing.output_digest(torch, flat, judge_timing.digest_key()).tolist() != digest
        if n:
            i = int(torch.randint(0, n, (1,), generator=g))
            flipped = flat.clone()
            flipped[i] ^= 1 << int(torch.randint(0, 8, (1,), generator=g))
            assert judge_timing.output_digest(torch, flipped, key).tolist() != digest
        if n >= 16:
            words = flat[:n // 8 * 8].view(torch.int64)
            swapped, bent = words.clone(), words.clone()
            swapped[0], swapped[1] = words[1], words[0]
            bent[0], bent[1] = words[0] + 12345, words[1] - 12345  # the same sum
            for other in (swapped, bent):
                if not torch.equal(other, words):
                    changed = torch.cat([other.view(torch.uint8), flat[n // 8 * 8:]])
                    assert judge_timing.output_digest(torch, changed, key).tolist() != digest


def test_the_workers_digest_kernel_is_the_judges_digest():
    """WorkerDigest's Triton kernel (under the interpreter, run from a sealed copy of judge_worker.py as the workers
    start from, where Triton must find the kernel's source) gives judge_timing.output_digest's two words for outputs of one,
    two and three passes, tails included."""
    block = judge_worker.DIGEST_BLOCK
    script = textwrap.dedent(f"""
        import runpy, sys, torch
        ns = runpy.run_path(sys.argv[1], run_name="eval_copy")
        sys.path.insert(0, sys.argv[2])
        import judge_timing
        digest = ns["WorkerDigest"](torch, device="cpu")
        g = torch.Generator().manual_seed(5)
        for n in (0, 5, 8, 8 * {block}, 8 * {block} + 3, 8 * {block} ** 2 + 8):
            flat = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
            key = judge_timing.digest_key()
            digest.load_key(key)
            assert digest(flat).tolist() == judge_timing.output_digest(torch, flat, key).tolist(), n
        print("agree")
    """)
    fd = judge_process.sealed_copy(judge_process.WORKER_CODE.read_bytes(), "judge-worker.py")
    if fd is None:
        pytest.skip("no memfd")
    try:
        done = subprocess.run([sys.executable, "-c", script, f"/proc/self/fd/{fd}", str(judge_process.ROOT)], capture_output=True, text=True,
                              env=dict(os.environ, TRITON_INTERPRET="1"), pass_fds=(fd,), timeout=600)
    finally:
        os.close(fd)
    assert done.returncode == 0 and "agree" in done.stdout, done.stdout + done.stderr

