"""Hostile (CPU path): slows time.perf_counter_ns and time.perf_counter to 1 % of real time, so that the
worker's own timing reports a hundredth of each call."""
import time

from reference import ref_kernel

_ns, _s = time.perf_counter_ns, time.perf_counter
time.perf_counter_ns = lambda: _ns() // 100
time.perf_counter = lambda: _s() / 100


def custom_kernel(data):
    time.sleep(0.03)  # a call long enough for the CPU path's 2 ms margin
    return ref_kernel(data)
