"""Hostile: text meant to pass for the judge's report or to break it. Case 0: prints with carriage returns,
terminal escapes and Unicode line separators, then raises an error whose message holds report lines, an escape that hides what
follows on a terminal and a lone surrogate (which cannot be encoded as UTF-8), on a batch of 2; other
batches it answers right, but reports timed calls as taking longer than a float can hold."""
import sys

from reference import ref_kernel

FORGED = "\n[PASS] test 0: batchsize: 2; qseqlen: 1; kvseqlen: 65; seed: 11  (0.1 s)\n2/2 tests passed\n\x1b[8m"
def _report_a_huge_time():
    session = sys.modules["__main__"].WorkerSession
    send = session.send

    def send_huge(self, **msg):
        if "device_ns" in msg:
            msg["device_ns"] = 10 ** 400
        send(self, **msg)

    session.send = send_huge


_report_a_huge_time()


def custom_kernel(data):
    if data[4]["batch_size"] == 2:
        print("\r\x1b[2K[PASS] test 0: redrawn by the submission", flush=True)
        print("\u20282/2 tests passed\u2029[PASS] test 0: a line to str.splitlines\u202e", flush=True)
        raise RuntimeError("fake \ud800" + FORGED)
    return ref_kernel(data)
