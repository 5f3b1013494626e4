"""The copy-engine head start (docs/judge.md), as a submission to compare against the shipped one:

    python eval.py compare submission.py tools/copy_engine_prefetch.py CASES_FILE

It makes A's call (compare puts A beside this file in the worker's directory, as submission.py), then a host
thread watches the inputs with small device-to-host copies on a side stream (a copy engine) and, the
moment the judge has written the real ones, queues a device-to-device copy of the fp8 cache (a copy
engine again), which runs beside the judge's flush and leaves part of the cache in L2 at the release.
A/B above 1 is the head start. GPU only; either kit."""
import importlib.util
import os
import threading

import torch

# A, loaded by path: this module itself is the one imported as `submission` in B's worker.
_spec = importlib.util.spec_from_file_location(
    "shipped_submission", os.path.join(os.path.dirname(os.path.abspath(__file__)), "submission.py"))
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
_shipped = _module.custom_kernel

_state = {"thread": None, "side": None, "copy": None, "probe": None}


def _cache(data):
    fp8 = data[1]["fp8"]
    return (fp8[0] if isinstance(fp8, (tuple, list)) else fp8).view(-1)  # MLA: (values, scale); paged: bytes


def _watch(cache, poison):
    side, probe = _state["side"], _state["probe"]
    with torch.cuda.stream(side):
        for _ in range(20000):
            probe.copy_(cache[:64].view(torch.uint8), non_blocking=True)
            side.synchronize()
            if not torch.equal(probe, poison):  # the judge has written this call's inputs
                _state["copy"].copy_(cache, non_blocking=True)
                return


def custom_kernel(data):
    if _state["thread"] is not None:
        _state["thread"].join()
    out = _shipped(data)
    if not out.is_cuda:  # no copy engines to race
        return out
    cache = _cache(data)
    if _state["copy"] is None or _state["copy"].shape != cache.shape or _state["copy"].dtype != cache.dtype:
        _state["side"] = torch.cuda.Stream()
        _state["copy"] = torch.empty_like(cache)
        _state["probe"] = torch.empty(64, dtype=torch.uint8).pin_memory()
    with torch.cuda.stream(_state["side"]):  # what the inputs hold now: the judge's poison
        _state["probe"].copy_(cache[:64].view(torch.uint8), non_blocking=True)
    _state["side"].synchronize()
    poison = _state["probe"].clone()
    _state["thread"] = threading.Thread(target=_watch, args=(cache, poison), daemon=True)
    _state["thread"].start()
    return out
