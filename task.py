"""Types of the MLA decode problem (same tuple as GPU MODE's amd-mixed-mla, so submissions port)."""
from typing import TypedDict, TypeVar

import torch

# (q, kv_data, qo_indptr, kv_indptr, config)
#   q:         (total_q, num_heads=16, 576) bfloat16
#   kv_data:   {"bf16": Tensor, "fp8": (Tensor, Tensor), "mxfp4": (Tensor, Tensor)}
#   qo_indptr: (batch_size + 1,) int32
#   kv_indptr: (batch_size + 1,) int32
#   config:    dict, see MLAConfig
input_t = TypeVar("input_t", bound=tuple[torch.Tensor, dict, torch.Tensor, torch.Tensor, dict])
# (total_q, num_heads=16, v_head_dim=512) bfloat16
output_t = TypeVar("output_t", bound=torch.Tensor)


class MLAConfig(TypedDict):
    batch_size: int
    num_heads: int
    num_kv_heads: int
    qk_head_dim: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_seq_len: int
    kv_seq_len: int
    sm_scale: float


class TestSpec(TypedDict, total=False):
    batchsize: int
    qseqlen: int
    kvseqlen: int
    ragged: int
    seed: int
