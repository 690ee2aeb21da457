"""The Triton backend: attention, RoPE, RMSNorm and the gated activations as Triton kernels (CUDA, or Triton's
interpreter on CPU tensors under TRITON_INTERPRET=1); `linear` is torch's (cuBLAS) and int8 the reference.

Imported only when this backend is chosen: a process on another backend never imports triton, and tests set
TRITON_INTERPRET=1 before any kernel is defined. The kernels are looked up in their modules at each call.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from infer.kernels import activation_triton, attention_triton, norm_triton, rotary_triton
from infer.kernels.attention import AttentionMetadata, AttentionSpec
from infer.kernels.reference import ReferenceKernels
from infer.kernels.rotary import RotaryAngles


class TritonKernels(ReferenceKernels):
    name = "triton"
    title = "Triton"

    def prepare_attention(
        self, meta: AttentionMetadata, cache: torch.Tensor, sliding_windows: Iterable[int | None]
    ) -> AttentionMetadata:
        return meta  # the kernel reads the block tables itself: no per-step plan

    def paged_attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        spec: AttentionSpec,
    ) -> torch.Tensor:
        return attention_triton.paged_attention_triton(query, key, value, k_cache, v_cache, meta, spec)

    def apply_rotary(self, x: torch.Tensor, angles: RotaryAngles, out: torch.Tensor | None = None) -> torch.Tensor:
        return rotary_triton.apply_rotary_triton(x, angles.positions, angles.cache, out)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return norm_triton.rms_norm_triton(x, weight, eps)

    def fused_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return norm_triton.fused_add_rms_norm_triton(x, residual, weight, eps)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        return activation_triton.silu_and_mul_triton(x)

    def gelu_tanh_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        return activation_triton.gelu_tanh_and_mul_triton(x)
