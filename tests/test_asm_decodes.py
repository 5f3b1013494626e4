"""The inline-PTX E2M1 decodes of both submissions, and the MLA Gluon kernel's fp8 packing blocks, run on
the CPU by a small emulator of the PTX they use (mov, prmt, shl, shr, and, or, sub, mul.lo, mul.rn.bf16x2, the
f16x2 / e4m3x2 conversions, sub.rn.f16x2). On the GPU these are the only code that turns packed nibbles into
values; the interpreter tests take a plain-Triton path instead (and Gluon has no interpreter), so without this
test a wrong shift or mask would first show on a GPU.

Contract of both (Triton inline_asm_elementwise, pack=4, two bf16 outputs): $4 holds 4 packed bytes,
$5 / $6 the bf16 scales of bytes 0,1 / 2,3; $0,$1 receive the low nibbles (even elements) of bytes
0-3 times their scale, $2,$3 the high nibbles, exactly (round to nearest even where not exact)."""
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import problem_modules

ROOT = Path(__file__).resolve().parents[1]
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _bf16_bits(x: float) -> int:
    """Round-to-nearest-even bf16 bits of x (via float32; products here are exact in float32)."""
    with np.errstate(over="ignore"):
        b = int(np.array(x, dtype=np.float32).view(np.uint32))
    if (b & 0x7F800000) == 0x7F800000:
        return (b >> 16) | (0x40 if b & 0x7FFFFF else 0)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def _bf16_value(h: int) -> float:
    return float(np.array(h << 16, dtype=np.uint32).view(np.float32))


def _prmt(a: int, b: int, sel: int) -> int:
    src = a | (b << 32)
    out = 0
    for i in range(4):
        s = (sel >> (4 * i)) & 0xF
        byte = (src >> (8 * (s & 7))) & 0xFF
        if s & 8:  # sign-replicate mode
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _mul_bf16x2(a: int, b: int) -> int:
    lo = _bf16_bits(_bf16_value(a & 0xFFFF) * _bf16_value(b & 0xFFFF))
    hi = _bf16_bits(_bf16_value(a >> 16) * _bf16_value(b >> 16))
    return lo | (hi << 16)


def _f16_bits(x) -> int:
    return int(np.array(x, dtype=np.float16).view(np.uint16))


def _f16_value(h: int) -> float:
    return float(np.array(h & 0xFFFF, dtype=np.uint16).view(np.float16))


def _e4m3_value(b: int) -> float:
    import torch
    return float(torch.tensor([b & 0xFF], dtype=torch.uint8).view(torch.float8_e4m3fn).float())


def _e4m3_bits(x: float) -> int:  # round to nearest even; |x| <= 448 here, so satfinite never acts
    import torch
    return int(torch.tensor([x], dtype=torch.float32).to(torch.float8_e4m3fn).view(torch.uint8))


def _halves(h32: int):
    return h32 & 0xFFFF, h32 >> 16


def run_ptx(asm: str, inputs: dict) -> dict:
    """Execute the straight-line PTX subset; inputs/outputs keyed by '$n'. Registers hold bit patterns
    (16 or 32 bits); `mov.b32 {a, b}, x` splits x into halves and `mov.b32 x, {a, b}` packs them."""
    regs = dict(inputs)

    def val(tok):
        tok = tok.strip()
        return regs[tok] if tok in regs else int(tok, 0)
    body = asm.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    for stmt in (s.strip() for s in body.split(";")):
        if not stmt or stmt.startswith(".reg"):
            continue
        op, rest = stmt.split(None, 1)
        if op == "mov.b32" and rest.startswith("{"):  # unpack
            pair, src = rest[1:].split("}")
            lo, hi = [t.strip() for t in pair.split(",")]
            regs[lo], regs[hi] = _halves(val(src.strip(" ,")))
            continue
        if op == "mov.b32" and rest.rstrip().endswith("}"):  # pack
            dst, pair = rest.split(",", 1)
            lo, hi = [t.strip() for t in pair.strip(" {}").split(",")]
            regs[dst.strip()] = (val(lo) & 0xFFFF) | (val(hi) & 0xFFFF) << 16
            continue
        dst, *args = [t.strip() for t in rest.split(",")]
        if op == "mov.b32":
            r = val(args[0])
        elif op == "cvt.rn.f16x2.e4m3x2":  # low byte -> low half
            h = val(args[0])
            r = _f16_bits(_e4m3_value(h & 0xFF)) | _f16_bits(_e4m3_value(h >> 8)) << 16
        elif op == "cvt.rn.f16x2.f32":  # first source -> high half
            f32 = [float(np.array(val(a), dtype=np.uint32).view(np.float32)) for a in args]
            r = _f16_bits(f32[1]) | _f16_bits(f32[0]) << 16
        elif op == "cvt.rn.satfinite.e4m3x2.f16x2":  # low half -> low byte
            lo, hi = _halves(val(args[0]))
            r = _e4m3_bits(_f16_value(lo)) | _e4m3_bits(_f16_value(hi)) << 8
        elif op == "sub.rn.f16x2":
            (a0, a1), (b0, b1) = _halves(val(args[0])), _halves(val(args[1]))
            r = (_f16_bits(np.float16(_f16_value(a0)) - np.float16(_f16_value(b0)))
                 | _f16_bits(np.float16(_f16_value(a1)) - np.float16(_f16_value(b1))) << 16)
        elif op == "prmt.b32":
            r = _prmt(val(args[0]), val(args[1]), val(args[2]))
        elif op == "shl.b32":
            r = val(args[0]) << val(args[1])
        elif op == "shr.b32":
            r = val(args[0]) >> val(args[1])
        elif op == "sub.u32":
            r = val(args[0]) - val(args[1])
        elif op == "mul.lo.u32":
            r = val(args[0]) * val(args[1])
        elif op == "and.b32":
            r = val(args[0]) & val(args[1])
        elif op == "or.b32":
            r = val(args[0]) | val(args[1])
        elif op == "mul.rn.bf16x2":
            r = _mul_bf16x2(val(args[0]), val(args[1]))
        else:
            raise AssertionError(f"emulator lacks {op!r}")
        regs[dst] = r & 0xFFFFFFFF
    return regs


def _load(name, path, extra_path):
    """The submission file at path, as module `name`, with its problem directory's modules importable."""
    pytest.importorskip("triton")
    with problem_modules(extra_path, names=()):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


def _paged():
    return _load("paged_submission_asm", ROOT / "problems/paged_mqa_logits/submission.py",
                 ROOT / "problems/paged_mqa_logits")


def _asms():
    paged = _load("paged_submission_asm", ROOT / "problems/paged_mqa_logits/submission.py",
                  ROOT / "problems/paged_mqa_logits")
    mla = _load("mla_submission_asm", ROOT / "submission.py", ROOT)
    return {"paged _E2M1_ASM": paged._E2M1_ASM.value, "mla _E2M1_ASM": mla._E2M1_ASM.value}


@pytest.mark.parametrize("e", [0, 1, 60, 126, 127, 128, 129, 200, 253, 254])
def test_e2m1_decodes_are_exact(e):
    scale = 2.0 ** (e - 127)
    s_bits = _bf16_bits(scale)
    assert _bf16_value(s_bits) == scale  # every E8M0 scale is a bf16 value (e = 0 a subnormal)
    rng = np.random.default_rng(e)
    words = [int.from_bytes(bytes(range(i, i + 4)), "little") for i in range(0, 256, 4)]  # every byte
    words += [int(w) for w in rng.integers(0, 2 ** 32, 64, dtype=np.uint64)]
    for name, asm in _asms().items():
        assert len(re.findall(r"\$[0-3]\b", asm)) >= 4, name
        for w in words:
            out = run_ptx(asm, {"$4": w, "$5": s_bits * 0x10001, "$6": s_bits * 0x10001})
            b = w.to_bytes(4, "little")
            want_lo = [_bf16_bits((-1) ** (x >> 3 & 1) * E2M1[x & 7] * scale) for x in (v & 15 for v in b)]
            want_hi = [_bf16_bits((-1) ** (x >> 3 & 1) * E2M1[x & 7] * scale) for x in (v >> 4 for v in b)]
            got = [out[f"${i}"] for i in range(4)]
            got_lo = [got[0] & 0xFFFF, got[0] >> 16, got[1] & 0xFFFF, got[1] >> 16]
            got_hi = [got[2] & 0xFFFF, got[2] >> 16, got[3] & 0xFFFF, got[3] >> 16]
            assert (got_lo, got_hi) == (want_lo, want_hi), f"{name}: word {w:#010x}, e={e}"


def test_emulator_sees_a_wrong_mask():
    """The test above can fail: one wrong mask in the decode is caught."""
    asm = _asms()["paged _E2M1_ASM"].replace("0x01C001C0", "0x01C000C0", 1)
    s = _bf16_bits(1.0) * 0x10001
    out = run_ptx(asm, {"$4": 0x07070707, "$5": s, "$6": s})
    assert out["$0"] != _bf16_bits(6.0) * 0x10001


def _e5m2_bits(x: float) -> int:
    import torch
    return int(torch.tensor([x], dtype=torch.float32).to(torch.float8_e5m2).view(torch.uint8)[0])


def _fold(w, n, table=None, lookup=None):
    """Run the paged kernel's fold on packed word w of a scale group whose n is n: _TABLE_ASM builds the
    group's table, _LOOKUP_ASM decodes w with it -> (low-nibble bytes, high-nibble bytes)."""
    paged = _paged()
    t = run_ptx(table or paged._TABLE_ASM.value, {"$2": n})
    out = run_ptx(lookup or paged._LOOKUP_ASM.value, {"$2": w, "$3": t["$0"], "$7": t["$1"]})
    return [(out["$0"] >> 8 * i) & 0xFF for i in range(4)], [(out["$1"] >> 8 * i) & 0xFF for i in range(4)]


@pytest.mark.parametrize("n", range(16))
def test_paged_fold_decode_is_exact(n):
    """The Gluon fp4 kernel's fold (_TABLE_ASM then _LOOKUP_ASM): E2M1 x 2^(2 - n) as e5m2, exact for every
    code, sign and n <= 15 (every byte value in every byte position): byte j of the first output is packed
    byte j's low nibble (element 2j), of the second its high nibble (element 2j + 1)."""
    rng = np.random.default_rng(n)
    words = [int.from_bytes(bytes((i + 64 * r) % 256 for r in range(4)), "little") for i in range(256)]
    words += [int(w) for w in rng.integers(0, 2 ** 32, 32, dtype=np.uint64)]
    for w in words:
        b = w.to_bytes(4, "little")
        want = [[_e5m2_bits((-1) ** (x >> 3 & 1) * E2M1[x & 7] * 2.0 ** (2 - n)) for x in nib]
                for nib in ([b[i] & 15 for i in range(4)], [b[i] >> 4 for i in range(4)])]
        assert list(_fold(w, n)) == want, f"word {w:#010x}, n={n}"


def test_fold_emulation_sees_a_wrong_order_and_a_wrong_table():
    """The test above can fail: one wrong byte order in the lookup, or code 0 given n's offset in the
    table, is caught."""
    right = _fold(0x00000100, 0)[0]  # 0.5 in byte 1's low nibble: element 2
    assert right == [0, _e5m2_bits(2.0), 0, 0]
    assert _fold(0x00000100, 0, lookup=_paged()._LOOKUP_ASM.value.replace("0x6420", "0x6240", 1))[0] != right
    bad_table = _paged()._TABLE_ASM.value.replace("0xFFFFFF00", "0xFFFFFFFF", 1)
    assert _fold(0, 3, table=bad_table)[0] != _fold(0, 3)[0] == [0, 0, 0, 0]


def _mla():
    return _load("mla_submission_asm", ROOT / "submission.py", ROOT)


def test_mla_v_pairs_pack_two_rows_per_register():
    """_V_PAIRS_ASM: words x (row r) and y (row r + 1), 4 e4m3 V values each -> $k = (x byte k, y byte k)
    as an f16 pair, row r in the low half: the wgmma operand's pairs of consecutive K. Every byte value."""
    mla = _mla()
    if getattr(mla, "gluon", None) is None:
        pytest.skip("this Triton has no Gluon")
    asm = mla._V_PAIRS_ASM.value
    rng = np.random.default_rng(3)
    for i in range(0, 256, 4):
        x = int.from_bytes(bytes(range(i, i + 4)), "little")
        y = int(rng.integers(0, 2 ** 32, dtype=np.uint64))
        out = run_ptx(asm, {"$4": x, "$5": y})
        for k in range(4):
            want = [_e4m3_value(w >> (8 * k)) for w in (x, y)]
            got = [_f16_value(h) for h in _halves(out[f"${k}"])]
            assert all(g == w or (np.isnan(g) and np.isnan(w)) for g, w in zip(got, want)), (i, k, got, want)


def test_mla_q_split_matches_the_fp32_split():
    """_Q_SPLIT_ASM: 4 fp32 values (bf16 values, |x| < 2^8) -> $0 = e4m3(x), $1 = e4m3(x - e4m3(x)), byte i
    from value i, equal in value to the fp32 computation (test_submission shows why f16 arithmetic suffices;
    this runs the PTX itself), for a spread of bf16 values from 2^-40 to 2^8 of both signs."""
    mla = _mla()
    if getattr(mla, "gluon", None) is None:
        pytest.skip("this Triton has no Gluon")
    asm = mla._Q_SPLIT_ASM.value
    rng = np.random.default_rng(4)
    xs = np.concatenate([rng.standard_normal(2000) * 2.0 ** rng.integers(-40, 7, 2000), [0.0, -0.0, 255.0, -255.0]])
    xs = np.array([_bf16_value(_bf16_bits(x)) for x in xs], dtype=np.float32)
    for i in range(0, len(xs) - 3, 4):
        four = xs[i:i + 4]
        out = run_ptx(asm, {f"${2 + j}": int(four[j:j + 1].view(np.uint32)[0]) for j in range(4)})
        for j, x in enumerate(four):
            hi = _e4m3_value(_e4m3_bits(float(x)))
            lo = _e4m3_value(_e4m3_bits(float(x) - hi))
            assert _e4m3_value(out["$0"] >> (8 * j)) == hi and _e4m3_value(out["$1"] >> (8 * j)) == lo, (x, j)


def _probe():
    pytest.importorskip("triton")
    spec = importlib.util.spec_from_file_location("fp4_decode_probe", ROOT / "tools" / "kits" / "fp4_decode_probe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _table_decode(asm, w, s, table_words):
    """The table decode of word w at relative scale exponent s: (bytes of $0, bytes of $1)."""
    t_lo, t_hi = table_words(s)
    out = run_ptx(asm, {"$2": w, "$3": t_lo, "$4": t_hi})
    return [(out["$0"] >> 8 * i) & 0xFF for i in range(4)], [(out["$1"] >> 8 * i) & 0xFF for i in range(4)]


def test_table_decode_is_exact_for_every_code_scale_and_sign():
    """tools/kits/fp4_decode_probe.py's E2M1_TABLE_ASM: word w (elements 0-7, the even one in each byte's low
    nibble) at every relative scale exponent s the table holds -> e4m3(E2M1 * 2^s), exactly, elements 0, 2,
    4, 6 in $0 and 1, 3, 5, 7 in $1 (-0 as 0x80). Every byte value in every position, both nibbles."""
    probe = _probe()
    rng = np.random.default_rng(19)
    words = [int.from_bytes(bytes((i + k) % 256 for k in range(4)), "little") for i in range(256)]
    words += [int(w) for w in rng.integers(0, 2 ** 32, 64, dtype=np.uint64)]
    for s in range(probe.S_MIN, probe.S_MAX + 1):
        for w in words:
            codes = [(w >> 4 * i) & 15 for i in range(8)]  # element i in nibble i
            want = [_e4m3_bits((-1) ** (c >> 3) * E2M1[c & 7] * 2.0 ** s) for c in codes]
            want = [b | 0x80 if c >> 3 else b for b, c in zip(want, codes)]  # -0 keeps its sign
            assert _table_decode(probe.E2M1_TABLE_ASM.value, w, s, probe.table_words) == (want[0::2], want[1::2]), \
                f"word {w:#010x}, s={s}"


def test_table_decode_emulation_sees_a_wrong_gather():
    """The test above can fail: a gather that swaps two elements is caught."""
    probe = _probe()
    asm = probe.E2M1_TABLE_ASM.value.replace("0x6420", "0x6402", 1)
    assert _table_decode(asm, 0x00000100, 0, probe.table_words)[0] != [0, 0x30, 0, 0]  # element 2 is 0.5


def test_table_decode_costs_little_more_than_one_instruction_per_element():
    """The number issue-bound fp4 kernels are built on (results/fp4_decode.md): the table decode,
    compiled for sm_90 by Triton's own ptxas, is at most 1.25 SASS instructions per element, with no spills."""
    probe = _probe()
    try:
        (ops, elements), (base, _) = probe.sass_counts(), probe.sass_counts(decode=False)
    except (OSError, RuntimeError) as e:  # a Triton without its bundled ptxas / cuobjdump
        pytest.skip(f"no sm_90 toolchain: {e}")
    per_element = (sum(ops.values()) - sum(base.values())) / elements
    assert 0.9 <= per_element <= 1.25, (per_element, ops - base)
    assert ops["LDL"] + ops["STL"] == 0


def test_the_probes_gpu_check_counts_wrong_values():
    """fp4_decode_probe's GPU check (_wrong), fed the decode as the emulator runs it: nothing wrong; one
    byte changed in a block the table holds: one wrong value."""
    import torch
    probe = _probe()
    blocks = 4
    words, scales, ref = probe._inputs(8, blocks, 3, device="cpu")
    out = []
    for b, w in enumerate(words.tolist()):
        s = max(int(scales[b // 4]) - int(ref[b // 4 // blocks]), probe.S_MIN)
        even, odd = _table_decode(probe.E2M1_TABLE_ASM.value, w & 0xFFFFFFFF, s, probe.table_words)
        out += [int.from_bytes(bytes(even), "little"), int.from_bytes(bytes(odd), "little")]
    out = torch.tensor(out, dtype=torch.int64).to(torch.int32)
    assert probe._wrong(words, scales, ref, out, blocks) == 0
    held = next(b for b in range(scales.numel()) if int(scales[b]) - int(ref[b // blocks]) >= probe.S_MIN)
    out.view(torch.uint8)[32 * held] ^= 0x01  # element 0 of the block: a different e4m3 value
    assert probe._wrong(words, scales, ref, out, blocks) == 1
