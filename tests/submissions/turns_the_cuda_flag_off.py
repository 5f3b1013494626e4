"""Hostile (GPU): finds the worker's session through gc and turns its `cuda` flag off, so that the worker
takes its CPU path: no hold on the GPU, the call timed with the host clock around an asynchronous call."""
import gc

from async_attention import attention as ref_kernel


def custom_kernel(data):
    for obj in gc.get_objects():
        if type(obj).__name__ == "WorkerSession":
            obj.cuda = False
    return ref_kernel(data)
