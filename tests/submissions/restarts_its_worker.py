"""For hostile submissions that need the judge to start a second worker: arm() makes the first worker exit
as soon as it is asked for its next call (the judge fails that case, in which the worker died, and starts
a fresh worker for the case after it). Exiting at a request rather than after an answer leaves no race
with the judge's next request. arm() returns True in the first worker, False in later ones."""
import os
import sys
from pathlib import Path

_EXITED = Path.cwd() / "first-worker-exited"


def arm() -> bool:
    if _EXITED.exists():
        return False
    session = sys.modules["__main__"].WorkerSession

    def exit_instead(self, *args, **kwargs):
        _EXITED.write_text("")
        os._exit(0)

    session.op_call = session.op_timed = exit_instead
    return True
