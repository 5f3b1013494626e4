"""Hostile: shuts its connection to the judge (the judge reads end of file, as from a worker that died)
and lives on. The case fails as the submission's, saying so; the judge ends the worker and starts a new
one for the next case (which does the same)."""
import socket
import sys
import time


def custom_kernel(data):
    sock = socket.fromfd(int(sys.argv[2]), socket.AF_UNIX, socket.SOCK_STREAM)  # the worker's: `--worker FD ...`
    sock.shutdown(socket.SHUT_RDWR)
    time.sleep(3600)
