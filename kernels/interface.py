"""The kernel interface: every op a model runs, on one backend chosen once for a device and dtype.

A model holds one `Kernels` (from `select_kernels`, at engine start) and calls
nothing else in `infer.kernels`. How an op runs, and what per-step work its
layers share (the reference attention's plan), is the backend's business:
`prepare_attention` turns the step's metadata into the form its
`paged_attention` reads, once per step, and every layer passes that on.

Backends: `ReferenceKernels` (PyTorch, runs anywhere: the oracle and the
fallback), `CompiledCpuKernels` (C++ kernels built ahead of time, `cpu.py`) and
`TritonKernels` (CUDA, or Triton's interpreter in tests). The last two extend
the reference and fall back to it, op by op, for inputs their kernels do not
take (a bf16 RMSNorm on the CPU, a packed weight under Triton: its `linear_reference`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, ClassVar

import torch

from infer.kernels.attention import AttentionMetadata, AttentionSpec
from infer.kernels.packed import LinearWeight, PackedWeight
from infer.kernels.rotary import RotaryAngles

if TYPE_CHECKING:
    from infer.kernels.fused import DecoderShape, FusedDecoder, LayerWeights


class Kernels(ABC):
    """The ops of one backend for one device and dtype. `name` is the INFER_KERNELS value that picks it."""

    name: ClassVar[str]  # torch | cpu | triton
    title: ClassVar[str]  # how the docs and the log call it

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        self.device, self.dtype = device, dtype

    def __repr__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{self.title} kernels (INFER_KERNELS={self.name}) on {self.device.type} {dtype}"

    # per step
    @abstractmethod
    def prepare_attention(
        self,
        meta: AttentionMetadata,
        cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], any layer's
        sliding_windows: Iterable[int | None],  # every window the model's layers use
    ) -> AttentionMetadata:
        """Once per step, before the first layer: the metadata every layer passes to `paged_attention`."""

    # ops
    @abstractmethod
    def paged_attention(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,  # from `prepare_attention`
        spec: AttentionSpec,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """Write this step's K/V into the cache, then attend each query to its visible context."""

    @abstractmethod
    def apply_rotary(
        self,
        x: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        angles: RotaryAngles,  # the step's positions in one RoPE table (`RotaryAngles.lookup`, once per step)
        out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]; `x` rotates in place
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """Neox (half-split) RoPE at explicit positions; into `out` when given."""

    @abstractmethod
    def rms_norm(
        self,
        x: torch.Tensor,  # [num_tokens, hidden] or [num_tokens, num_heads, head_dim]
        weight: torch.Tensor,  # [hidden]
        eps: float,
    ) -> torch.Tensor:  # shaped like x
        """Normalise in fp32, then scale: `weight * (x / rms(x))`."""

    @abstractmethod
    def fused_add_rms_norm(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        residual: torch.Tensor,  # [num_tokens, hidden]
        weight: torch.Tensor,  # [hidden]
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (normed, new residual), both [num_tokens, hidden]
        """`residual = x + residual`, then RMSNorm of it."""

    @abstractmethod
    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, 2 * d] -> [num_tokens, d]
        """`silu(gate) * up` on a fused gate/up projection."""

    @abstractmethod
    def gelu_tanh_and_mul(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, 2 * d] -> [num_tokens, d]
        """`gelu_tanh(gate) * up` on a fused gate/up projection."""

    @abstractmethod
    def linear(
        self,
        x: torch.Tensor,  # [..., in_features]
        weight: LinearWeight,  # [out_features, in_features], float or packed (`quantize`)
        bias: torch.Tensor | None = None,  # [out_features]
    ) -> torch.Tensor:  # [..., out_features], x's dtype
        """`x @ weight.T + bias` for any weight format this backend packs."""

    @abstractmethod
    def quantize(self, weight: torch.Tensor, method: str) -> PackedWeight:  # weight: [out_features, in_features]
        """`weight` in the packed format of `method` (int8, int4, int8g), as this backend's `linear` reads it."""

    # per model
    def fuse_decoder(self, shape: DecoderShape, layers: Sequence[LayerWeights]) -> FusedDecoder | None:
        """Once, at load: every decoder layer as one call (`fused.py`), or None where this backend has no
        fused stack or it does not take these layers; the model then runs its layers op by op."""
        return None
