"""Hostile: wraps the worker's message sender (found through sys.modules) so that every reported time is
a hundredth of the measured one."""
import sys
import time

from reference import ref_kernel


def _patch(cls):
    original = cls.send

    def send(self, **msg):
        for key in ("device_ns", "host_ns"):
            if isinstance(msg.get(key), (int, float)):
                msg[key] = msg[key] / 100
        return original(self, **msg)

    cls.send = send


for module in list(sys.modules.values()):
    cls = getattr(module, "__dict__", {}).get("WorkerSession")
    if isinstance(cls, type) and not getattr(cls, "_patched", False):
        _patch(cls)
        cls._patched = True


def custom_kernel(data):
    time.sleep(0.03)  # a call long enough for the CPU path's 2 ms margin
    return ref_kernel(data)
