"""Hostile: its worker describes each output in a message the judge cannot use: a dtype that is a list
(unhashable where the judge looks it up), and, on a batch of 3, an output description nested 900 lists
deep (deeper than a recursive walk can go). Each must fail its case as the submission's malformed
message, not as a failure of the judge's own (with the judge's traceback printed)."""
import sys

from reference import ref_kernel

_session = sys.modules["__main__"].WorkerSession
_send = _session.send


def _send_malformed(self, **msg):
    if msg.get("kind") == "done" and isinstance(msg.get("output"), dict):
        if msg["output"].get("shape", [0])[0] == 3 * 2:  # batch 3, 2 query rows each
            nested = []
            for _ in range(900):
                nested = [nested]
            msg["output"] = nested
        else:
            msg["output"]["dtype"] = ["torch.bfloat16"]
    _send(self, **msg)


_session.send = _send_malformed


def custom_kernel(data):
    return ref_kernel(data)
