"""Hostile: leaves code where a worker's next start would run it before the worker has confined itself
(an eval.py in its sandbox, where workers once started from; sitecustomize / usercustomize and a .pth
file on the paths a fresh Python reads from its home and working folder; a typing_extensions.py in its
sandbox, which torch imports as a worker sets itself up), then makes the judge start a
new worker (restarts_its_worker). Planted code that runs writes a marker; the new worker answers right
only if none did. The judge starts every worker from a sealed copy of its own code, with no folder the
worker can write on sys.path at start-up."""
import sys
from pathlib import Path

from reference import ref_kernel
from restarts_its_worker import arm

SANDBOX = Path.cwd()
MARKER = SANDBOX / "planted-code-ran"
PLANT = f"open({str(MARKER)!r}, 'a').write(__name__ + '\\n')\n"


def _plant():
    script = SANDBOX / "eval.py"
    script.write_text(PLANT + (script.read_text() if script.exists() else ""))
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    user_site = Path.home() / ".local" / "lib" / version / "site-packages"
    for folder in (SANDBOX, user_site):
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("sitecustomize.py", "usercustomize.py"):
            (folder / name).write_text(PLANT)
    (user_site / "planted.pth").write_text(f"import os; {PLANT}")
    (SANDBOX / "typing_extensions.py").write_text(PLANT)


if arm():
    _plant()


def custom_kernel(data):
    out = ref_kernel(data)
    return out * 0 if MARKER.exists() else out
