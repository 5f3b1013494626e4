"""Is a change to submission.py behaviour-neutral on the GPU side? Compiles every MLA kernel variant the
plans can name (the Gluon kernel at several split counts, the Triton split kernel for each format in
both orientations) for sm_90 from two submission files, on any machine (Triton ships ptxas), and
compares their PTX with line information left out.

    python tools/mla/ptx_diff.py OLD_SUBMISSION.py [NEW_SUBMISSION.py]   # NEW defaults to ./submission.py
    git show HEAD~3:submission.py > /tmp/old.py && python tools/mla/ptx_diff.py /tmp/old.py
"""
import argparse
import importlib.util
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "lib"), ROOT]
import sass_offline  # noqa: E402


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def normalized(ptx: str) -> str:
    """PTX without line information, comments and debug sections (they move with the source)."""
    lines = [re.sub(r"\s+//.*$", "", line) for line in ptx.splitlines()
             if line.strip() and not line.strip().startswith((".loc", ".file", "//"))]
    return re.sub(r"\.section\s+\.debug.*", "", "\n".join(lines), flags=re.S)


def variants(submission) -> dict:
    sass_offline.S = submission  # sass_offline compiles whatever module it is given
    kernels = {f"gluon, {splits} splits": sass_offline.compile_gluon(splits > 1, splits)
               for splits in (1, 2, 4, 8, 16, 33)}
    for fmt in ("fp8", "bf16", "mxfp4"):
        for trans in (submission.KERNEL_HMMA, submission.KERNEL_WGMMA):
            kernels[f"split, {fmt}, trans={trans}"] = sass_offline.compile_split(fmt, 64, 4, 3, trans)
    return {name: normalized(k.asm["ptx"]) for name, k in kernels.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new", nargs="?", default=os.path.join(ROOT, "submission.py"))
    args = ap.parse_args()
    old, new = variants(load(args.old, "old_submission")), variants(load(args.new, "new_submission"))
    for name in old:
        print(f"{name:26s} {'same' if old[name] == new[name] else 'DIFFERENT'}")
    return 0 if old == new else 1


if __name__ == "__main__":
    sys.exit(main())
