"""Honest (GPU): exact attention over the bf16 cache with no host reads (uniform sequence lengths), so
that a call is asynchronous as a fast path is (the reference reads indptr on the host). Each call also
spins ~0.2 ms on the GPU: long enough for the judge's clock, which resolves tens of microseconds across
two processes. The GPU hostile submissions build on it."""
import torch
import triton
import triton.language as tl


@triton.jit
def wait_while_equal(ptr, poison):
    """Spins on the GPU while *ptr holds poison (the judge's value for inputs not written yet)."""
    v = tl.load(ptr, volatile=True)
    while v == poison:
        v = tl.load(ptr, volatile=True)


def attention(data):
    q, kv_data, qo_indptr, kv_indptr, config = data
    torch.cuda._sleep(400_000)
    batch = config["batch_size"]
    kv = kv_data["bf16"].float().reshape(batch, -1, 576)
    qf = q.float().reshape(batch, -1, 576)
    p = torch.softmax(qf @ kv.transpose(1, 2) * config["sm_scale"], dim=-1)
    return (p @ kv[..., :512]).reshape(q.shape[0], 16, 512).to(torch.bfloat16)


def custom_kernel(data):
    return attention(data)
