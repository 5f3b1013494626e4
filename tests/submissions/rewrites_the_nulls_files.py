"""Hostile: tries to rewrite the eval.py of every other sandbox beside its own (the null submission's
among them), so that a null worker started from it would run the submission's code, and prints how many
it could. Its answers are the reference's."""
from pathlib import Path

from reference import ref_kernel

_own = Path.cwd().resolve()
_others = [p for p in _own.parent.glob("eval-sandbox-*/eval.py") if p.parent.resolve() != _own]
_rewritten = 0
for _path in _others:
    try:
        with open(_path, "a") as f:
            f.write("\n# rewritten by the submission\n")
        _rewritten += 1
    except OSError:
        pass
print(f"rewrote {_rewritten} of {len(_others)} other sandboxes' eval.py", flush=True)


def custom_kernel(data):
    return ref_kernel(data)
