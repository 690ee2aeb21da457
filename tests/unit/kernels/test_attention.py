"""The PyTorch reference paged attention (kernels/attention.py) on its own."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from infer.kernels import AttentionSpec, attention
from infer.kernels.attention import paged_attention_ref
from tests.helpers.paged_batches import Shape, make_batch


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(6, 2), (4, 4)])
@pytest.mark.parametrize("sliding_window", [None, 12])
def test_sdpa_output_in_cudas_layout(
    monkeypatch: pytest.MonkeyPatch, num_heads: int, num_kv_heads: int, sliding_window: int | None
) -> None:
    # CUDA's flash and memory-efficient SDPA kernels return [batch, heads, q_len, head_dim] with the strides of
    # [batch, q_len, heads, head_dim]; the CPU's are contiguous. The reference must take either (on an H100 its
    # decode path's .view() raised on the first GQA decode).
    batch = make_batch([1, 7, 1, 9], [20, 7, 5, 30], Shape(num_heads, num_kv_heads, 64))
    spec = AttentionSpec(scale=0.125, sliding_window=sliding_window)
    *args, k_cache, v_cache = batch.args()
    expected = paged_attention_ref(*args, k_cache, v_cache, batch.meta, spec)

    def sdpa_in_cuda_layout(*a: Any, **kw: Any) -> torch.Tensor:
        out = F.scaled_dot_product_attention(*a, **kw)
        return out.transpose(1, 2).contiguous().transpose(1, 2)

    monkeypatch.setattr(attention, "F", types.SimpleNamespace(scaled_dot_product_attention=sdpa_in_cuda_layout))
    *args, k_cache, v_cache = batch.args()
    assert torch.equal(paged_attention_ref(*args, k_cache, v_cache, batch.meta, spec), expected)
