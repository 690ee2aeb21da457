"""The public kernels: each call runs Triton, the compiled CPU kernel or the PyTorch reference (see `backend`).

The Triton modules are imported at the first Triton call, never on the
reference path: a CPU-only process never imports triton, and tests can set
TRITON_INTERPRET=1 before any kernel is defined.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from infer.kernels import activation, attention, cpu, norm, rotary
from infer.kernels.attention import AttentionMetadata, AttentionPlan, AttentionSpec
from infer.kernels.backend import use_cpu_kernels, use_triton
from infer.kernels.rotary import RotaryAngles


def plan_attention(
    meta: AttentionMetadata,
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], any layer's
    sliding_windows: Iterable[int | None],  # every window the model's layers use
) -> AttentionPlan | None:
    """The step's attention plan, once for all layers; None where the kernel needs none (Triton, compiled CPU)."""
    if use_triton(cache) or (use_cpu_kernels(cache) and cpu.supports_attention(cache, cache)):
        return None
    return attention.plan_attention_ref(meta, cache, sliding_windows)


def paged_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    meta: AttentionMetadata,
    spec: AttentionSpec,
    plan: AttentionPlan | None = None,  # from `plan_attention` (None: the reference plans this call alone)
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Write this step's K/V into the cache, then attend each query to its visible context."""
    if use_triton(query):
        from infer.kernels.attention_triton import paged_attention_triton

        return paged_attention_triton(query, key, value, k_cache, v_cache, meta, spec)
    if use_cpu_kernels(query) and cpu.supports_attention(query, k_cache):
        return cpu.paged_attention(query, key, value, k_cache, v_cache, meta, spec)
    return attention.paged_attention_ref(query, key, value, k_cache, v_cache, meta, spec, plan)


def apply_rotary(
    x: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    angles: RotaryAngles,  # the step's positions in one RoPE table (`RotaryAngles.lookup`, once per step)
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]; `x` rotates in place
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Neox (half-split) RoPE at explicit positions; into `out` when given."""
    if use_triton(x):
        from infer.kernels.rotary_triton import apply_rotary_triton

        return apply_rotary_triton(x, angles.positions, angles.cache, out)
    if use_cpu_kernels(x) and cpu.supports_rotary(x, angles.cache, out):
        return cpu.rotary(x, angles.positions, angles.cache, out)
    return rotary.rotate_ref(x, angles, out)


def rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden] or [num_tokens, num_heads, head_dim]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:  # shaped like x
    if use_triton(x):
        from infer.kernels.norm_triton import rms_norm_triton

        return rms_norm_triton(x, weight, eps)
    if use_cpu_kernels(x) and cpu.supports_norm(x, weight):
        return cpu.rms_norm(x, weight, eps)
    return norm.rms_norm_ref(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden]
    residual: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # (normed, new residual), both [num_tokens, hidden]
    if use_triton(x):
        from infer.kernels.norm_triton import fused_add_rms_norm_triton

        return fused_add_rms_norm_triton(x, residual, weight, eps)
    if use_cpu_kernels(x) and cpu.supports_fused_add_norm(x, residual, weight):
        return cpu.fused_add_rms_norm(x, residual, weight, eps)
    return norm.fused_add_rms_norm_ref(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # [num_tokens, 2 * d] -> [num_tokens, d]
    if use_triton(x):
        from infer.kernels.activation_triton import silu_and_mul_triton

        return silu_and_mul_triton(x)
    return activation.silu_and_mul_ref(x)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:  # [num_tokens, 2 * d] -> [num_tokens, d]
    if use_triton(x):
        from infer.kernels.activation_triton import gelu_tanh_and_mul_triton

        return gelu_tanh_and_mul_triton(x)
    return activation.gelu_tanh_and_mul_ref(x)
