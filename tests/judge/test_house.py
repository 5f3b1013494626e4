"""The judge's house, read from the code's imports: the worker's module stands alone (it runs in the
submission's process, started from a sealed copy of itself), tools reach the judge through public names
only, and no file of the kit but the two submissions outgrows a reader."""
import ast
from pathlib import Path

import eval as cli

ROOT = Path(__file__).resolve().parents[2]
JUDGE_MODULES = {Path(name).stem for name in cli.HARNESS_FILES if name.startswith(("eval", "judge_"))}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_the_workers_module_imports_no_other_module_of_the_judge():
    assert not _imports(ROOT / "judge_worker.py") & (JUDGE_MODULES | {"utils", "reference", "task"})


def test_every_judge_module_is_in_the_harness_and_each_task_yml():
    assert {p.stem for p in ROOT.glob("judge_*.py")} | {"eval"} == JUDGE_MODULES


def test_tools_use_no_private_name_of_the_judge():
    for path in (ROOT / "tools").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id in JUDGE_MODULES and node.attr.startswith("_"):
                raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno} uses {node.value.id}.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module in JUDGE_MODULES:
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.relative_to(ROOT)} imports {private} from {node.module}"


# The most lines a file of the kit holds, but the two submissions (each kit's kernels and host path in one
# file, as a participant uploads it).
MOST_LINES = 820
SUBMISSIONS = {ROOT / "submission.py", ROOT / "problems" / "paged_mqa_logits" / "submission.py"}


def test_no_module_of_the_harness_outgrows_a_reader():
    for name in cli.HARNESS_FILES:
        assert len((ROOT / name).read_text().splitlines()) <= MOST_LINES, name


def test_no_file_of_the_kit_outgrows_a_reader_but_the_submissions():
    files = [*ROOT.glob("*.py"), *(p for folder in ("problems", "tests", "tools") for p in (ROOT / folder).rglob("*.py"))]
    long = [str(p.relative_to(ROOT)) for p in files
            if p not in SUBMISSIONS and len(p.read_text().splitlines()) > MOST_LINES]
    assert len(files) > 50 and not long, long
