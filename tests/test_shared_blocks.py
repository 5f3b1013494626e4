"""The two submissions share host-path blocks (the direct launcher, the outputs-ahead allocator, the
launch-hook check, the kinds of route, the fallback and its log, the accessors for tools) and the E2M1 decode's PTX. Each copy is marked in both files; this keeps the copies
the same text, so that a fix to one reaches the other."""
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = (ROOT / "submission.py", ROOT / "problems" / "paged_mqa_logits" / "submission.py")
BLOCK = re.compile(r"^# --- shared block: (?P<name>[\w ]+) \(.*?\) ---\n(?P<text>.*?)^# --- end of shared block: (?P=name) ---$",
                   re.M | re.S)
EXPECTED = {"direct launch", "outputs ahead", "launch hooks", "route kinds", "fallback", "tool access"}


def shared_blocks(path: Path) -> dict:
    blocks = {}
    for m in BLOCK.finditer(path.read_text()):
        assert m["name"] not in blocks, f"{path}: shared block {m['name']!r} twice"
        blocks[m["name"]] = m["text"]
    return blocks


def test_the_shared_blocks_are_the_same_text_in_both_submissions():
    mla, paged = (shared_blocks(f) for f in FILES)
    assert set(mla) == set(paged) == EXPECTED
    for name in EXPECTED:
        assert mla[name].strip() and mla[name] == paged[name], f"shared block {name!r} differs"


def e2m1_ptx(path: Path) -> str:
    m = re.search(r'^( *)_E2M1_ASM = tl\.constexpr\("""\n(.*?)^\1"""\)', path.read_text(), re.M | re.S)
    assert m, f"{path}: no _E2M1_ASM"
    return textwrap.dedent(m[2])


def test_the_e2m1_decode_is_the_same_ptx_in_both_submissions():
    mla, paged = (e2m1_ptx(f) for f in FILES)
    assert "prmt.b32" in mla and mla == paged


def test_a_changed_copy_is_caught(tmp_path):
    changed = tmp_path / "submission.py"
    changed.write_text(FILES[1].read_text().replace("if len(self.spare) >= 4:", "if len(self.spare) >= 5:"))
    assert shared_blocks(changed)["outputs ahead"] != shared_blocks(FILES[0])["outputs ahead"]
