"""The worker's side of the judge: everything that runs in the submission's process, and the least that
must. The judge starts each worker from a sealed copy of this file (`python judge_worker.py --worker ...`,
judge_process.worker_code_fd), so it imports no other module of the judge: its confinement (Landlock,
seccomp, priority), the CUDA driver calls and PTX kernels of the timed protocol (the holds, the signal),
the output's digest, the shared regions' views, the message frames, and WorkerSession, which serves the
judge's requests. Nothing here is trusted by the judge: what a worker reports is checked (outputs against
the reference, times against the judge's clock). The judge imports the protocol's pieces from here."""
import ctypes
import errno
import functools
import gc
import glob
import json
import mmap
import os
import pickle
import select
import socket
import struct
import sys
import time
import traceback
import types
from pathlib import Path

OTHER_SUBMISSION = "submission_other.py"
HOLD_TIMEOUT_NS = 60_000_000_000  # each hold lets go by itself this long after it starts, whatever happens
# On a GPU machine both sides poll for the other's next message this long before sleeping on it: a process
# woken from sleep takes tens to hundreds of us on a VM, which would otherwise be most of the judge's clock.
POLL_S = 0.02


PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 4, 36, 38
PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 28, 47, 4
# SECBIT_NOROOT, NO_SETUID_FIXUP, KEEP_CAPS_LOCKED, NO_CAP_AMBIENT_RAISE and their locks: a root
# worker does not get its capabilities back by exec'ing anything.
SECUREBITS_LOCKED_DOWN = 0b11101111


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


# Landlock (Linux 5.13+): the worker writes only under its sandbox (compile caches included), /dev/shm, its
# threads' /proc and the device nodes; no ptrace, /proc or (ABI 6+) signals outside its domain. Rights: file
# writes, removals, creations, rename/link across dirs (ABI 2), truncation (ABI 3), device ioctls (ABI 5).
_LL_WRITE_RIGHTS = ((1, (1 << 1) | (1 << 4) | (1 << 5) | (0x7F << 6)), (2, 1 << 13), (3, 1 << 14), (5, 1 << 15))
_LL_SCOPE_SOCKETS, _LL_SCOPE_SIGNALS = 0b01, 0b10  # ABI 6: abstract unix sockets, signals
# Of those, what writing into existing files takes (WRITE_FILE, TRUNCATE, IOCTL_DEV): the rights on the
# devices a worker opens (WORKER_DEVICES), so that no entry of /dev can be removed, renamed over or added
# (a regular file in place of /dev/null would outlive the run); /dev/shm has them all.
_LL_FILE_RIGHTS = (1 << 1) | (1 << 14) | (1 << 15)


class _LandlockRulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _LandlockPathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


# The device files a worker may open for writing (and ioctl): the null devices, random, its terminal, and the
# GPU's (the CUDA driver's /dev/nvidia*). Not the rest of /dev (/dev/kvm, /dev/userfaultfd, disks).
WORKER_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx",
                  "/dev/pts", "/dev/nvidia*")


def worker_devices() -> tuple[str, ...]:
    return tuple(p for pattern in WORKER_DEVICES for p in sorted(glob.glob(pattern)))


def confine_worker(writable: list[str], under_ncu: bool = False, lowest_priority: bool = True,
                   files_only: tuple[str, ...] | None = None) -> list[str]:
    """Run in the worker before it imports torch or the submission; returns what holds, in words.
    writable: folders it may write anything under; files_only: files (or folders of files) it may write
    into, adding, removing and renaming nothing (_LL_FILE_RIGHTS), by default worker_devices().
    under_ncu: the profiler's library in the worker shares a temp folder (TMPDIR, else /tmp: writable too)
    and an abstract socket (not scoped) with the profiler. lowest_priority: nice 19 for good, so that work
    between its calls cannot crowd out the judge or the null while they measure the protocol's overhead."""
    held = []
    if lowest_priority:
        os.setpriority(os.PRIO_PROCESS, 0, 19)
        held.append("nice 19")
        try:  # and no way back, whatever limits the runner grants: no nice under 19, no real-time policy
            import resource

            resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
            resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
        except (ImportError, OSError, ValueError, AttributeError):
            pass
        try:  # its session's scheduling group too (sched_autogroup weighs nice only within a group)
            Path("/proc/self/autogroup").write_text("19")
            held.append("autogroup nice 19")
        except OSError:
            pass
    libc = _libc()
    if libc is None or not sys.platform.startswith("linux"):
        return held + ["no confinement (not Linux)"]
    if _capabilities_effective():
        libc.prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKED_DOWN, 0, 0, 0)
        cap_last = Path("/proc/sys/kernel/cap_last_cap")
        last = int(cap_last.read_text()) if cap_last.exists() else 40
        for cap in range(last + 1):
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        data = (ctypes.c_uint32 * 6)()
        if libc.capset(header, data) != 0 or _capabilities_effective():
            raise RuntimeError(f"could not drop the worker's capabilities: {os.strerror(ctypes.get_errno())}")
        held.append("no capabilities")
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    held.append(_install_syscall_filter(libc))
    abi = libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # landlock_create_ruleset(VERSION)
    if abi < 1:
        held.append("no Landlock on this kernel: the submission's process can write what this user can "
                    "write and signal the judge; the judge checks its own files when the run ends")
        return held
    rights = 0
    for min_abi, bits in _LL_WRITE_RIGHTS:
        rights |= bits if abi >= min_abi else 0
    scope = 0 if abi < 6 else _LL_SCOPE_SIGNALS if under_ncu else _LL_SCOPE_SIGNALS | _LL_SCOPE_SOCKETS
    attr = _LandlockRulesetAttr(rights, 0, scope)
    if under_ncu:
        writable = [*writable, os.environ.get("TMPDIR") or "/tmp"]
    ruleset = libc.syscall(444, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise RuntimeError(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        files_only = worker_devices() if files_only is None else files_only
        for path, allowed in [(p, rights) for p in writable] + [(p, rights & _LL_FILE_RIGHTS) for p in files_only]:
            if not os.path.isdir(path) and (allowed != rights & _LL_FILE_RIGHTS or not os.path.exists(path)):
                continue  # a rule on a file takes file rights only
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _LandlockPathBeneath(allowed, fd)
                if libc.syscall(445, ruleset, 1, ctypes.byref(rule), 0) != 0:
                    raise RuntimeError(f"landlock_add_rule({path}): {os.strerror(ctypes.get_errno())}")
            finally:
                os.close(fd)
        if libc.syscall(446, ruleset, 0) != 0:
            raise RuntimeError(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    signals = (", no signals to it" if abi >= 6 else
               " (this kernel cannot scope signals: the submission can signal the judge)")
    held.append(f"Landlock ABI {abi}: writes only under its sandbox, /dev/shm and its threads' /proc, and into "
                f"the null, random, terminal and GPU devices (adding or removing nothing in /dev), no ptrace or "
                f"/proc access to the judge{signals}"
                + ("; under ncu (POPCORN_NCU) its temp folder is writable too, the profiler's" if under_ncu else ""))
    return held


# seccomp, in the worker and everything it starts (why each call: docs/judge.md, "What the judge
# guarantees"). setsid and setpgid fail, so that the judge's kill of the process group cannot be outrun;
# keyrings and message queues fail (state that outlives the run, and no path Landlock rules); on i386 the
# `ipc` call that multiplexes msgget fails whole. Syscall numbers by audit arch.
_DENIED_CALLS = {  # setsid, setpgid, add_key, request_key, keyctl, msgget, mq_open (i386: and ipc)
    0xC000003E: (112, 109, 248, 249, 250, 68, 240),   # x86_64
    0x40000003: (66, 57, 286, 287, 288, 399, 277, 117),  # i386
    0xC00000B7: (157, 154, 217, 218, 219, 186, 180),  # aarch64
}
# (call, its target argument), refused unless the target is 0, the caller: prlimit64, ioprio_set, setpriority,
# sched_setaffinity, sched_setscheduler, sched_setparam, sched_setattr. The judge runs as the same user.
_SELF_ONLY_CALLS = {
    0xC000003E: ((302, 0), (251, 1), (141, 1), (203, 0), (144, 0), (142, 0), (314, 0)),
    0x40000003: ((340, 0), (289, 1), (97, 1), (241, 0), (156, 0), (154, 0), (351, 0)),
    0xC00000B7: ((261, 0), (30, 1), (140, 1), (122, 0), (119, 0), (118, 0), (274, 0)),
}
# (call, argument, value) refused: IOPRIO_WHO_USER and PRIO_USER, where `who` 0 means the judge's processes too.
_DENIED_WHEN = {
    0xC000003E: ((251, 0, 3), (141, 0, 2)),
    0x40000003: ((289, 0, 3), (97, 0, 2)),
    0xC00000B7: ((30, 0, 3), (140, 0, 2)),
}
_X32_SYSCALL_BIT = 0x40000000
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def worker_syscall_filter() -> bytes:
    """The classic-BPF seccomp program: per known arch, _DENIED_CALLS (and x32 calls) -> EPERM,
    _DENIED_WHEN -> EPERM for that argument's value, and _SELF_ONLY_CALLS -> EPERM unless their target
    argument is 0; the rest allowed; a call of an arch the table does not know kills the process (its
    numbers are another table's, which the filter cannot read)."""
    allow, deny, kill = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x80000000  # SECCOMP_RET_KILL_PROCESS
    # (op, k, jump if true, jump if false): jumps name labels; None is the next instruction
    prog = [("ld", 4, None, None)]  # seccomp_data.arch
    for arch, denied in _DENIED_CALLS.items():
        prog += [("jeq", arch, None, f"after {arch}"), ("ld", 0, None, None)]  # seccomp_data.nr
        if arch == 0xC000003E:
            prog.append(("jge", _X32_SYSCALL_BIT, "deny", None))
        prog += [("jeq", nr, "deny", None) for nr in denied]
        prog += [("jeq", nr, f"{arch} when {nr}", None) for nr, _, _ in _DENIED_WHEN[arch]]
        prog += [("jeq", nr, f"{arch} arg {arg}", None) for nr, arg in _SELF_ONLY_CALLS[arch]]
        prog.append(("ret", allow, None, None))
        self_only = dict(_SELF_ONLY_CALLS[arch])
        for nr, arg, value in _DENIED_WHEN[arch]:  # then on to its self-only check, if it has one
            after = f"{arch} arg {self_only[nr]}" if nr in self_only else "allow"
            prog += [("label", f"{arch} when {nr}", None, None),
                     ("ld", 16 + 8 * arg, None, None),
                     ("jeq", value, "deny", after)]
        for arg in sorted({arg for _, arg in _SELF_ONLY_CALLS[arch]}):
            prog += [("label", f"{arch} arg {arg}", None, None),
                     ("ld", 16 + 8 * arg, None, None),  # seccomp_data.args[arg], low word (a pid_t / int)
                     ("jeq", 0, "allow", "deny")]
        prog.append(("label", f"after {arch}", None, None))
    prog += [("ret", kill, None, None),  # an arch the table does not know (32-bit ARM on an aarch64 kernel)
             ("label", "allow", None, None), ("ret", allow, None, None),
             ("label", "deny", None, None), ("ret", deny, None, None)]
    at, body = {}, []  # a label's index, the instructions
    for op, k, if_true, if_false in prog:
        if op == "label":
            at[k] = len(body)
        else:
            body.append((op, k, if_true, if_false))
    opcodes = {"ld": 0x20, "jeq": 0x15, "jge": 0x35, "ret": 0x06}
    return b"".join(struct.pack("<HBBI", opcodes[op], *(0 if j is None else at[j] - i - 1 for j in (jt, jf)), k)
                    for i, (op, k, jt, jf) in enumerate(body))


def _install_syscall_filter(libc) -> str:
    program = ctypes.create_string_buffer(worker_syscall_filter())
    fprog = _SockFprog(len(program.raw) // 8, ctypes.cast(program, ctypes.c_void_p))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return (f"no seccomp ({os.strerror(ctypes.get_errno())}): a process it starts can leave its process "
                f"group; the judge then finds it in /proc")
    return ("seccomp: it and what it starts stay in its process group, set no other process's limits, "
            "priorities, CPUs or scheduling, and have no keyrings or message queues")


def _capabilities_effective() -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16) != 0
    except OSError:
        pass
    return os.geteuid() == 0


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class CudaDriver:
    """The few driver calls torch does not expose that a worker makes, in torch's (primary) context of this
    thread (the judge's own: judge_timing.JudgeDriver)."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), IpcHandle, ctypes.c_uint]
        self._call("cuInit", ctypes.c_uint(0))

    def _call(self, name, *args):
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(text))
            raise RuntimeError(f"{name}: CUDA error {rc} ({(text.value or b'unknown').decode()})")

    def ipc_open(self, handle: bytes) -> int:
        ptr = ctypes.c_uint64()
        self._call("cuIpcOpenMemHandle_v2", ctypes.byref(ptr), IpcHandle.from_buffer_copy(handle), 1)
        return ptr.value

    def host_register(self, addr: int, nbytes: int) -> int:
        """Pins host memory for the device (portable, mapped); returns its device address."""
        self._call("cuMemHostRegister_v2", ctypes.c_void_p(addr), ctypes.c_size_t(nbytes), ctypes.c_uint(3))
        dev = ctypes.c_uint64()
        self._call("cuMemHostGetDevicePointer_v2", ctypes.byref(dev), ctypes.c_void_p(addr), ctypes.c_uint(0))
        return dev.value

    def function(self, ptx: str, name: str):
        """Entry `name` of a PTX body (one of the _..._PTX below), loaded after the common header."""
        module, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self._call("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p((_PTX_HEADER + ptx).encode()))
        self._call("cuModuleGetFunction", ctypes.byref(fn), module, name.encode())
        return fn

    def launch(self, fn, grid: int, block: int, stream: int, args) -> None:
        params = (ctypes.c_void_p * len(args))(*(ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args))
        self._call("cuLaunchKernel", fn, ctypes.c_uint(grid), ctypes.c_uint(1), ctypes.c_uint(1),
                   ctypes.c_uint(block), ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_uint(0),
                   ctypes.c_void_p(stream), params, None)


class CudaArray:
    """A raw device allocation as __cuda_array_interface__, for torch.as_tensor (no copy)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


# Every PTX module below targets sm_70 and up (the hold, spin and stamp use only %globaltimer,
# relaxed system-scope loads and nanosleep).
_PTX_HEADER = ".version 7.0\n.target sm_70\n.address_size 64\n"

# The hold: a kernel that lets go when the judge writes a release count >= target into host memory. A timed
# call is queued behind two (hold_targets): one filling every SM's thread slots (no kernel of the worker's can
# start beside it while custom_kernel runs on the host), then one block that writes its target to `announce`
# and spins while the judge writes the inputs and flushes L2 (why two: docs/judge.md, "Why two holds").
HOLD_PTX = r"""
.visible .entry eval_hold(.param .u64 flag, .param .u32 target, .param .u64 timeout_ns, .param .u64 announce,
                          .param .u64 let_go_at)
{
    .reg .pred %p<4>;
    .reg .b32 %r<5>;
    .reg .b64 %rd<8>;
    mov.u32 %r0, %tid.x;
    setp.ne.u32 %p0, %r0, 0;
    @%p0 bra DONE;
    ld.param.u64 %rd0, [flag];
    ld.param.u32 %r1, [target];
    ld.param.u64 %rd1, [timeout_ns];
    ld.param.u64 %rd5, [announce];
    setp.eq.u64 %p3, %rd5, 0;
    @!%p3 st.relaxed.sys.global.u32 [%rd5], %r1;
    mov.u64 %rd2, %globaltimer;
    add.u64 %rd3, %rd2, %rd1;
POLL:
    ld.relaxed.sys.global.u32 %r2, [%rd0];
    sub.s32 %r3, %r2, %r1;
    setp.ge.s32 %p1, %r3, 0;
    @%p1 bra LET_GO;
    mov.u64 %rd4, %globaltimer;
    setp.gt.u64 %p2, %rd4, %rd3;
    @%p2 bra LET_GO;
    nanosleep.u32 200;
    bra POLL;
LET_GO:
    ld.param.u64 %rd6, [let_go_at];
    setp.eq.u64 %p3, %rd6, 0;
    mov.u64 %rd7, %globaltimer;
    @!%p3 st.relaxed.sys.global.u64 [%rd6], %rd7;
DONE:
    bar.sync 0;
    ret;
}
"""


# Byte offsets in the release page: the release count the holds poll; the one-block hold's announcement; the
# GPU time it let go (TimedCall.parts: the worker's word, shown, never ranked); the worker's signal that a
# call's output is staged (the call's number) and, written before it, the output's digest (16 bytes).
RELEASE_AT, ANNOUNCE_AT, LET_GO_AT, STAGED_AT, DIGEST_AT = 0, 8, 16, 24, 32
ONE_BLOCK_HOLD = (1, 32)  # (blocks, threads a block) of the hold the judge's work takes the SMs from


def hold_targets(seq: int) -> tuple[int, int]:
    """Release counts of timed call seq: the full-SM hold lets go at the first, the one-block hold at the second."""
    return 2 * seq - 1, 2 * seq


def hold_grid(torch) -> tuple[int, int]:
    """(blocks, threads a block) of the full hold: every SM's thread slots, so no kernel of the worker's fits beside."""
    props = torch.cuda.get_device_properties(0)
    per_sm = getattr(props, "max_threads_per_multi_processor", 2048)
    blocks_per_sm = -(-per_sm // 1024)
    return props.multi_processor_count * blocks_per_sm, per_sm // blocks_per_sm


# The null submission's stand-in for a call's work: one thread that spins for a given time, so that the
# null protocol keeps the GPU (and the judge, waiting) busy as long as the measured call did.
_SPIN_PTX = r"""
.visible .entry eval_spin(.param .u64 duration_ns)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd0, [duration_ns];
    mov.u64 %rd1, %globaltimer;
    add.u64 %rd2, %rd1, %rd0;
SPIN:
    mov.u64 %rd3, %globaltimer;
    setp.lt.u64 %p0, %rd3, %rd2;
    @%p0 bra SPIN;
    ret;
}
"""


# The worker's signal that a timed call's output is staged: one thread copies the output's digest (two device
# int64, output_digest) into the release page and then, once that is visible to the host, the call's number.
# The judge's host acts on the first sighting of the number and holds the call to the digest it read then.
_SIGNAL_PTX = r"""
.visible .entry eval_signal(.param .u64 digest, .param .u64 digest_at, .param .u64 staged_at, .param .u32 seq)
{
    .reg .b32 %r<1>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd0, [digest];
    ld.param.u64 %rd1, [digest_at];
    ld.param.u64 %rd2, [staged_at];
    ld.param.u32 %r0, [seq];
    ld.global.u64 %rd3, [%rd0];
    ld.global.u64 %rd4, [%rd0+8];
    st.relaxed.sys.global.u64 [%rd1], %rd3;
    st.relaxed.sys.global.u64 [%rd1+8], %rd4;
    membar.sys;
    st.relaxed.sys.global.u32 [%rd2], %r0;
    ret;
}
"""


# The output's digest binds the signal to the output (a worker that signals early must name the digest of
# bytes it does not have): a keyed Merkle tree over the output's 64-bit words, DIGEST_BLOCK words a node,
# two lanes under two keys the judge draws per call (why not a sum: docs/judge.md, "What the worker holds
# of the judge's"). The worker computes it with Triton (WorkerDigest), the judge with torch ops
# (judge_timing.output_digest); tests check the two agree.
DIGEST_BLOCK = 1024
DIGEST_LEVELS = DIGEST_BLOCK.bit_length() - 1
DIGEST_WARPS = 4


def digest_words(torch, flat):
    """A result region's bytes (a uint8 tensor) as 64-bit words, zero-padded to whole words."""
    if flat.numel() % 8:
        padded = torch.zeros(flat.numel() + 8 - flat.numel() % 8, dtype=torch.uint8, device=flat.device)
        padded[:flat.numel()] = flat
        flat = padded
    return flat.view(torch.int64)


# Triton's language, once WorkerDigest has imported it; until then a stand-in for the kernel's annotations.
tl = types.SimpleNamespace(constexpr="tl.constexpr")


def _mix_words(x):
    """judge_timing's mix on uint64 words (digest_kernel makes it the Triton helper _mix)."""
    x = x ^ (x >> 32)
    x = x * 0xBF58476D1CE4E5B9
    return x ^ (x >> 29)


_mix = _mix_words  # until digest_kernel


def _digest_kernel(src, dst, key, n, lane_stride, BLOCK: tl.constexpr, LEVELS: tl.constexpr):
    """One pass of judge_timing.output_digest as a Triton kernel (digest_kernel makes it one): program
    (block, lane) maps words [block * BLOCK, (block + 1) * BLOCK) of its lane's row of src (rows lane_stride
    apart: 0 on the first pass, where both lanes read the output) to dst[lane, block]."""
    block, lane = tl.program_id(0), tl.program_id(1)
    k = tl.load(key + lane).to(tl.uint64, bitcast=True)
    offs = block * BLOCK + tl.arange(0, BLOCK)
    x = _mix(tl.load(src + lane * lane_stride + offs, mask=offs < n, other=0).to(tl.uint64, bitcast=True) ^ k)
    for level in tl.static_range(LEVELS):
        a, b = tl.split(tl.reshape(x, (BLOCK >> (level + 1), 2)))
        x = _mix(a + _mix(b ^ k)) ^ a ^ b
    tl.store(dst + lane * tl.num_programs(0) + block + tl.arange(0, 1), x.to(tl.int64, bitcast=True))


def digest_kernel():
    """_digest_kernel made a Triton kernel, its sizes not specialised on (no call recompiles it)."""
    import triton
    import triton.language

    globals()["tl"] = triton.language  # the names _digest_kernel's body uses
    globals()["_mix"] = triton.jit(_mix_words)
    return triton.jit(_digest_kernel, do_not_specialize=["n", "lane_stride"])


class WorkerDigest:
    """judge_timing.output_digest on the worker's stream, for its signal: a few launches of one Triton kernel,
    where the judge's torch ops take hundreds. device: the GPU's ("cpu" under Triton's interpreter, for tests)."""

    def __init__(self, torch, device: str = "cuda"):
        self.torch = torch
        self.kernel = digest_kernel()
        self.key = torch.zeros(2, dtype=torch.int64, device=device)

    def load_key(self, key: list[int]) -> None:
        """The next digests' key, copied to the GPU now (before a call's holds, so the copy is off the clock)."""
        self.key.copy_(self.torch.tensor(key, dtype=self.torch.int64))

    def __call__(self, flat):
        """Queues the digest of flat (a uint8 tensor) under the loaded key; returns its (2,) int64 tensor."""
        torch = self.torch
        x, stride = digest_words(torch, flat), 0
        while True:
            n = x.numel() if stride == 0 else x.shape[1]
            blocks = max(1, -(-n // DIGEST_BLOCK))
            out = torch.empty((2, blocks), dtype=torch.int64, device=flat.device)
            self.kernel[(blocks, 2)](x, out, self.key, n, stride, BLOCK=DIGEST_BLOCK, LEVELS=DIGEST_LEVELS,
                                     num_warps=DIGEST_WARPS)
            if blocks == 1:
                return out.view(2)
            x, stride = out, blocks


@functools.cache
def _dtypes() -> dict:
    """torch's dtypes by name ("torch.bfloat16"): how dtypes cross between the processes."""
    import torch

    return {str(v): v for v in vars(torch).values() if isinstance(v, torch.dtype)}


def open_region(handle, driver, sandbox: Path, fd: int | None = None):
    """The worker's view of a SharedRegion: (uint8 tensor, object that keeps the mapping alive). fd: the
    memfd of a "memfd" region, received over the socket."""
    import torch

    kind, ref, nbytes = handle
    if kind == "cuda":
        return torch.as_tensor(CudaArray(driver.ipc_open(ref), nbytes)), None
    if kind == "memfd":
        m = mmap.mmap(fd, nbytes)
        return torch.frombuffer(m, dtype=torch.uint8), m
    f = open(sandbox / ref, "r+b")
    m = mmap.mmap(f.fileno(), nbytes)
    return torch.frombuffer(m, dtype=torch.uint8), (f, m)


def arena_view(arena, spec):
    offset, dtype, shape, stride = spec
    dt = _dtypes()[dtype] if isinstance(dtype, str) else dtype
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
    flat = arena[offset:offset + span * dt.itemsize].view(dt)
    return flat.as_strided(shape, stride)


def build_input(structure, views):
    kind, body = structure
    if kind == "tensor":
        return views[body]
    if kind in ("tuple", "list"):
        items = [build_input(s, views) for s in body]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return {k: build_input(s, views) for k, s in body}
    return body


_FRAME = struct.Struct("<I")


def send_frame(sock, payload: bytes) -> None:
    sock.sendall(_FRAME.pack(len(payload)) + payload)


def recv_exact(sock, n: int, deadline: float | None = None) -> bytes:
    """n bytes from sock. deadline (time.monotonic()): socket.timeout once it has passed, however the bytes
    arrive (a timeout per recv would restart with every byte a sender drips)."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("deadline passed in the middle of a message")
            sock.settimeout(left)
        chunk = sock.recv(n - got)
        if not chunk:
            raise EOFError("the other side closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_frame(sock, limit: int, deadline: float | None = None) -> bytes:
    (n,) = _FRAME.unpack(recv_exact(sock, _FRAME.size, deadline))
    if n > limit:
        raise ValueError(f"a message of {n} bytes (limit {limit})")
    return recv_exact(sock, n, deadline)


class WorkerSession:
    def __init__(self, sock, flag_fd: int, role: str, under_ncu: bool = False):
        self.sock, self.flag_fd, self.role, self.under_ncu = sock, flag_fd, role, under_ncu
        self.cuda = False
        self.kernel_fn = None
        self.seq, self.mimic_ns, self.null_early = 0, 0, False
        self.regions = {}
        self.data = self.result = None
        self.null_form = None
        self.ticket = None  # the judge's last request's, echoed in every answer

    def send(self, **msg) -> None:
        send_frame(self.sock, json.dumps({**msg, "ticket": self.ticket}).encode())

    def serve(self) -> None:
        while True:
            if self.cuda:  # poll before sleeping (POLL_S)
                poll_until = time.monotonic() + POLL_S
                while time.monotonic() < poll_until and not select.select([self.sock], [], [], 0)[0]:
                    pass
            try:
                msg = pickle.loads(recv_frame(self.sock, 1 << 30))
            except EOFError:
                return
            self.ticket = msg.pop("ticket", None)
            try:
                getattr(self, "op_" + msg.pop("op"))(**msg)
            except BaseException as e:
                self.send(kind="error", message=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-8)}")

    def setup(self) -> None:
        """Confinement first, before any code but this file's runs; then torch and the device."""
        self.sandbox = Path.cwd()
        # /proc/self/task: the CUDA driver names its threads there. Not the rest of /proc/self: its autogroup
        # file would let it raise its scheduling group's priority back from nice 19.
        confinement = confine_worker([str(self.sandbox), "/dev/shm", os.path.realpath("/proc/self/task")],
                                     under_ncu=self.under_ncu, lowest_priority=self.role != "null")
        import torch  # before the sandbox is on sys.path: no module an earlier worker left there runs in set-up

        self.torch, self.cuda = torch, torch.cuda.is_available()
        if self.cuda:
            torch.cuda.init()
            torch.empty(1, device="cuda")  # the primary context, current on this thread
            self.driver = CudaDriver()
            self.flag = mmap.mmap(self.flag_fd, 4096)
            flag_addr = ctypes.addressof(ctypes.c_char.from_buffer(self.flag))
            self.flag_dev = self.driver.host_register(flag_addr, 4096)
            self.hold_fn = self.driver.function(HOLD_PTX, "eval_hold")
            self.spin_fn = self.driver.function(_SPIN_PTX, "eval_spin")
            self.signal_fn = self.driver.function(_SIGNAL_PTX, "eval_signal")
            self.digest = WorkerDigest(torch)
            self.digest(torch.zeros(8 * DIGEST_BLOCK + 1, dtype=torch.uint8, device="cuda"))  # compiled here
            self.hold_shape = hold_grid(torch)
            self.start_event = torch.cuda.Event(enable_timing=True)
            self.end_event = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
        else:
            self.driver = None
        # the submission's imports come from the sandbox (started with -P, Python put no folder first)
        if getattr(sys.flags, "safe_path", False):
            sys.path.insert(0, str(self.sandbox))
        else:
            sys.path[0] = str(self.sandbox)
        self.send(kind="ready", confinement=confinement, cuda=self.cuda)

    def kernel(self):
        if self.role == "null":
            return self._null_kernel
        if self.kernel_fn is None:
            import importlib.util

            path = self.sandbox / (OTHER_SUBMISSION if self.role == "other" else "submission.py")
            spec = importlib.util.spec_from_file_location("submission", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules["submission"] = module
            spec.loader.exec_module(module)
            if not callable(getattr(module, "custom_kernel", None)):
                raise AttributeError("the submission defines no function custom_kernel(data)")
            self.kernel_fn = module.custom_kernel
        return self.kernel_fn

    def op_map(self, arena, result, layout, form):
        memfds = [h for h in (arena, result) if h[0] == "memfd"]
        fds = socket.recv_fds(self.sock, 1, len(memfds))[1] if memfds else []  # sent right after this message
        self.data = self.result = None  # the views of regions the judge has replaced go with them
        self.regions = {h: r for h, r in self.regions.items() if h in (arena, result)}
        try:
            for handle in (arena, result):
                if handle not in self.regions:
                    fd = fds[memfds.index(handle)] if handle in memfds else None
                    self.regions[handle] = open_region(handle, self.driver, self.sandbox, fd)
        finally:
            for fd in fds:
                os.close(fd)
        structure, specs = layout
        views = [arena_view(self.regions[arena][0], spec) for spec in specs]
        self.data = build_input(structure, views)
        self.result = self.regions[result][0]
        self.null_form = form
        self.send(kind="mapped")

    def _null_kernel(self, data):
        """An empty output of the right form, after as long as the call being calibrated took: on the GPU
        a spin kernel of that length, on the CPU a busy wait. For a call that was released before it
        returned, the null first waits on the host for its release, as such a call does."""
        shape, dtype, device = self.null_form
        if self.null_early:
            give_up = time.monotonic() + HOLD_TIMEOUT_NS / 1e9
            released = hold_targets(self.seq)[1]
            while struct.unpack_from("<i", self.flag, RELEASE_AT)[0] - released < 0 and time.monotonic() < give_up:
                pass
        if self.mimic_ns > 0:
            if self.cuda:
                self.driver.launch(self.spin_fn, 1, 1, self.torch.cuda.current_stream().cuda_stream,
                                   [ctypes.c_uint64(int(self.mimic_ns))])
            else:
                end = time.perf_counter_ns() + self.mimic_ns
                while time.perf_counter_ns() < end:
                    pass
        return self.torch.empty(shape, dtype=_dtypes()[dtype], device=device)

    def _stage(self, out) -> dict:
        """Copies the output's bytes into the result region (on the current stream): what the judge
        checks is those bytes, whatever object the submission returned."""
        torch = self.torch
        if not isinstance(out, torch.Tensor):
            return {"tensor": False, "type": type(out).__name__}
        with torch._C.DisableTorchFunctionSubclass():
            t = torch.Tensor.as_subclass(out, torch.Tensor).detach()
            nbytes = t.numel() * t.element_size()
            meta = {"tensor": True, "dtype": str(t.dtype), "shape": list(t.shape), "device": t.device.type,
                    "nbytes": nbytes, "copied": nbytes == self.result.numel()}
            if meta["copied"] and nbytes:
                self.result.copy_(t.contiguous().reshape(-1).view(torch.uint8))
            self._staged = t
        return meta

    def op_call(self):
        """One untimed call; `changed` says whether the output still changed after the call returned."""
        out = self.kernel()(self.data)
        meta = self._stage(out)
        if self.cuda:
            self.torch.cuda.synchronize()
        changed = False
        if meta.get("copied") and meta["nbytes"]:
            now = self._staged.contiguous().reshape(-1).view(self.torch.uint8)
            changed = not self.torch.equal(now.to(self.result.device), self.result)
        self.send(kind="done", output=meta, changed=changed)

    def op_timed(self, seq: int, key: list, mimic_ns: float = 0, early: bool = False):
        """One timed call; key, the digest's for this call's signal (WorkerDigest)."""
        self.seq, self.mimic_ns, self.null_early = seq, mimic_ns, early
        gc.disable()
        try:
            if self.cuda:
                self.digest.load_key(key)
            (self._timed_gpu if self.cuda else self._timed_cpu)(seq)
        finally:
            gc.enable()

    def _timed_gpu(self, seq: int):
        torch = self.torch
        torch.cuda.synchronize()
        stream = torch.cuda.current_stream()
        full, one_block = hold_targets(seq)
        for shape, target, announce, let_go in ((self.hold_shape, full, 0, 0),
                                                (ONE_BLOCK_HOLD, one_block, self.flag_dev + ANNOUNCE_AT,
                                                 self.flag_dev + LET_GO_AT)):
            self.driver.launch(self.hold_fn, *shape, stream.cuda_stream,
                               [ctypes.c_uint64(self.flag_dev + RELEASE_AT), ctypes.c_uint32(target),
                                ctypes.c_uint64(HOLD_TIMEOUT_NS), ctypes.c_uint64(announce), ctypes.c_uint64(let_go)])
        self.start_event.record(stream)
        t0 = time.perf_counter_ns()
        out = self.kernel()(self.data)
        t1 = time.perf_counter_ns()
        self.end_event.record(stream)
        meta = self._stage(out)
        self._signal_staged(seq, stream)
        self.send(kind="enqueued", host_ns=t1 - t0)
        self.end_event.synchronize()
        device_ns = self.start_event.elapsed_time(self.end_event) * 1e6
        torch.cuda.synchronize()
        self.send(kind="done", device_ns=device_ns, output=meta)

    def _signal_staged(self, seq: int, stream) -> None:
        """Behind the staged output on the stream: its digest, then the call's number, into the release page."""
        self._digest = self.digest(self.result)  # kept until the next call: the kernel reads it
        self.driver.launch(self.signal_fn, 1, 1, stream.cuda_stream,
                           [ctypes.c_uint64(self._digest.data_ptr()), ctypes.c_uint64(self.flag_dev + DIGEST_AT),
                            ctypes.c_uint64(self.flag_dev + STAGED_AT), ctypes.c_uint32(seq)])

    def _timed_cpu(self, seq: int):
        t0 = time.perf_counter_ns()
        out = self.kernel()(self.data)
        t1 = time.perf_counter_ns()
        meta = self._stage(out)
        self.send(kind="done", device_ns=float(t1 - t0), output=meta)

    def op_profile(self):
        """One call after a warm-up one (compilation stays out of the profile). Under ncu, the call inside an
        NVTX range named custom_kernel (what kernelbot's `ncu --nvtx-include custom_kernel/` captures);
        otherwise torch.profiler's table of it."""
        from torch.profiler import ProfilerActivity, profile

        torch, kernel = self.torch, self.kernel()
        kernel(self.data)
        if self.cuda:
            torch.cuda.synchronize()
        if self.under_ncu and self.cuda:
            torch.cuda.nvtx.range_push("custom_kernel")
            kernel(self.data)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
            self.send(kind="profile", table="(profiled by ncu: the kernels of the NVTX range custom_kernel)")
            return
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        with profile(activities=activities) as prof:
            kernel(self.data)
            if self.cuda:
                torch.cuda.synchronize()
        sort = "self_cuda_time_total" if self.cuda else "self_cpu_time_total"
        self.send(kind="profile", table=prof.key_averages().table(sort_by=sort, row_limit=20))


def worker_main(argv: list[str]) -> int:
    """judge_worker.py --worker SOCKET_FD FLAG_FD ROLE [ncu], started by the judge in its sandbox."""
    sock_fd, flag_fd, role = int(argv[0]), int(argv[1]), argv[2]
    session = WorkerSession(socket.socket(fileno=sock_fd), flag_fd, role, under_ncu=argv[3:4] == ["ncu"])
    try:
        session.setup()
    except BaseException as e:
        session.send(kind="error", message=f"worker start-up failed: {type(e).__name__}: {e}\n"
                                           f"{traceback.format_exc(limit=-4)}")
        return 1
    session.serve()
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[2:]))
