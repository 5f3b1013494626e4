"""Hostile: in its first call, sends the judge the header of a 1000-byte message on the worker's socket,
then one byte every half second. A timeout applied to each read of the socket would restart with every
byte, and the judge would wait past the time limit; the judge holds the whole message to its deadline."""
import gc
import os
import struct
import time


def _session():
    for o in gc.get_objects():
        if type(o).__name__ == "WorkerSession":
            return o


def custom_kernel(data):
    sock = _session().sock
    try:
        sock.sendall(struct.pack("<I", 1000))
        while True:
            time.sleep(0.5)
            sock.sendall(b" ")
    except OSError:  # the judge has given up on this worker
        os._exit(0)
