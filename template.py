#!POPCORN leaderboard mla-decode-hopper
#!POPCORN gpu H100
"""Start here: MLA decode in plain PyTorch, correct and slow. Make custom_kernel fast; the kit's own fast
path is submission.py. README.md has the inputs, the accuracy rule and what is ranked."""
import torch

from task import input_t, output_t


def custom_kernel(data: input_t) -> output_t:
    q, kv_data, qo_indptr, kv_indptr, config = data
    # q: (total_q, 16, 576) bf16. The cache, (total_kv, 1, 576): kv_data["bf16"]; the same in fp8
    # (values, scale) and MXFP4 (packed, scales) is in kv_data["fp8"] and kv_data["mxfp4"].
    cache = kv_data["bf16"][:, 0].float()
    v_dim, sm_scale = config["kv_lora_rank"], config["sm_scale"]  # 512: V is the first 512 of the 576 dims
    out = torch.empty(q.shape[0], q.shape[1], v_dim, dtype=torch.bfloat16, device=q.device)
    for b in range(config["batch_size"]):
        rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))  # this sequence's query rows
        kv = cache[int(kv_indptr[b]):int(kv_indptr[b + 1])]  # and its cache rows: (length, 576)
        scores = torch.einsum("rhd,td->rht", q[rows].float(), kv) * sm_scale
        out[rows] = torch.einsum("rht,tv->rhv", scores.softmax(-1), kv[:, :v_dim]).to(torch.bfloat16)
    return out
