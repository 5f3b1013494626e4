"""Where a Gluon-kernel call's GPU time goes: %globaltimer stamps at phase boundaries, per program.

    python tools/timeline_mla.py [--calls 20] [--shapes 4x8192,32x1024] [--out DIR]

A copy of submission.py is patched (text anchors below; the tool says which one is missing if the
kernel moved) so that _mla_fp8_wgmma_kernel writes globaltimer stamps; the
copy is launched through Triton's JIT after an L2 flush, with the GPU held ~2 ms (the JIT launch path is slow) so the host has
queued everything, and a one-program stamp kernel just before and just after the call. Phases, per
program, in us from the stamp kernel before:
  entry     the program starts              bounds  kv_indptr read (split bounds known)
  q         q loaded and its amax reduced   prolog  q split stored to shared memory
  tile0     first cache tile arrived        loop    all tiles done
  stored    epilogue stores issued          arrived all the row's splits stored (split plans)
  merged    the in-kernel merge's stores issued
then the stamp kernel after. Medians over calls
of the min / median / max over programs. Diagnostic only: the stamps cost a few instructions.
"""
import argparse
import importlib.util
import os
import statistics
import sys
import tempfile

from problem_loader import ROOT, hold_gpu, load

STAMP_HELPERS = '''
if gluon is not None:
    @gluon.jit
    def _stamp(ptr, dep):
        t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dep], dtype=gl.int64,
                                      is_pure=False, pack=1)
        gl.store(ptr, t)

    @gluon.jit
    def _smid(dep):
        return gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [dep], dtype=gl.int32,
                                         is_pure=False, pack=1)
'''

# (anchor, replacement) pairs applied to submission.py's text, in order; each anchor must occur once
PATCHES = [
    ("NOPE_TILES = 8  # the 512 nope (= V) columns as 64-column tiles\n",
     "NOPE_TILES = 8  # the 512 nope (= V) columns as 64-column tiles\n" + STAMP_HELPERS),
    ("part_lse_ptr, sync_ptr, qk_scale, q_seq_len, num_splits,\n",
     "part_lse_ptr, sync_ptr, qk_scale, q_seq_len, num_splits, stamp_ptr,\n"),
    ("        pid_s = gl.program_id(1)\n        _prefetch_q(q_ptr, pid_q)\n",
     "        pid_s = gl.program_id(1)\n        st = stamp_ptr + (pid_q * num_splits + pid_s).to(gl.int64) * 10\n"
     "        _stamp(st + 0, pid_s)\n        _prefetch_q(q_ptr, pid_q)\n"),
    ("        kv_scale = gl.load(scale_ptr)\n",
     "        kv_scale = gl.load(scale_ptr)\n        _stamp(st + 1, start + end)\n"),
    ("        q_mult = ((k + 127) << 23).to(gl.float32, bitcast=True)\n",
     "        q_mult = ((k + 127) << 23).to(gl.float32, bitcast=True)\n        _stamp(st + 2, k)\n"),
    ("        fence_async_shared()\n        _cta_barrier()\n\n        rows = ",
     "        fence_async_shared()\n        _cta_barrier()\n        _stamp(st + 3, pid_s)\n"
     "        if n_tiles > 0:\n            mbarrier.wait(bars.index(0), 0)\n        _stamp(st + 4, pid_s)\n\n        rows = "),
    ("        for i in gl.static_range(STAGES):\n            mbarrier.invalidate(bars.index(i))\n",
     "        for i in gl.static_range(STAGES):\n            mbarrier.invalidate(bars.index(i))\n"
     "        _stamp(st + 5, gl.max(l_i, 0).to(gl.int32, bitcast=True))\n"),
    ("        gl.store(base + 384 + offs, _o_by_head(o_3, inv, st_l).to(base.dtype.element_ty))\n",
     "        gl.store(base + 384 + offs, _o_by_head(o_3, inv, st_l).to(base.dtype.element_ty))\n"
     "        _stamp(st + 6, pid_s)\n        gl.store(st + 9, _smid(pid_s).to(gl.int64))\n"),
    ("            _combine_in_kernel(part_o_ptr, part_lse_ptr, out_ptr, sync_ptr, pid_q, pid_s, num_splits,\n"
     "                               SPLITS_P2, COMBINE_DIMS)\n",
     "            _combine_in_kernel(part_o_ptr, part_lse_ptr, out_ptr, sync_ptr, pid_q, pid_s, num_splits,\n"
     "                               SPLITS_P2, COMBINE_DIMS, st)\n            _stamp(st + 8, pid_s)\n"),
    ("                           SPLITS_P2: gl.constexpr, DIMS: gl.constexpr):\n",
     "                           SPLITS_P2: gl.constexpr, DIMS: gl.constexpr, st):\n"),
    ("        while seen < target:\n            seen = _ld_acquire(ctr)\n",
     "        while seen < target:\n            seen = _ld_acquire(ctr)\n        _stamp(st + 7, seen.to(gl.int32))\n"),
    ("_qk_scale(config), config[\"q_seq_len\"], splits, **split_consts, num_warps=warps,",
     "_qk_scale(config), config[\"q_seq_len\"], splits, STAMPS, **split_consts, num_warps=warps,"),
]
PHASES = ("entry", "bounds", "q", "prolog", "tile0", "loop", "stored", "arrived", "merged")


def patched_submission(path, out_dir):
    text = open(path).read()
    for anchor, new in PATCHES:
        if text.count(anchor) != 1:
            sys.exit(f"timeline_mla: anchor not found once in {path}: {anchor[:70]!r}")
        text = text.replace(anchor, new)
    dst = os.path.join(out_dir, "submission_stamped.py")
    with open(dst, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location("submission_stamped", dst)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["submission_stamped"] = mod
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--shapes", default="")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    p = load(".")
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def stamp_kernel(ptr):
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [tl.program_id(0)],
                                      dtype=tl.int64, is_pure=False, pack=1)
        tl.store(ptr, t)

    tmp = tempfile.mkdtemp()
    S = patched_submission(os.path.join(ROOT, "submission.py"), tmp)
    flush = p.utils.L2Flush()
    wanted = {tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s}
    lines = []
    for case in p.cases:
        b, kv = case.args["batchsize"], case.args["kvseqlen"]
        if wanted and (b, kv) not in wanted:
            continue
        plan = S.plan_for(b, kv, case.args["qseqlen"])
        if plan[5] != S.KERNEL_GLUON:
            lines.append(f"{b}x{kv}: plan {plan} is not the Gluon kernel; skipped")
            continue
        q, kv_data, qo_indptr, kv_indptr, config = p.utils.clone_data(p.reference.generate_input(**case.args))
        splits = plan[2]
        programs = q.shape[0] * splits
        S.STAMPS = torch.zeros(programs * 10, dtype=torch.int64, device="cuda")
        marks = torch.zeros(2, dtype=torch.int64, device="cuda")
        for _ in range(3):
            S._launch(q, kv_data, kv_indptr, config, plan)
        per_call = []
        for _ in range(args.calls):
            S.STAMPS.zero_()
            torch.cuda.synchronize()
            flush()
            hold_gpu(2e-3)
            stamp_kernel[(1,)](marks[0:])
            S._launch(q, kv_data, kv_indptr, config, plan)
            stamp_kernel[(1,)](marks[1:])
            torch.cuda.synchronize()
            t0 = marks[0].item()
            stamps = S.STAMPS.view(programs, 10)
            st = ((stamps[:, :9] - t0).double() / 1e3).cpu()
            row = {ph: (st[:, i].min().item(), st[:, i].median().item(), st[:, i].max().item())
                   for i, ph in enumerate(PHASES) if (stamps[:, i] > 0).all()}
            row["after"] = (marks[1].item() - t0) / 1e3
            row["sms"] = len(set(stamps[:, 9].tolist()))
            per_call.append(row)
        med = statistics.median
        head = f"{b}x{kv} plan {plan}: {programs} programs on {per_call[0]['sms']} SMs"
        cells = []
        for ph in (ph for ph in PHASES if ph in per_call[0]):
            lo, mid, hi = (med(r[ph][i] for r in per_call) for i in range(3))
            cells.append(f"{ph} {lo:.1f}/{mid:.1f}/{hi:.1f}")
        cells.append("after %.1f" % med(r["after"] for r in per_call))
        lines.append(head + "\n    " + "  ".join(cells))
    text = "\n".join(lines)
    print("# python tools/timeline_mla.py: us from the stamp kernel before; phase min/median/max over programs, "
          "median over calls\n" + text)
    if args.out:
        with open(os.path.join(args.out, "timeline_mla.log"), "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
