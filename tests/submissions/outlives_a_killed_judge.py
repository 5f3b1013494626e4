"""Hostile: in its first call, starts a child, prints both pids and its sandbox, and waits forever. A
runner that kills the judge past its time limit (SIGKILL: no clean-up of its own) would leave the worker
and its child running, in their session of their own; the judge's warden kills them and removes the
sandboxes."""
import os
import subprocess
import sys
import time


def custom_kernel(data):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    print(f"pids {os.getpid()} {child.pid} {os.getcwd()}", flush=True)
    time.sleep(3600)
