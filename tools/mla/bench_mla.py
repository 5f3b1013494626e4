"""Benchmark submission.py's MLA decode on the GPU (H200).

Per benchmark shape: correctness against exact fp32 attention over the KV format the plan
reads (relative L2 error, and reference.check_implementation), then the time of one
custom_kernel call (GPU time as eval.py ranks it: the judge's L2 flush, the call queued behind a
hold; median of --reps), achieved bandwidth for the bytes that must move
(cache in that format + q + output) against 4.2 TB/s, the peers' times on the same input and clock where
they load (tools/lib/peers.py: FlashMLA's bf16 decode, the FlashMLA fork's fp8 decode), each peer's error,
the reference's time, and geometric means; then a picture of the table (tools/lib/results_plot.py). Also
dumps the SASS of every compiled kernel and counts UTMALDG / HGMMA / QGMMA / HMMA.

    python tools/mla/bench_mla.py [--out results/mla_h200.md] [--plot results/mla_h200.png]
                              [--sass FILE] [--reps 20] [--no-ref] [--no-peer] [--peers-from TEXT]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch
import triton

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import reference as R  # noqa: E402
import submission as S  # noqa: E402

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib")]
import peers  # noqa: E402
import results_plot  # noqa: E402
from problem_loader import PEAK_BW, geomean, median_gpu_us, results_stamp  # noqa: E402

SHAPES = [(b, kv, 1) for b in (4, 32, 64, 256) for kv in (1024, 8192)]
# The peers' columns: (key, name in the table and picture, the cache format whose floor it is drawn
# against, its factory in tools/lib/peers.py)
PEERS = (("peer", "FlashMLA (bf16 cache)", "bf16", peers.mla_peer),
         ("fp8_peer", "FlashMLA fork (fp8 cache)", "fp8", peers.mla_fp8_peer))


def time_call(fn, reps=20, warmup=3):
    """Median ms of fn(): the judge's L2 flush before each call, the call queued behind a hold (GPU
    time, as eval.py ranks it; problem_loader.median_gpu_us, which warms the GPU with the call itself)."""
    return median_gpu_us(fn, reps, warmup) / 1e3


def bytes_moved(data, fmt):
    q, kv_data, _, kv_indptr, _ = data
    total_kv = int(kv_indptr[-1])
    return total_kv * S.FMT_BYTES_PER_TOKEN[fmt] + q.numel() * 2 + q.shape[0] * 16 * 512 * 2


def rel_err(data, out, fmt):
    q, kv_data, qo, kvp, cfg = data
    ref = R.exact_attention(q, R.dequantize_cache(kv_data, fmt), qo, kvp, cfg["sm_scale"])
    return R.compare(out, ref)["rel_l2"]


def sass_counts(dump_path=None):
    """{kernel + constexprs + launch options: counts} for every kernel the submission compiled
    (submission.compiled_kernels()); the SASS itself is appended to dump_path."""
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    rows = {}
    for (fname, consts, warps, stages, _dev), k in S.compiled_kernels().items():
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True).stdout
        c = {str(n): (v.__name__ if hasattr(v, "__name__") else str(v)) for n, v in consts}
        name = f"{fname} {c} warps={warps} stages={stages}"
        counts = {op: sass.count(op) for op in ("UTMALDG", "HGMMA", "QGMMA", "HMMA", "LDL", "STL")}
        counts["regs"] = getattr(k, "n_regs", None)
        counts["spills"] = getattr(k, "n_spills", None)
        rows[name] = counts
        if dump_path:
            with open(dump_path, "a") as f:
                f.write(f"\n\n===== {name} =====\n{sass}")
    return rows


def host_breakdown():
    """Wall-clock host cost (us/call, 200 calls, no sync) of the pieces of the host path."""
    data = R.generate_input(4, 1, 1024, 7)
    q, kv_data, qo, kvp, cfg = data
    plan = S.plan_for(4, 1024, 1)
    base = kv_data[plan[0]][0] if plan[0] != "bf16" else kv_data["bf16"]
    route, _ = S._make_route(q, kv_data, kvp, cfg, plan)
    fmt = plan[0]
    pieces = {
        "torch.empty(out)": lambda: torch.empty((4, 16, 512), dtype=torch.bfloat16, device="cuda"),
        "2 TensorDescriptors": lambda: (S.TensorDescriptor(base, [base.shape[0], base.shape[-1]], [base.shape[-1], 1], [64, 64]),
                                        S.TensorDescriptor(base, [base.shape[0], base.shape[-1]], [base.shape[-1], 1], [64, 32])),
        "full checks (_fast_path_problem, first call only)": lambda: S._fast_path_problem(q, kv_data, qo, kvp, cfg, fmt),
        "signature (_signature)": lambda: S._signature(q, kv_data, kvp, cfg, fmt),
        "Triton JIT launch path (_launch)": lambda: S._launch(q, kv_data, kvp, cfg, plan),
        "route (direct launches)": lambda: route(q, kv_data, kvp),
        "custom_kernel": lambda: S.custom_kernel(data),
    }
    out = []
    for name, fn in pieces.items():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        out.append(f"host {name}: {(t1 - t0) / 200 * 1e6:.1f} us/call")
    return out


def ragged_checks():
    """Ragged lengths (incl. 1), q_seq_len 2 and every format/kernel, through both the JIT
    and the direct launch path; returns lines 'ok/FAIL ...'."""
    out = []
    for batch, qlen, kv in ((8, 1, 300), (5, 2, 777), (3, 4, 70)):
        data = R.generate_input(batch, qlen, kv, 5, ragged=1)
        q, kv_data, qo, kvp, cfg = data
        for plan in (("mxfp4", 64, 3, 8, 3, 0), ("mxfp4", 64, 1, 4, 2, 1), ("mxfp4", 32, 4, 4, 3, 1),
                     ("fp8", 64, 2, 8, 3, 0), ("fp8", 64, 1, 4, 2, 1), ("bf16", 64, 3, 8, 3, 0), ("bf16", 64, 1, 4, 2, 1),
                     ("fp8", 64, 1, 4, 2, 2), ("fp8", 64, 5, 4, 2, 2)):
            route, o = S._make_route(q, kv_data, kvp, cfg, plan)  # JIT launch; route checked bitwise
            o2 = route(q, kv_data, kvp) if route else o
            torch.cuda.synchronize()
            err = max(rel_err(data, o, plan[0]), rel_err(data, o2, plan[0]))
            ok = err < 0.01 and bool(route) and torch.equal(o, o2)
            out.append(f"{'ok' if ok else 'FAIL'} ragged batch {batch} q {qlen} kv~{kv} {plan}: "
                       f"rel L2 {err:.4f}, direct route {'same bits' if ok else 'MISSING/DIFFERENT'}")
    return out


def run_shape(batch, kv, qlen, reps, seed=1234):
    """Correctness then timing of custom_kernel (plan table + host path) on one shape."""
    data = R.generate_input(batch, qlen, kv, seed)
    plan = S.plan_for(batch, kv, qlen)
    S.custom_kernel(data)  # first call compiles through Triton's JIT
    out = S.custom_kernel(data)  # later calls take the direct launch path: check that one
    torch.cuda.synchronize()
    err = rel_err(data, out, plan[0])
    ok, _ = R.check_implementation(data, out)
    ms = time_call(lambda: S.custom_kernel(data), reps)
    return data, plan, err, ok, ms


def not_timed() -> dict:
    """A peer's cells where it was not timed."""
    return dict(ms=float("nan"), err=float("nan"), check="-")


def time_peers(data, batch, kv, reps, notes) -> dict:
    """Per peer (PEERS): its ms, its relative L2 error against the exact result over its cache format, and
    whether the problem's check passes it; nan and a note where it is not there or fails (a peer that
    fails costs its column, never the table)."""
    found = {}
    for key, name, fmt, factory in PEERS:
        found[key] = not_timed()
        try:
            peer, why = factory(data)
            if peer is None:
                notes[key] = f"{name}: not timed, {why}"
                continue
            out = peer.call()
            ok, _ = R.check_implementation(data, out)
            found[key] = dict(ms=time_call(peer.call, reps), err=rel_err(data, out, fmt),
                              check="ok" if ok else "FAIL")
            if peer.note:
                notes.setdefault(key, f"{name}: {peer.note}")  # a failure on an earlier shape stays said
        except Exception as e:
            notes[key] = f"{name}: failed on {batch} x {kv}: {type(e).__name__}: {str(e)[:200]}"
            print(notes[key], flush=True)
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "mla_h200.md"))
    ap.add_argument("--plot", default=os.path.join(ROOT, "results", "mla_h200.png"),
                    help="the picture of the table (needs matplotlib)")
    ap.add_argument("--sass", default=None, help="file to write the SASS of every kernel to")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-ref", action="store_true")
    ap.add_argument("--no-peer", action="store_true", help="leave the peers out")
    ap.add_argument("--peers-from", default="not stated",
                    help="what the peers were built from, for the results file (repositories and commits)")
    args = ap.parse_args()
    lines = []
    stamp = results_stamp("python tools/mla/bench_mla.py " + " ".join(sys.argv[1:]))
    hdr = (f"# MLA decode results\n\n{stamp}. ms: median GPU time of {args.reps} calls as eval.py ranks it (the "
           "judge's L2 flush before each, the call queued behind a hold); floor: the bytes the plan's format "
           "must move (cache, q, output) at 4.2 TB/s; FlashMLA: its SM90 dense decode of the bf16 cache; fp8 "
           "peer: the SM90 dense fp8 decode of vLLM's FlashMLA fork over the problem's fp8 cache; each on the "
           "same input and clock, scheduling metadata made before timing (tools/lib/peers.py); a peer's rel L2 "
           f"is against the exact result over its cache format, its check the problem's; peers built from: "
           f"{args.peers_from}\n\n"
           "| batch | kv | plan (fmt, BN, splits, warps, stages, kernel) | rel L2 err | check | ms | floor ms | "
           "floor / ms | GB/s | FlashMLA ms | FlashMLA rel L2 | FlashMLA check | ms / FlashMLA | fp8 peer ms | "
           "fp8 peer rel L2 | fp8 peer check | ms / fp8 peer | ref ms |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines.append(hdr)
    print(hdr)
    rows = []  # per shape, ms: the submission's time and its format's floor, the peers', the reference's
    notes = {"peers": "peers: not timed (--no-peer)"} if args.no_peer else {}
    checks = ragged_checks()
    print("\n".join(checks))
    for batch, kv, qlen in SHAPES:
        data, plan, err, ok, ms = run_shape(batch, kv, qlen, args.reps)
        moved = bytes_moved(data, plan[0])
        floor_ms = moved / PEAK_BW * 1e3
        if args.no_peer:
            found = {key: not_timed() for key, *_ in PEERS}
        else:
            found = time_peers(data, batch, kv, args.reps, notes)
        ref_ms = float("nan")
        if not args.no_ref:
            ref_ms = time_call(lambda d=data: R.ref_kernel(d), reps=3, warmup=1)
        rows.append(dict(shape=f"{batch} x {kv}", ms=ms, floor=floor_ms, ref=ref_ms,
                         problem_floor=R.min_bytes(data) / PEAK_BW * 1e3,
                         **{key: found[key]["ms"] for key, *_ in PEERS},
                         **{key + "_floor": bytes_moved(data, fmt) / PEAK_BW * 1e3 for key, _, fmt, _ in PEERS}))
        row = (f"| {batch} | {kv} | {tuple(plan)} | {err:.4f} | {'ok' if ok else 'FAIL'} | {ms:.4f} | {floor_ms:.4f} | "
               f"{floor_ms / ms:.2f} | {moved / (ms * 1e-3) / 1e9:.0f} | "
               + " | ".join(f"{p['ms']:.4f} | {p['err']:.4f} | {p['check']} | {ms / p['ms']:.2f}"
                            for p in (found[key] for key, *_ in PEERS))
               + f" | {ref_ms:.3f} |")
        lines.append(row)
        print(row, flush=True)
        del data
    if notes:
        lines.append("\n" + "\n".join(f"- {note}" for note in notes.values()))
    lines.append("\n## Ragged / multi-token checks\n\n" + "\n".join(f"- {c}" for c in checks))
    host = host_breakdown()  # back-to-back calls of the smallest shape, no flush, wall clock
    lines.append("\n" + "\n".join(f"- {h}" for h in host))
    print("\n".join(host))

    def column(name):
        return [r[name] for r in rows]
    tail = (f"\ngeometric mean: {geomean(column('ms')):.4f} ms (floor {geomean(column('floor')):.4f} ms, FlashMLA "
            f"{geomean(column('peer')):.4f} ms, fp8 peer {geomean(column('fp8_peer')):.4f} ms, reference "
            f"{geomean(column('ref')):.3f} ms)")
    lines.append(tail)
    print(tail)
    series = {"submission.py": (column("ms"), column("floor"))}
    series.update({name: (column(key), column(key + "_floor")) for key, name, _, _ in PEERS})
    picture = results_plot.draw(args.plot, "MLA decode per benchmark shape (batch x kv): submission.py and peers",
                                column("shape"), series, column("problem_floor"), stamp)
    print(picture)
    try:
        sass = sass_counts(args.sass)
    except Exception as e:  # never lose the timings to a SASS-dump problem
        print("SASS dump failed:", type(e).__name__, e)
        sass = {}
    lines.append("\n## SASS instruction counts per compiled kernel\n")
    lines.append("| kernel | UTMALDG | HGMMA | QGMMA | HMMA | LDL | STL | regs | spills |\n|---|---|---|---|---|---|---|---|---|")
    for name, c in sass.items():
        lines.append(f"| {name} | {c['UTMALDG']} | {c['HGMMA']} | {c['QGMMA']} | {c['HMMA']} | "
                     f"{c['LDL']} | {c['STL']} | {c['regs']} | {c['spills']} |")
    print("\n".join(lines[-len(sass) - 2:]))
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
