"""For hostile submissions that need the judge to start a second worker with no case failing: arm() makes
the first worker exit right after its first reply of kind "done" (a call answered), and the judge starts
a fresh worker for the next case. arm() returns True in the first worker, False in later ones."""
import os
import sys
from pathlib import Path

_EXITED = Path.cwd() / "first-worker-exited"


def arm() -> bool:
    if _EXITED.exists():
        return False
    session = sys.modules["__main__"].WorkerSession
    send = session.send

    def send_then_exit(self, **msg):
        send(self, **msg)
        if msg.get("kind") == "done":
            _EXITED.write_text("")
            os._exit(0)

    session.send = send_then_exit
    return True
