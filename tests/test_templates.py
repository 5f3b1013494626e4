"""Each kit's template, what task.yml's `templates:` hands a participant: the smallest correct start (the
POPCORN header, custom_kernel's signature, the input unpacked and named, a plain-PyTorch body) that passes
`eval.py test` on small cases."""
import subprocess
import sys

import pytest
import yaml
from conftest import PAGED, ROOT

CASES = {ROOT: "batchsize: 2; qseqlen: 1; kvseqlen: 65; seed: 11\n"
               "batchsize: 3; qseqlen: 2; kvseqlen: 20; ragged: 1; seed: 12\n",
         PAGED: "batch: 3; next_n: 2; context: 100; random: 1; seed: 5\n"
                "batch: 2; next_n: 4; context: 3; random: 1; seed: 6\n"}


@pytest.mark.parametrize("problem", list(CASES), ids=["mla", "paged"])
def test_the_template_is_handed_out_and_passes(problem, tmp_path):
    task = yaml.safe_load((problem / "task.yml").read_text())
    assert task["templates"] == {"Python": "template.py"}
    text = (problem / "template.py").read_text()
    assert text.startswith("#!POPCORN leaderboard ") and "def custom_kernel(data: input_t) -> output_t:" in text
    assert len(text.splitlines()) <= 40
    tests = tmp_path / "cases.txt"
    tests.write_text(CASES[problem])
    done = subprocess.run([sys.executable, str(ROOT / "eval.py"), "test", str(tests), "--problem", str(problem),
                           "--submission", str(problem / "template.py")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "2/2 tests passed" in done.stdout, done.stdout + done.stderr
