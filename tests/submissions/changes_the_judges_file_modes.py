"""Hostile: answers right, and changes the metadata of a file of the judge's that it cannot write (the
file HOSTILE_TARGET names, from the runner's environment): its mode, times and an extended attribute.
Landlock rules writes, not metadata; the judge compares its files' metadata too, and the run fails."""
import os

from reference import ref_kernel


def custom_kernel(data):
    target = os.environ["HOSTILE_TARGET"]
    os.chmod(target, 0o600)
    os.utime(target, (1e9, 1e9))
    try:
        os.setxattr(target, "user.hostile", b"planted")
    except OSError:  # a file system without user xattrs
        pass
    return ref_kernel(data)
