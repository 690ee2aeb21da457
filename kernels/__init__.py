"""Kernels behind one interface each: PyTorch references (the CPU path), Triton on CUDA.

`INFER_KERNELS=auto|torch|triton` chooses the implementation (see `backend`).
"""

from infer.kernels.attention import AttentionMetadata, AttentionPlan, AttentionSpec
from infer.kernels.backend import kernel_backend, set_kernel_backend
from infer.kernels.dispatch import (
    apply_rotary,
    fused_add_rms_norm,
    gelu_tanh_and_mul,
    paged_attention,
    plan_attention,
    rms_norm,
    silu_and_mul,
)
from infer.kernels.rotary import RopeConfig, RotaryAngles, cos_sin_cache

__all__ = [
    "AttentionMetadata",
    "AttentionPlan",
    "AttentionSpec",
    "RopeConfig",
    "RotaryAngles",
    "apply_rotary",
    "cos_sin_cache",
    "fused_add_rms_norm",
    "gelu_tanh_and_mul",
    "kernel_backend",
    "paged_attention",
    "plan_attention",
    "rms_norm",
    "set_kernel_backend",
    "silu_and_mul",
]
