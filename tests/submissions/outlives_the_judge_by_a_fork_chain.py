"""Hostile: starts a fork chain (each member tries to leave the worker's session, forks, and exits at
once), so that no pid lives long enough for a search of /proc to find and kill it. A member that finds
the judge gone writes "survived" to $CHAIN_LOG; the chain gives up after 30 s. Answers right. The judge
kills the worker's process group, which its members cannot leave (seccomp) and which forking cannot
outrun."""
import os
import subprocess
import sys

from reference import ref_kernel

CHAIN = r'''
import os, sys, time
judge, log, end = int(sys.argv[1]), sys.argv[2], time.time() + 30
with open(log, "a") as f:
    f.write(f"started {os.getpid()}\n")
while time.time() < end:
    if not os.path.exists(f"/proc/{judge}"):
        with open(log, "a") as f:
            f.write(f"survived {os.getpid()}\n")
        os._exit(0)
    try:
        os.setsid()
    except OSError:
        pass
    if os.fork():
        os._exit(0)
'''
_started = []


def custom_kernel(data):
    if not _started:
        _started.append(1)
        subprocess.Popen([sys.executable, "-S", "-c", CHAIN, str(os.getppid()), os.environ["CHAIN_LOG"]],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return ref_kernel(data)
