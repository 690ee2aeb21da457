"""Kernels behind one interface each: PyTorch references (the CPU path), Triton on CUDA."""

from infer.kernels.activation import gelu_tanh_and_mul_ref as gelu_tanh_and_mul
from infer.kernels.activation import silu_and_mul_ref as silu_and_mul
from infer.kernels.attention import AttentionMetadata, AttentionSpec
from infer.kernels.attention import paged_attention_ref as paged_attention
from infer.kernels.norm import fused_add_rms_norm_ref as fused_add_rms_norm
from infer.kernels.norm import rms_norm_ref as rms_norm
from infer.kernels.rotary import RopeConfig, cos_sin_cache
from infer.kernels.rotary import apply_rotary_ref as apply_rotary

__all__ = [
    "AttentionMetadata",
    "AttentionSpec",
    "RopeConfig",
    "apply_rotary",
    "cos_sin_cache",
    "fused_add_rms_norm",
    "gelu_tanh_and_mul",
    "paged_attention",
    "rms_norm",
    "silu_and_mul",
]
