"""The PyTorch reference backend: runs on any device and dtype, the oracle every other backend is tested against.

Its attention groups a step's decode tokens by context length and gathers
their K/V into workspaces shared by all layers: that plan is built once per
step by `prepare_attention` and travels inside the step's metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from infer.kernels import activation, norm, rotary
from infer.kernels.attention import (
    AttentionMetadata,
    AttentionPlan,
    AttentionSpec,
    paged_attention_ref,
    plan_attention_ref,
)
from infer.kernels.int4 import quantize_int4
from infer.kernels.int8 import quantize_int8
from infer.kernels.int8g import quantize_int8g
from infer.kernels.interface import Kernels
from infer.kernels.packed import LinearWeight, PackedWeight
from infer.kernels.rotary import RotaryAngles

QUANTIZERS: dict[str, Callable[[torch.Tensor], PackedWeight]] = {
    "int8": quantize_int8,
    "int4": quantize_int4,
    "int8g": quantize_int8g,
}


@dataclass(frozen=True)
class PlannedMetadata(AttentionMetadata):
    """A step's attention metadata with the reference attention's plan for it (`plan_attention_ref`)."""

    plan: AttentionPlan

    @classmethod
    def of(cls, meta: AttentionMetadata, plan: AttentionPlan) -> PlannedMetadata:
        return cls(**{f.name: getattr(meta, f.name) for f in fields(AttentionMetadata)}, plan=plan)


def over_rows(x: torch.Tensor, out_features: int, y2: torch.Tensor) -> torch.Tensor:
    """A [rows, out_features] result of a 2-D kernel call back in x's leading dims."""
    return y2.view(*x.shape[:-1], out_features)


class ReferenceKernels(Kernels):
    name = "torch"
    title = "PyTorch reference"

    def prepare_attention(
        self, meta: AttentionMetadata, cache: torch.Tensor, sliding_windows: Iterable[int | None]
    ) -> AttentionMetadata:
        return PlannedMetadata.of(meta, plan_attention_ref(meta, cache, sliding_windows))

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
        plan = meta.plan if isinstance(meta, PlannedMetadata) else None  # None: this call plans alone
        return paged_attention_ref(query, key, value, k_cache, v_cache, meta, spec, plan)

    def apply_rotary(self, x: torch.Tensor, angles: RotaryAngles, out: torch.Tensor | None = None) -> torch.Tensor:
        return rotary.rotate_ref(x, angles, out)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return norm.rms_norm_ref(x, weight, eps)

    def fused_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return norm.fused_add_rms_norm_ref(x, residual, weight, eps)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        return activation.silu_and_mul_ref(x)

    def gelu_tanh_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        return activation.gelu_tanh_and_mul_ref(x)

    def linear(self, x: torch.Tensor, weight: LinearWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(weight, PackedWeight):  # NOTE: also the Triton backend's path for every packed format
            return over_rows(x, weight.out_features, weight.linear_reference(x.reshape(-1, x.shape[-1]), bias))
        return F.linear(x, weight, bias)

    def quantize(self, weight: torch.Tensor, method: str) -> PackedWeight:
        if method not in QUANTIZERS:
            raise ValueError(f"quantization {method!r}: the {self.title} kernels pack {', '.join(QUANTIZERS)} only")
        if self.device.type != "cpu":
            raise ValueError(f"{method} quantization runs on the CPU only")
        return QUANTIZERS[method](weight)
