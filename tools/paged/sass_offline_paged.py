"""Compile a paged kernel for sm_90 on a CPU machine and count its SASS (registers, shared memory,
instruction mix, and the instructions of one page-loop iteration), to check a variant before spending
GPU time.

    python tools/paged/sass_offline_paged.py FMT CHUNK STAGES WARPS [NEXT_N]    e.g. fp4 8 3 4

FMT fp8 / fp4 builds the Triton kernel on that pair (KV_TMA=0 in the environment: the plain-load key
variant), fp8w / fp4w / fp4ws the Gluon kernel on that pair (WARPS is then 4: one warpgroup). The cubin, SASS,
TTGIR and PTX are written to /tmp.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "..", "problems", "paged_mqa_logits"), os.path.join(HERE, "..", "lib")]
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import submission as S  # noqa: E402
from problem_loader import mma_loop, opcode_counts, registers_of, sass_of  # noqa: E402

WATCH = ("UTMALDG", "QGMMA", "HGMMA", "HMMA", "LDS", "STS", "LDSM", "LDL", "STL", "LOP3", "PRMT", "SHF",
         "FMUL", "FFMA", "FMNMX", "SHFL", "BAR", "SYNCS")
ALIGNED = {(i,): [["tt.divisibility", 16]] for i in range(2, 11)}


def compile_triton(fmt, chunk, stages, warps, next_n=1):
    """_paged_mqa_logits_kernel on the fmt pair ("fp8" / "fp4") for sm_90."""
    qn = next_n * S.H
    rb = S.ROW_BYTES[fmt]
    elt = "fp8e4nv" if fmt == "fp8" else "u8"
    signature = {
        "q_desc": f"tensordesc<fp8e4nv[{qn}, {S.D}]>" if fmt == "fp8" else "constexpr",
        "k_desc": f"tensordesc<{elt}[{S.BLOCK}, {rb}]>", "s_desc": "constexpr",
        "q_ptr": "*fp8e4nv" if fmt == "fp8" else "*u8", "q_scale_ptr": "*i32" if fmt == "fp4" else "*fp8e4nv",
        "kv_ptr": f"*{elt}", "kv_word_ptr": "*fp32" if fmt == "fp8" else "*i32", "w_ptr": "*fp32",
        "ctx_ptr": "*i32", "bt_ptr": "*i32", "out_ptr": "*fp32",
        "bt_stride": "i32", "out_stride": "i32", "max_model_len": "i32",
    }
    constexprs = {"q_desc": None, "s_desc": None, "FMT": S.FMT_IDS[fmt], "NEXT_N": next_n, "H": S.H, "D": S.D,
                  "BLOCK": S.BLOCK, "CHUNK": chunk, "NUM_STAGES": stages, "BT_VECTOR": 1, "SCALE_TMA": 0,
                  "KV_TMA": int(os.environ.get("KV_TMA", "1")), "Q_TMA": 0}
    if fmt == "fp8":
        del constexprs["q_desc"]
    for k in constexprs:
        signature.setdefault(k, "constexpr")
    aligned = {k: v for k, v in ALIGNED.items() if k[0] >= 3}
    src = ASTSource(S._paged_mqa_logits_kernel, signature, constexprs, aligned)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


def compile_gluon(fmt="fp4w", chunk=8, stages=3, next_n=1):
    """The Gluon kernel of plan format fmt (fp8w: _fp8_wgmma_kernel, fp4w / fp4ws: _fp4_wgmma_kernel, fp4ws
    warp-specialised) for sm_90."""
    from triton.experimental.gluon._runtime import GluonASTSource
    gl = S.gl
    fp8 = fmt == "fp8w"
    rb, k_type, w_type = (S.D, gl.float8e4nv, gl.float32) if fp8 else (S.D // 2, gl.uint8, gl.int32)
    k_layout = gl.NVMMASharedLayout.get_default_for([S.BLOCK, rb], k_type)
    w_layout = gl.NVMMASharedLayout.get_default_for([S.BLOCK], w_type)
    k_elt, w_elt, q_elt = ("fp8e4nv", "fp32", "fp8e4nv") if fp8 else ("u8", "i32", "u8")
    signature = {"k_desc": f"tensordesc<{k_elt}[{S.BLOCK}, {rb}],{k_layout!r}>",
                 "s_desc" if fp8 else "w_desc": f"tensordesc<{w_elt}[{S.BLOCK}],{w_layout!r}>",
                 "q_ptr": f"*{q_elt}", "q_scale_ptr": "*fp8e4nv" if fp8 else "*i32", "kv_ptr": f"*{k_elt}",
                 "kv_word_ptr": f"*{w_elt}", "w_ptr": "*fp32", "ctx_ptr": "*i32", "bt_ptr": "*i32", "out_ptr": "*fp32",
                 "bt_stride": "i32", "out_stride": "i32", "max_model_len": "i32"}
    constexprs = {"NEXT_N": next_n, "H": S.H, "BLOCK": S.BLOCK, "CHUNK": chunk, "NUM_STAGES": stages}
    if fp8:
        constexprs["D"] = S.D
    else:
        constexprs.update(WARP_SPECIALIZE=fmt == "fp4ws", PRODUCER_REGS=S.PRODUCER_REGS)
    signature.update({k: "constexpr" for k in constexprs})
    kernel = S._fp8_wgmma_kernel if fp8 else S._fp4_wgmma_kernel
    src = GluonASTSource(kernel, signature, constexprs, ALIGNED)
    options = {"num_warps": 4}
    if fmt == "fp4ws":  # as launch() compiles it
        options["maxnreg"] = S.ws_maxnreg(next_n)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def main():
    fmt, chunk, stages, warps = sys.argv[1], *map(int, sys.argv[2:5])
    next_n = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    kernel = (compile_gluon(fmt, chunk, stages, next_n) if fmt in S.GLUON_FORMATS
              else compile_triton(fmt, chunk, stages, warps, next_n))
    path = f"/tmp/paged_{fmt}_{chunk}_{stages}_{warps}_{next_n}"
    sass = sass_of(kernel, path)
    with open(path + ".sass", "w") as f:
        f.write(sass)
    with open(path + ".ttgir", "w") as f:
        f.write(kernel.asm["ttgir"])
    with open(path + ".ptx", "w") as f:
        f.write(kernel.asm["ptx"])
    ops = opcode_counts(sass)
    print(f"{fmt} chunk={chunk} stages={stages} warps={warps} next_n={next_n}: "
          f"regs {registers_of(path + '.cubin')}, shared {kernel.metadata.shared} B, {sum(ops.values())} instr, "
          f"{len(mma_loop(sass))} a page-loop iteration")
    print("  " + ", ".join(f"{op} {sum(v for k, v in ops.items() if k == op)}" for op in WATCH))
    print(f"  sass: {path}.sass")


if __name__ == "__main__":
    main()
