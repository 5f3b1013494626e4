"""Hostile: /dev is writable for the worker (the CUDA driver writes its device nodes), and a worker of the
same user as /dev's owner could add, remove or rename over its entries (a regular file in place of
/dev/null outlives the run). Tries to add a file and a FIFO to /dev (what replacing an entry takes), and
to open devices no submission needs (/dev/kvm, /dev/userfaultfd: a hypervisor, page-fault handling), and
prints what it could (and removes what it added); then writes /dev/null and makes a file in /dev/shm, which
it still may. Its answers are the reference's."""
import os

from reference import ref_kernel

_tried = []


def _attack():
    for what, make in (("a file", lambda p: open(p, "w").close()), ("a FIFO", os.mkfifo)):
        path = f"/dev/eval-hostile-{os.getpid()}"
        try:
            make(path)
            print(f"LEAK: added {what} to /dev", flush=True)
            os.unlink(path)
        except OSError as e:
            print(f"refused: {what} in /dev ({e.strerror})", flush=True)
    for device in ("/dev/kvm", "/dev/userfaultfd"):
        if os.path.exists(device):
            try:
                os.close(os.open(device, os.O_RDWR))
                print(f"LEAK: opened {device} to write", flush=True)
            except OSError as e:
                print(f"refused: opening {device} ({e.strerror})", flush=True)
    with open("/dev/null", "w") as f:
        f.write("still writable\n")
    if os.path.isdir("/dev/shm"):
        path = f"/dev/shm/eval-hostile-{os.getpid()}"
        with open(path, "w") as f:
            f.write("shared memory\n")
        os.unlink(path)
        print("wrote /dev/null and /dev/shm", flush=True)


def custom_kernel(data):
    if not _tried:
        _tried.append(True)
        _attack()
    return ref_kernel(data)
