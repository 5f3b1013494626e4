"""Hostile: answers right, and changes the metadata of a file of the judge's that it cannot write (the
file HOSTILE_TARGET names, from the runner's environment): its mode, times and an extended attribute,
then puts the mode and times back. Landlock rules writes, not metadata; the judge compares its files'
metadata too, the kernel's change time among it (no process can set that back), and the run fails."""
import os

from reference import ref_kernel


def custom_kernel(data):
    target = os.environ["HOSTILE_TARGET"]
    before = os.stat(target)
    os.chmod(target, 0o600)
    os.utime(target, (1e9, 1e9))
    try:
        os.setxattr(target, "user.hostile", b"planted")
        os.removexattr(target, "user.hostile")
    except OSError:  # a file system without user xattrs
        pass
    os.chmod(target, before.st_mode & 0o7777)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    return ref_kernel(data)
