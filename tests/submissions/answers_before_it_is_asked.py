"""Hostile (CPU): answers a timed call before it is made. After its first timed call it no longer calls
anything: each call's "done" is sent during the call before, so the judge reads it the moment it makes
the call, and its clock stops before the call has begun. A thread keeps writing the first output's bytes
into the result region, so that what the judge copies right after the early answer is a right output
(benchmark mode times one input). Every answer must carry the ticket of the request it answers, which a
worker cannot know before the request arrives."""
import sys
import threading

from reference import ref_kernel

_session = sys.modules["__main__"].WorkerSession
_first = {}


def _keep_writing(result, good):
    while True:
        result.copy_(good)


def _timed_cpu(self, seq):
    if not _first:
        _first["output"] = self._stage(ref_kernel(self.data))
        threading.Thread(target=_keep_writing, args=(self.result, self.result.clone()), daemon=True).start()
        self.send(kind="done", device_ns=1.0, output=_first["output"])  # this call's answer
    self.send(kind="done", device_ns=1.0, output=_first["output"])  # the next call's, ahead of it


_session._timed_cpu = _timed_cpu


def custom_kernel(data):
    return ref_kernel(data)
