"""Honest: exact attention over the MXFP4 cache."""
import torch
from reference import dequantize_cache, exact_attention


def custom_kernel(data):
    q, kv_data, qo_indptr, kv_indptr, config = data
    kv = dequantize_cache(kv_data, "mxfp4")
    return exact_attention(q, kv, qo_indptr, kv_indptr, config["sm_scale"]).to(torch.bfloat16)
