"""Types of the paged MQA logits problem (DeepGEMM's fp8_fp4_paged_mqa_logits, the DSA indexer's scorer).

input_t = (q, kv_cache, weights, context_lens, block_tables, max_model_len)
  q:            {"fp8": Tensor (batch, next_n, 64, 128) float8_e4m3fn,                  # no scale
                 "fp4": (Tensor (batch, next_n, 64, 64) uint8,   # packed E2M1, low nibble = even element
                         Tensor (batch, next_n, 64, 4) uint8)}   # UE8M0 scale per group of 32 elements
  kv_cache:     {"fp8": Tensor (num_blocks, 64, 1, 132) uint8,  # per block: 64x128 e4m3 values, then 64 fp32 scales
                 "fp4": Tensor (num_blocks, 64, 1, 68) uint8}   # per block: 64x64 packed E2M1, then 64x4 UE8M0 scales
  weights:      Tensor (batch * next_n, 64) float32             # row r = b * next_n + i
  context_lens: Tensor (batch,) int32
  block_tables: Tensor (batch, max_model_len // 64) int32       # logical page -> physical block
  max_model_len: int                                            # output width, a multiple of 64 here
output_t = Tensor (batch * next_n, max_model_len) float32      # -inf outside each row's causal window

README.md has the exact byte layouts and the accuracy rule.
"""
from typing import TypedDict, TypeVar

import torch

input_t = TypeVar("input_t", bound=tuple[dict, dict, torch.Tensor, torch.Tensor, torch.Tensor, int])
output_t = TypeVar("output_t", bound=torch.Tensor)


class TestSpec(TypedDict, total=False):
    batch: int      # sequences
    next_n: int     # query (draft) positions per sequence: 1, 2 or 4
    context: int    # average context length (tokens)
    random: int     # 1: lengths uniform in [0.7, 1.3] x context; 0: all equal to context
    seed: int
