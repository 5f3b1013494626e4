"""What every test shares: the repository root on sys.path (the MLA problem's modules, reference,
task, utils and eval, import from there), and problem_modules, the one way a test loads another
problem directory's modules."""
import contextlib
import importlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGED = ROOT / "problems" / "paged_mqa_logits"
sys.path.insert(0, str(ROOT))

_PROBLEM_MODULES = ("reference", "task", "submission")


@contextlib.contextmanager
def problem_modules(directory: Path, names=("reference", "submission")):
    """A problem directory's modules, imported under their own names (they import each other by those
    names: `from reference import ...`), as a tuple in the order of `names`. Afterwards they are taken
    out of sys.modules again and whatever was there before is put back, so that another problem's
    `import reference` still gets its own."""
    saved = {k: sys.modules.pop(k) for k in _PROBLEM_MODULES if k in sys.modules}
    sys.path.insert(0, str(directory))
    try:
        yield tuple(importlib.import_module(name) for name in names)
    finally:
        sys.path.remove(str(directory))
        for k in _PROBLEM_MODULES:
            sys.modules.pop(k, None)
        sys.modules.update(saved)


def wait_for(predicate, timeout=10.0) -> bool:
    """Whether predicate() came true within timeout seconds (polled)."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True
