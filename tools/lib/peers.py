"""The peers the bench tools time beside the submissions, on the same inputs and the same clock:
for MLA, FlashMLA's SM90 dense decode (bf16 cache) and the SM90 dense fp8 decode of vLLM's FlashMLA fork
(vllm-project/FlashMLA, from FlashMLA PR #54: the fp8 cache with one scale per tensor, as the problem's);
for the paged kit, DeepGEMM's SM90 fp8 paged MQA logits.

Each is used where it loads: the packages `flash_mla` and `deep_gemm`, and the fork's extension
`_flashmla_extension_C` as vLLM builds it (`vllm._flashmla_extension_C`) or as the library FLASHMLA_FP8_LIB
names. Build them yourself, outside the tree; nothing here builds them. The conversion of a problem's
input into a peer's arguments, and the peer's scheduling metadata, are made once, before timing, as a
serving engine makes them once per batch: the timed call is the peer's kernel launch alone.

    peer, why = mla_peer(data)   # (None, why) where FlashMLA is not there
    out = peer.call()            # (total_q, 16, 512) bf16, as custom_kernel returns
"""
import functools
import importlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

import torch

PAGE = 64  # tokens a cache page holds: FlashMLA's page_block_size here, the paged kit's block size
HERE = os.path.dirname(os.path.abspath(__file__))
PAGED_PROBLEM = os.path.join(os.path.dirname(os.path.dirname(HERE)), "problems", "paged_mqa_logits")

# A peer's extension can kill the process it runs in (a DeepGEMM build whose C++ runtime differs from
# torch's segfaults in its first call), which would take the bench tool's whole table with it: so its
# first call runs once in a child process, on a small input of the problem, before the tool's own
# process makes it.
PAGED_FIRST_CALL = (
    f"import sys; sys.path[:0] = [{HERE!r}, {PAGED_PROBLEM!r}]\n"
    "import peers, reference\n"
    "peers.paged_peer(reference.generate_input(batch=2, next_n=2, context=300, seed=1), in_child=True)\n"
    "import torch; torch.cuda.synchronize() if torch.cuda.is_available() else None\n")


@functools.cache  # once per process: the bench tools ask for a peer on every shape
def killed_by_first_call(code: str, package: str) -> str:
    """Why running code in a child process killed it (a signal, not an exception), or ''."""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    if run.returncode >= 0:
        return ""
    name = signal.Signals(-run.returncode).name if -run.returncode in signal.valid_signals() else "?"
    return f"{package} killed its process on a small first call ({name})"


@dataclass
class Peer:
    name: str                  # the column the bench tools print
    call: Callable[[], torch.Tensor]
    note: str                  # what the call does differently from the submission's contract, if anything


def pages_of_sequences(rows: torch.Tensor, indptr: torch.Tensor, page: int = PAGE):
    """A contiguous cache of sequences (rows (total, ...), sequence b at rows indptr[b]:indptr[b+1]) as
    whole pages: (cache (n_pages, page, ...), block_table int32 (batch, most pages), lengths int32
    (batch,)). A view of rows where every sequence starts on a page boundary and the total fills whole
    pages; else each sequence is copied into pages of its own (its last page padded with zeros)."""
    starts = indptr[:-1].long().cpu()
    lengths = (indptr[1:] - indptr[:-1]).to(torch.int32)
    n_pages = (lengths.long().cpu() + page - 1) // page
    most = max(int(n_pages.max()) if len(n_pages) else 0, 1)
    table = torch.zeros(len(n_pages), most, dtype=torch.int32)
    total = rows.shape[0]
    if bool((starts % page == 0).all()) and total % page == 0:
        cache = rows.view(total // page, page, *rows.shape[1:])
        for b, (s, n) in enumerate(zip(starts.tolist(), n_pages.tolist())):
            table[b, :n] = torch.arange(s // page, s // page + n, dtype=torch.int32)
    else:
        cache = rows.new_zeros(int(n_pages.sum()), page, *rows.shape[1:])
        first = 0
        for b, (s, n) in enumerate(zip(starts.tolist(), n_pages.tolist())):
            length = int(lengths[b])
            cache.view(-1, *rows.shape[1:])[first * page:first * page + length] = rows[s:s + length]
            table[b, :n] = torch.arange(first, first + n, dtype=torch.int32)
            first += n
    return cache, table.to(rows.device), lengths.to(rows.device)


def one_query_length(qo_indptr):
    """The query length every sequence has (FlashMLA's decodes take one per batch), or None."""
    q_lens = (qo_indptr[1:] - qo_indptr[:-1]).unique()
    return int(q_lens[0]) if len(q_lens) == 1 else None


def mla_peer(data):
    """FlashMLA's dense decode over the bf16 cache (its SM90 kernel reads bf16 only), or (None, why)."""
    try:
        import flash_mla
    except ImportError as e:
        return None, f"flash_mla does not import ({e})"
    q, kv_data, qo_indptr, kv_indptr, config = data
    batch = len(kv_indptr) - 1
    if (q_len := one_query_length(qo_indptr)) is None:
        return None, "FlashMLA takes one query length for the whole batch"
    cache, table, lengths = pages_of_sequences(kv_data["bf16"], kv_indptr)  # (pages, 64, 1, 576)
    q4 = q.view(batch, q_len, q.shape[1], q.shape[2])
    # The interface of 2025 takes (lengths, q rows per kv head, kv heads) and returns the metadata and
    # the splits; the later one takes nothing and fills its metadata on the first call. Both accept this.
    metadata, splits = flash_mla.get_mla_metadata(lengths, q_len * q.shape[1], 1)

    def call():
        out, _lse = flash_mla.flash_mla_with_kvcache(q4, cache, table, lengths, config["v_head_dim"], metadata,
                                                     splits, softmax_scale=config["sm_scale"], causal=False)
        return out.view(batch * q_len, q.shape[1], config["v_head_dim"])

    call()  # the later interface makes its metadata here, untimed
    return Peer("FlashMLA (bf16)", call, ""), ""


FP8_PEER_LIBRARY = "FLASHMLA_FP8_LIB"  # the environment variable naming a build of the fork's extension


def flashmla_fp8_ops():
    """The ops of vLLM's FlashMLA fork's dense fp8 decode (torch.ops._flashmla_extension_C), from vLLM's
    build or the library FP8_PEER_LIBRARY names; (ops, '') or (None, why)."""
    try:
        importlib.import_module("vllm._flashmla_extension_C")  # registers the ops
    except ImportError as e:
        path = os.environ.get(FP8_PEER_LIBRARY)
        if not path:
            return None, f"vllm._flashmla_extension_C does not import ({e}) and {FP8_PEER_LIBRARY} is not set"
        try:
            torch.ops.load_library(path)
        except (OSError, RuntimeError) as e:
            return None, f"{FP8_PEER_LIBRARY}={path} does not load ({e})"
    ops = torch.ops._flashmla_extension_C
    missing = [name for name in ("fwd_kvcache_mla_fp8", "get_mla_decoding_metadata_dense_fp8")
               if not hasattr(ops, name)]
    return (None, f"_flashmla_extension_C has no {', '.join(missing)}") if missing else (ops, "")


def quantize_per_tensor_fp8(x: torch.Tensor):
    """x as e4m3 with one scale (x ~= values * scale, scale = amax / 448): reference.quantize_fp8's form, the
    problem's fp8 cache (a test holds the two equal; peers.py takes no problem's module)."""
    scale = (x.abs().amax().float() / 448).clamp(min=1e-12)
    return (x.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale.reshape(1)


def mla_fp8_peer(data):
    """The fork's dense fp8 decode over the problem's fp8 cache (e4m3, one scale: its descale_k), with q
    quantized to e4m3 per tensor once, before timing (its kernel reads fp8 q only; a serving engine
    quantizes q in each step, a kernel over 18 KB a query row not timed here); or (None, why)."""
    ops, why = flashmla_fp8_ops()
    if ops is None:
        return None, why
    q, kv_data, qo_indptr, kv_indptr, config = data
    batch = len(kv_indptr) - 1
    if (q_len := one_query_length(qo_indptr)) is None:
        return None, "the fp8 decode takes one query length for the whole batch"
    values, k_scale = kv_data["fp8"]
    cache, table, lengths = pages_of_sequences(values, kv_indptr)  # (pages, 64, 1, 576) e4m3
    q8, q_scale = quantize_per_tensor_fp8(q)
    q4 = q8.view(batch, q_len, q.shape[1], q.shape[2])
    metadata, splits = ops.get_mla_decoding_metadata_dense_fp8(lengths, q_len * q.shape[1], 1)
    k_scale = k_scale.float().reshape(1).contiguous()

    def call():
        out, _lse = ops.fwd_kvcache_mla_fp8(q4, cache, config["v_head_dim"], lengths, table, config["sm_scale"],
                                            False, metadata, splits, q_scale, k_scale)
        return out.view(batch * q_len, q.shape[1], config["v_head_dim"])

    call()
    return Peer("FlashMLA fork (fp8)", call, "q quantized to fp8 per tensor before timing"), ""


def paged_context_lens_2d(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """The problem's context lengths (row b * next_n + i sees positions t <= len_b - next_n + i) in
    DeepGEMM's 2-D form (row (b, i) sees positions t < lens[b, i])."""
    steps = torch.arange(next_n, device=context_lens.device, dtype=torch.int32)
    return (context_lens.to(torch.int32).unsqueeze(1) - next_n + 1 + steps).clamp(min=0).contiguous()


def paged_peer(data, in_child=False):
    """DeepGEMM's fp8 paged MQA logits over the fp8 pair (its SM90 kernel reads fp8 only), or (None, why).
    Its 1-D context lengths mean what the problem's mean; where its build takes only the 2-D form, that
    form is used, which leaves the positions past each row's length unwritten (the problem asks for -inf
    there): the note says so, and such a call writes fewer bytes than the submission must. Unless
    in_child, the first call is made in a child process first (PAGED_FIRST_CALL): one that kills it
    costs the column, not the tool."""
    try:
        import deep_gemm
    except ImportError as e:
        return None, f"deep_gemm does not import ({e})"
    if not in_child and (why := killed_by_first_call(PAGED_FIRST_CALL, "deep_gemm")):
        return None, why
    q, kv_cache, weights, context_lens, block_tables, max_model_len = data
    q8, kv8 = q["fp8"], kv_cache["fp8"]
    next_n = q8.shape[1]
    logits = deep_gemm.fp8_paged_mqa_logits
    sms = deep_gemm.get_num_sms()
    lens_1d = context_lens.to(torch.int32).contiguous()
    try:
        meta = deep_gemm.get_paged_mqa_logits_metadata(lens_1d, PAGE, sms)
        logits(q8, kv8, weights, lens_1d, block_tables, meta, max_model_len, True)
        lens, clean, note = lens_1d, True, ""
    except RuntimeError:  # this build's metadata takes 2-D lengths only, and cleans only 1-D ones
        lens = paged_context_lens_2d(lens_1d, next_n)
        meta = deep_gemm.get_paged_mqa_logits_metadata(lens, PAGE, sms)
        clean, note = False, "2-D context lengths: positions past a row's length are not written"

    def call():
        return logits(q8, kv8, weights, lens, block_tables, meta, max_model_len, clean)

    call()
    return Peer(f"DeepGEMM {getattr(deep_gemm, '__version__', '(version unknown)')} (fp8)", call, note), ""
