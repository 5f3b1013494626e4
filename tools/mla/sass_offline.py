"""Compile a variant of submission.py's split kernel for sm_90 without a GPU and count its SASS.

Triton compiles for a target given explicitly, and it ships ptxas and cuobjdump, so kernel
variants can be checked on a CPU machine before spending GPU time: registers, spills, shared
memory, and the instruction mix (UTMALDG = TMA, HGMMA/QGMMA = wgmma, HMMA = mma.sync, LDS/LDSM,
conversions).

    python tools/mla/sass_offline.py FMT BLOCK_N WARPS STAGES KERNEL [--out DIR]
    python tools/mla/sass_offline.py fp8 64 4 3 0
    python tools/mla/sass_offline.py fp8 64 4 2 2      # the Gluon kernel (KERNEL_GLUON)
"""
import argparse
import os
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import submission as S  # noqa: E402

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib")]
from problem_loader import opcode_counts, registers_of, sass_of  # noqa: E402,F401  (sass_of: for the tests)

ELEMENT = {"mxfp4": "u8", "fp8": "fp8e4nv", "bf16": "bf16"}
SCALE_PTR = {"mxfp4": "*u8", "fp8": "*fp32", "bf16": "*bf16"}
WATCH = ("UTMALDG", "HGMMA", "QGMMA", "HMMA", "LDSM", "LDS", "STS", "LDL", "STL", "F2FP", "HMUL2",
         "IMAD", "LOP3", "PRMT", "BAR")


def compile_gluon(split=True, splits=4, module=None, extra=()):
    """_mla_fp8_wgmma_kernel (KERNEL_GLUON) for sm_90; splits sets the in-kernel merge's constexprs.
    module: the submission to take it from (submission.py by default); extra: (name, type) of runtime
    parameters it takes after num_splits (a pointer's 16-byte aligned, as on the GPU)."""
    from triton.experimental.gluon._runtime import GluonASTSource
    S_ = module or S
    layout = S_.gl.NVMMASharedLayout.get_default_for([S_.GLUON_BN, 64], S_.gl.float8e4nv)
    runtime = {"nope_desc": f"tensordesc<fp8e4nv[{S_.NOPE_TILES}, {S_.GLUON_BN}, 64],{S_._NOPE_LAYOUT!r}>",
               "rope_desc": f"tensordesc<fp8e4nv[{S_.GLUON_BN}, 64],{layout!r}>", "q_ptr": "*bf16",
               "out_ptr": "*bf16", "scale_ptr": "*fp32", "kv_indptr_ptr": "*i32", "part_o_ptr": "*fp32",
               "part_lse_ptr": "*fp32", "sync_ptr": "*i64", "qk_scale": "fp32", "q_seq_len": "i32",
               "num_splits": "i32", **dict(extra)}
    signature = {**runtime, "BN": "constexpr", "SPLIT": "constexpr", "STAGES": "constexpr",
                 "SPLITS_P2": "constexpr", "COMBINE_DIMS": "constexpr"}
    constexprs = {"BN": S_.GLUON_BN, "SPLIT": split, "STAGES": S_.GLUON_STAGES,
                  **S_._gluon_combine_constexprs(splits if split else 1)}
    aligned = {(i,): [["tt.divisibility", 16]] for i, kind in enumerate(runtime.values()) if kind.startswith("*")}
    src = GluonASTSource(S_._mla_fp8_wgmma_kernel, signature, constexprs, aligned)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": S_.GLUON_WARPS})


def compile_split(fmt, block_n, warps, stages, trans, split=True):
    """_mla_split_kernel (trans = KERNEL_HMMA or KERNEL_WGMMA), or with trans = KERNEL_GLUON the
    Gluon kernel (fp8, its one configuration)."""
    if trans == S.KERNEL_GLUON:
        return compile_gluon(split)
    elt = ELEMENT[fmt]
    signature = {
        "q_ptr": "*bf16", "out_ptr": "*bf16",
        "kv_desc": f"tensordesc<{elt}[{block_n}, 64]>", "rope_desc": f"tensordesc<{elt}[{block_n}, 32]>",
        "scale_ptr": SCALE_PTR[fmt], "kv_indptr_ptr": "*i32", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32",
        "qk_scale": "fp32", "q_seq_len": "i32", "num_splits": "i32",
        "FMT": "constexpr", "BN": "constexpr", "SPLIT": "constexpr", "STAGES": "constexpr",
        "TRANS": "constexpr", "DOT": "constexpr",
    }
    constexprs = {"FMT": S.FMT_IDS[fmt], "BN": block_n, "SPLIT": split, "STAGES": stages, "TRANS": trans,
                  "DOT": S._dot_dtype(fmt)}
    aligned = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 4, 5, 6, 7)}  # the pointers, as on the GPU
    src = ASTSource(S._mla_split_kernel, signature, constexprs, aligned)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": stages})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fmt", choices=sorted(ELEMENT))
    ap.add_argument("block_n", type=int)
    ap.add_argument("warps", type=int)
    ap.add_argument("stages", type=int)
    ap.add_argument("trans", type=int, help="kernel: 0 HMMA, 1 Triton wgmma, 2 Gluon")
    ap.add_argument("--out", default=None, help="directory for the .ttgir, .ptx, .cubin and .sass")
    args = ap.parse_args()
    kernel = compile_split(args.fmt, args.block_n, args.warps, args.stages, args.trans)
    path = os.path.join(args.out or "/tmp", f"mla_{args.fmt}_{args.block_n}_{args.warps}_{args.stages}_{args.trans}")
    sass = sass_of(kernel, path)
    if args.out:
        for ext in ("ttgir", "ptx"):
            with open(f"{path}.{ext}", "w") as f:
                f.write(kernel.asm[ext])
        with open(path + ".sass", "w") as f:
            f.write(sass)
    ops = opcode_counts(sass)
    print(f"{args.fmt} BN={args.block_n} warps={args.warps} stages={args.stages} trans={args.trans}: "
          f"regs {registers_of(path + '.cubin')}, shared memory {kernel.metadata.shared} B, "
          f"{sum(ops.values())} instructions")
    print("  " + ", ".join(f"{op} {ops[op]}" for op in WATCH))


if __name__ == "__main__":
    main()
