"""Cases: task.yml and tests files (GPU MODE's `key: value; key: value` lines), checked before any case
runs (a malformed one is a DefinitionError: exit code 113)."""
import dataclasses
import inspect
import re
from pathlib import Path

class DefinitionError(Exception):
    """A malformed task.yml or tests file (exit code 113)."""


@dataclasses.dataclass
class TestCase:
    args: dict
    spec: str


def spec_string(args: dict) -> str:
    return "; ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in args.items())


def combine_seeds(a: int, b: int) -> int:
    """GPU MODE's Cantor-style combination: a large secret seed gives a large case seed."""
    return int(a + (a + b) * (a + b + 1) // 2)


_CASE_PART = re.compile(r"\s*([a-zA-Z_]\w*):\s*([a-zA-Z_]\w*|[+-]?[0-9]+)\s*")


def parse_tests_file(path: str) -> list[dict]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise DefinitionError(f"cannot read tests file {path}: {e}") from None
    cases = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        case = {}
        for part in line.split(";"):
            m = _CASE_PART.fullmatch(part)
            if not m:
                raise DefinitionError(f"{path}:{lineno}: invalid case part {part!r} in {line!r} "
                                      f"(expected `key: value; key: value` with integer or true/false values)")
            key, val = m[1], m[2]
            case[key] = int(val) if re.fullmatch(r"[+-]?[0-9]+", val) else {"true": True, "false": False}.get(val, val)
        cases.append(case)
    if not cases:
        raise DefinitionError(f"tests file {path} holds no cases")
    return cases


def load_task(problem_dir: Path) -> dict:
    """task.yml of the problem, validated enough that later errors cannot come from it."""
    import yaml

    path = problem_dir / "task.yml"
    try:
        task = yaml.safe_load(path.read_text())
    except OSError as e:
        raise DefinitionError(f"cannot read {path}: {e}") from None
    except yaml.YAMLError as e:
        raise DefinitionError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(task, dict):
        raise DefinitionError(f"{path}: top level must be a mapping, got {type(task).__name__}")
    for key in ("tests", "benchmarks"):
        cases = task.get(key)
        if not isinstance(cases, list) or not cases:
            raise DefinitionError(f"{path}: key `{key}` must be a non-empty list of cases")
        for i, case in enumerate(cases):
            if not isinstance(case, dict) or not all(isinstance(v, (int, bool)) for v in case.values()):
                raise DefinitionError(f"{path}: {key}[{i}] must map names to integers or booleans, got {case!r}")
    for key in ("test_timeout", "benchmark_timeout", "ranked_timeout"):
        value = task.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise DefinitionError(f"{path}: key `{key}` must be a positive number of seconds, got {value!r}")
    return task


def validate_cases(cases: list[dict], generate_input, where: str) -> None:
    """Every case must bind to generate_input's parameters and carry an integer seed."""
    sig = inspect.signature(generate_input)
    for i, case in enumerate(cases):
        try:
            sig.bind(**case)
        except TypeError as e:
            raise DefinitionError(f"{where}: case {i} ({spec_string(case)}): {e}; "
                                  f"generate_input takes {list(sig.parameters)}") from None
        if not isinstance(case.get("seed"), int) or isinstance(case.get("seed"), bool):
            raise DefinitionError(f"{where}: case {i} ({spec_string(case)}) needs an integer `seed`")


def make_cases(cases: list[dict], seed: int | None) -> list[TestCase]:
    out = []
    for case in cases:
        args = dict(case)
        spec = spec_string(args)
        if seed is not None and "seed" in args:
            args["seed"] = combine_seeds(args["seed"], seed)
        out.append(TestCase(args=args, spec=spec))
    return out
