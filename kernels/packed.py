"""What every packed weight format is: one class per format (`PackedWeight`), and what the formats share.

A format owns its packing, its dequantized view, its reference linear, its compiled op and the arguments the
fused stack takes, so that `Kernels.linear` and the fused stack dispatch through the object and never ask which
format they hold. The formats: `Int8Weight` (int8.py, per channel), `Int4Weight` and `Int5Weight` (int4.py,
groups of 32, fp16, fp32 or two-level scales), `Int6Weight` (int6.py, Q6_K's groups of 16, two-level scales) and
`Int8GroupWeight` (int8g.py, groups of 16 or 32, the same three).

Scales (and minimums) per group are stored one of three ways (`scale_dtype`): fp16 (GGUF's Q4_0, Q8_0...),
fp32 (exact for any product), or two-level as K-quants ship them (`SuperScales`, `scale_dtype` int8): per strip of
16 channels and super-block of 256 inputs, 16 fp16 `d_super` (and `m_super`), and per group 16 int8 `d_sub` (and
`m_sub`); a group's scale is the fp32 product `d_super * d_sub` (exact: an fp16 times an 8-bit integer has at
most 19 significant bits), its minimum `m_super * m_sub`. Bytes per weight drop to the file's (Q4_K in int4:
0.578 where fp32 scales take 0.75).

Integer formats quantize their inputs per row and group to int16 (`quantize_activations`: `s = max|x| /
32767`, `xq = round(x / s)`), so the compiled kernels multiply exact integers and a row's result never depends
on the rows beside it; the references take the same inputs and an fp64 matmul.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

STRIP = 16  # output channels per packed strip (every format)
INT16_MAX = 32767  # activations: round(x / s) with s = max|x| / INT16_MAX per group
FP16_MAX, FP16_TINY = 65504.0, 2.0**-24  # fp16's largest value and smallest (subnormal) step
SCALE_DTYPES = (torch.float16, torch.float32)  # how a grouped format may store its scales and minimums
SUPER = 256  # inputs per super-block of two-level scales (K-quants' QK_K)
SUPER_SCALES = torch.int8  # `scale_dtype` of two-level scales: int8 per group times fp16 per super-block
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


# a linear layer's weight: float [out_features, in_features], or a packed format (`PackedWeight`: int8, int4,
# int8g), which runs itself (its reference, compiled op and fused-stack arguments); a new format is a new class
LinearWeight = torch.Tensor | PackedWeight


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


@dataclass(frozen=True)
class SuperScales:
    """K-quants' two-level scales of a `[N, K]` weight in groups of 16 or 32 (G groups a row, K a multiple of
    256): a group's scale is `d_super * d_sub` and its minimum `m_super * m_sub`, both exact fp32 products.
    Q4_K, Q5_K: `d_sub`, `m_sub` the 6-bit sc and m, `m_super = -dmin`; Q6_K: `d_sub` the int8 sc; Q3_K: sc - 32;
    Q2_K: the 4-bit sc and m."""

    d_sub: torch.Tensor  # [N, G] int8: per group
    d_super: torch.Tensor  # [N, K / 256] fp32, each value exactly an fp16
    m_sub: torch.Tensor | None = None  # [N, G] int8, or None (symmetric)
    m_super: torch.Tensor | None = None  # [N, K / 256] fp32 (fp16-exact), or None

    @property
    def has_min(self) -> bool:
        return self.m_sub is not None

    def check(self, n: int, k: int, group: int, what: str) -> None:
        """ValueError unless these fit a `[n, k]` weight in groups of `group` and the two-level form holds them."""
        if k % SUPER != 0:
            raise ValueError(f"{what}: two-level scales need in_features a multiple of {SUPER}, not {k}")
        if (self.m_sub is None) != (self.m_super is None):
            raise ValueError(f"{what}: m_sub and m_super come together")
        for sub, sup in ((self.d_sub, self.d_super), (self.m_sub, self.m_super)):
            if sub is None or sup is None:
                continue
            if sub.dtype != torch.int8 or sub.shape != (n, k // group):
                raise ValueError(f"{what}: d_sub and m_sub must be [{n}, {k // group}] int8, got {sub.dtype} "
                                 f"{tuple(sub.shape)}")  # fmt: skip
            if sup.shape != (n, k // SUPER):
                raise ValueError(f"{what}: d_super and m_super must be [{n}, {k // SUPER}], got {tuple(sup.shape)}")
            if not bool(sup.isfinite().all()) or not torch.equal(sup.float().half().float(), sup.float()):
                raise ValueError(f"{what}: d_super and m_super must be finite and exact in fp16")

    def strip_parts(self, n_pad: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(head [N_pad / 16, K / 256, 32 | 64] uint8: the super-blocks' fp16 d_super then m_super per strip,
        subs: [N_pad / 16, G, 16] uint8 each, the groups' d_sub (then m_sub)); zeros in the padding channels."""

        def by_strip(t: torch.Tensor) -> torch.Tensor:  # [N, X] -> [N_pad / 16, X, 16]
            padded = F.pad(t.cpu(), (0, 0, 0, n_pad - t.shape[0]))
            return padded.view(n_pad // STRIP, STRIP, -1).transpose(1, 2).contiguous()

        head = [by_strip(t.float().half()) for t in (self.d_super, self.m_super) if t is not None]
        subs = [by_strip(t).view(torch.uint8) for t in (self.d_sub, self.m_sub) if t is not None]
        return torch.cat(head, dim=2).view(torch.uint8), subs


def super_scales(head: torch.Tensor, subs: torch.Tensor, has_min: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """head [s, B, 32 | 64] uint8, subs [s, G, 16 | 32] uint8 (as packed: `SuperScales.strip_parts`) -> d, m
    [s, G, 16] fp32: `d_super * d_sub` and `m_super * m_sub` per group, exact (m None when symmetric)."""
    sup = head.contiguous().view(torch.float16).float()  # [s, B, 16 | 32]
    sup = sup.repeat_interleave(subs.shape[1] // head.shape[1], dim=1)  # [s, G, 16 | 32]: per group
    sub = subs.contiguous().view(torch.int8).float()
    d = sup[..., :STRIP] * sub[..., :STRIP]
    return d, (sup[..., STRIP:] * sub[..., STRIP:]) if has_min else None
