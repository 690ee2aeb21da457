"""What every packed weight format is: one class per format (`PackedWeight`), and what the formats share.

A format owns its packing, its dequantized view, its reference linear, its compiled op and the arguments the
fused stack takes, so that `Kernels.linear` and the fused stack dispatch through the object and never ask which
format they hold. The formats: `Int8Weight` (int8.py, per channel), `Int4Weight` (int4.py, groups of 32,
fp16 or fp32 scales) and `Int8GroupWeight` (int8g.py, groups of 16 or 32).

Integer formats quantize their inputs per row and group to int16 (`quantize_activations`: `s = max|x| /
32767`, `xq = round(x / s)`), so the compiled kernels multiply exact integers and a row's result never depends
on the rows beside it; the references take the same inputs and an fp64 matmul.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

STRIP = 16  # output channels per packed strip (every format)
INT16_MAX = 32767  # activations: round(x / s) with s = max|x| / INT16_MAX per group
FP16_MAX, FP16_TINY = 65504.0, 2.0**-24  # fp16's largest value and smallest (subnormal) step
SCALE_DTYPES = (torch.float16, torch.float32)  # how a grouped format may store its scales and minimums
NO_TENSOR = torch.empty(0)  # an absent tensor, as the C++ stack reads it


class PackedWeight(ABC):
    """A `[out_features, in_features]` weight in a packed format that a backend's `linear` reads."""

    format_id: ClassVar[int]  # csrc/decoder_stack.cpp: Format (the fused stack's case for this format)
    out_features: int
    in_features: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    @abstractmethod
    def dequantize(self) -> torch.Tensor:  # [out_features, in_features] fp32
        """Exactly the values the format represents (padding stripped)."""

    @abstractmethod
    def rows(self, ids: torch.Tensor) -> torch.Tensor:  # ids: [n] int64 -> [n, in_features] fp32
        """`dequantize()[ids]` without dequantizing the rest (an embedding table kept packed)."""

    @abstractmethod
    def linear_reference(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [M, in_features] -> [M, out_features], x's dtype: the PyTorch reference (any backend's fallback)."""

    @abstractmethod
    def linear_compiled(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [M, in_features] -> [M, out_features], x's dtype: the compiled CPU op (`torch.ops.infer_cpu`)."""

    @abstractmethod
    def fused_args(self, bias: torch.Tensor | None) -> list[torch.Tensor]:
        """(weight, aux, bias): the three tensors the C++ stack's `add_layer` takes for this linear layer."""


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def bias_arg(bias: torch.Tensor | None) -> torch.Tensor:
    """A bias as the C++ stack takes it: fp32, contiguous, or an empty tensor."""
    return NO_TENSOR if bias is None else bias.float().contiguous()


def check_scale_dtype(scale_dtype: torch.dtype) -> None:
    if scale_dtype not in SCALE_DTYPES:
        raise ValueError(f"scales are stored as float16 or float32, not {scale_dtype}")


def stored_scales(t: torch.Tensor, scale_dtype: torch.dtype, what: str) -> torch.Tensor:
    """t [N, G] fp32 as stored (rounded to nearest in fp16); a value that does not fit is refused."""
    if not bool(t.isfinite().all()):
        raise ValueError(f"{what}: scales and minimums must be finite")
    stored = t.to(scale_dtype)
    if not bool(stored.isfinite().all()):
        raise ValueError(f"{what}: a scale or minimum beyond fp16's range (|v| <= {FP16_MAX}); store them as fp32")
    return stored


def channel_of(ids: torch.Tensor, out_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Output channels -> (strip, channel within the strip), for a gather from the packed strips."""
    ids = ids.long().reshape(-1)
    if ids.numel() > 0 and (int(ids.min()) < 0 or int(ids.max()) >= out_features):
        raise IndexError(f"rows: ids must be in 0..{out_features - 1}")
    return torch.div(ids, STRIP, rounding_mode="floor"), ids % STRIP


def quantize_activations(x: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K_pad] fp32 -> (xq [M, K_pad / group, group] integers as fp32, s [M, K_pad / group]): x ~ s * xq per
    group, the kernels' operations (an fp32 division, round half to even); an all-zero group has s = 0, xq = 0."""
    xg = x.float().reshape(x.shape[0], -1, group)
    s = xg.abs().amax(dim=2) / INT16_MAX
    xq = torch.where(s[..., None] > 0, torch.round(xg / s[..., None]), torch.zeros((), dtype=torch.float32))
    return xq, s
