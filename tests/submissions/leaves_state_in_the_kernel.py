"""Hostile: state that outlives every process of a run and is no path (so Landlock does not rule it): a key
in the user's kernel keyring, a SysV message queue, a POSIX message queue. As it is imported, tries to
leave one of each for a later run and prints what it could (and removes it again); its answers are the
reference's."""
import ctypes
import os
import platform

from reference import ref_kernel

# add_key, keyctl, msgget, msgctl, mq_open, mq_unlink
_CALLS = {"x86_64": (248, 250, 68, 71, 240, 241), "aarch64": (217, 219, 186, 187, 180, 181)}.get(platform.machine())
KEY_SPEC_USER_KEYRING, KEYCTL_UNLINK, IPC_CREAT, IPC_RMID = -4, 9, 0o1000, 0


def _attack():
    if _CALLS is None:
        print(f"skipped: no syscall numbers for {platform.machine()}", flush=True)
        return
    add_key, keyctl, msgget, msgctl, mq_open, mq_unlink = _CALLS
    libc = ctypes.CDLL(None, use_errno=True)
    payload = b"left by an earlier run"
    key = libc.syscall(add_key, b"user", b"eval-hostile-leftover", payload, ctypes.c_size_t(len(payload)),
                       ctypes.c_int(KEY_SPEC_USER_KEYRING))
    if key >= 0:
        print("LEAK: left a key in the user keyring", flush=True)
        libc.syscall(keyctl, KEYCTL_UNLINK, key, ctypes.c_int(KEY_SPEC_USER_KEYRING))
    else:
        print(f"refused: a key in the user keyring ({os.strerror(ctypes.get_errno())})", flush=True)
    queue = libc.syscall(msgget, 0x52ED7EA2, IPC_CREAT | 0o600)
    if queue >= 0:
        print("LEAK: made a SysV message queue", flush=True)
        libc.syscall(msgctl, queue, IPC_RMID, None)
    else:
        print(f"refused: a SysV message queue ({os.strerror(ctypes.get_errno())})", flush=True)
    mq = libc.syscall(mq_open, b"eval-hostile-leftover", os.O_CREAT | os.O_RDWR, 0o600, None)
    if mq >= 0:
        print("LEAK: made a POSIX message queue", flush=True)
        os.close(mq)
        libc.syscall(mq_unlink, b"eval-hostile-leftover")
    else:
        print(f"refused: a POSIX message queue ({os.strerror(ctypes.get_errno())})", flush=True)


_attack()


def custom_kernel(data):
    return ref_kernel(data)
