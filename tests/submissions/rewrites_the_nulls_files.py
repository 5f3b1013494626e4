"""Hostile: tries to rewrite the Python files of every other sandbox beside its own (the null submission's
among them: the problem's modules, which the null imports, and eval.py where the workers start from a
copy), so that a null worker would run the submission's code, and prints how many sandboxes it could.
Its answers are the reference's."""
from pathlib import Path

from reference import ref_kernel

_own = Path.cwd().resolve()
_others = [p for p in _own.parent.glob("eval-sandbox-*") if p.resolve() != _own and any(p.glob("*.py"))]
_rewritten = 0
for _box in _others:
    for _path in _box.glob("*.py"):
        try:
            with open(_path, "a") as f:
                f.write("\n# rewritten by the submission\n")
            _rewritten += 1
            break
        except OSError:
            pass
print(f"rewrote {_rewritten} of {len(_others)} other sandboxes' files", flush=True)


def custom_kernel(data):
    return ref_kernel(data)
