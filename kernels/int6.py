"""Weight-only int6 linear layers: GGUF's Q6_K at the file's 0.8203 bytes per weight (int8g takes 1.0703).

A weight `[N, K]` (K a multiple of 256) is `w = (d_super * d_sub) * (q - 32)` per output channel and group of 16
inputs: `q` in 0..63, `d_sub` int8 per group, `d_super` fp16 per 256 inputs (`packed.SuperScales` without
minimums), the scale the exact fp32 product and `w` one fp32 rounding of it times `q - 32`, as
`gguf.quants.dequantize` computes Q6_K. `pack_int6` packs given codes and scales.

Packed for the compiled kernel (`csrc/int6_linear.cpp`) as one byte stream per strip of 16 output channels,
`[N_pad / 16, K / 256, 3360]` uint8: a super-block is the 16 channels' `d_super` (fp16, 32 bytes), then its 16
groups, each a 208-byte block: 2 x 64 bytes of nibbles (the low 4 bits; byte `4 c + b` of the j-th 64 holds k `8 j
+ b` in its low and `8 j + 4 + b` in its high nibble, as int4's), 64 bytes of top bits (byte `4 c + b` holds at
bits `2 q, 2 q + 1` the top two bits of k `4 q + b`), then the 16 `d_sub` (int8). The kernel unpacks a group to
bytes, 4 consecutive k a channel's 32-bit lane (a shift and two masks per 64 codes). 0.8203 bytes per weight, the
file's; a strip is read front to back, once per call.

Inputs are quantized per row and group of 16 to int16 (`packed.quantize_activations`, as int8g's groups of 16),
so each group's dot product is exact integer arithmetic (the `- 32` folded in as `-32 * sum(xq)`; the kernel
multiplies bytes: `xq = 256 xh + xl`) and a row's result never depends on the rows beside it. `int6_linear_ref`
is the reference: the same inputs, the represented weights, an fp64 matmul.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from infer.kernels.packed import (
    NO_TENSOR,
    STRIP,
    SUPER,
    SUPER_SCALES,
    PackedWeight,
    SuperScales,
    bias_arg,
    channel_of,
    quantize_activations,
    round_up,
    super_scales,
)

GROUP = 16  # input features per scale (Q6_K's sub-block)
OFFSET = 32  # w = d * (q - 32)
NIBBLE_BYTES = STRIP * GROUP // 2  # 128: a group's low 4 bits
HIGH_BYTES = STRIP * 4  # 64: a group's top 2 bits, 4 codes' a byte
BLOCK_BYTES = NIBBLE_BYTES + HIGH_BYTES + STRIP  # 208: codes, then 16 int8 d_sub
HEAD_BYTES = STRIP * 2  # 32: a super-block's 16 fp16 d_super
SUPER_GROUPS = SUPER // GROUP  # 16
SUPER_BYTES = HEAD_BYTES + SUPER_GROUPS * BLOCK_BYTES  # 3360


@dataclass(frozen=True)
class Int6Weight(PackedWeight):
    """A `[out_features, in_features]` int6 weight, packed for the kernel (see the module's docstring)."""

    format_id: ClassVar[int] = 5
    packed: torch.Tensor  # [N_pad / 16, K / 256, 3360] uint8
    out_features: int
    in_features: int

    @property
    def scale_dtype(self) -> torch.dtype:  # always two-level, as the other formats name it
        return SUPER_SCALES

    @property
    def padded_in_features(self) -> int:
        return self.packed.shape[1] * SUPER

    def codes(self) -> torch.Tensor:  # [N_pad, K] uint8, 0..63
        return _codes(self.packed).reshape(-1, self.padded_in_features)

    def scales(self) -> torch.Tensor:  # [N_pad, K / 16] fp32: d_super * d_sub
        return _scales(self.packed).reshape(-1, self.padded_in_features // GROUP)

    def dequantize(self) -> torch.Tensor:  # [out_features, in_features] fp32
        return self.dequantize_padded()[: self.out_features]

    def dequantize_padded(self) -> torch.Tensor:  # [N_pad, K] fp32: `d * (q - 32)`, one fp32 rounding
        return _values(self.codes(), self.scales())

    def rows(self, ids: torch.Tensor) -> torch.Tensor:  # [n] -> [n, in_features] fp32
        strip, channel = channel_of(ids, self.out_features)
        blocks = self.packed[strip]  # [n, K / 256, 3360]: the strips of the rows asked for
        pick = torch.arange(blocks.shape[0])
        return _values(_codes(blocks)[pick, channel], _scales(blocks)[pick, channel])

    def linear_reference(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return int6_linear_ref(x, self, bias)

    def linear_compiled(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y: torch.Tensor = torch.ops.infer_cpu.int6_linear(x, self.packed, bias, self.out_features)
        return y

    def fused_args(self, bias: torch.Tensor | None) -> list[torch.Tensor]:
        return [self.packed, NO_TENSOR, bias_arg(bias)]  # the scales live in the packed blocks


def _groups(blocks: torch.Tensor) -> torch.Tensor:  # [s, B, 3360] -> [s, G, 208]: the heads dropped
    return blocks[..., HEAD_BYTES:].reshape(blocks.shape[0], -1, BLOCK_BYTES)


def _codes(blocks: torch.Tensor) -> torch.Tensor:  # [s, B, 3360] uint8 -> [s, 16, K] uint8, 0..63
    groups = _groups(blocks)
    strips, num_groups = groups.shape[:2]
    nib = groups[..., :NIBBLE_BYTES].reshape(strips, num_groups, 2, STRIP, 4)  # [s, g, j, c, b]
    low = torch.stack((nib & 15, nib >> 4), dim=-2)  # [s, g, j, c, half, b]: k = 8 j + 4 half + b
    low = low.permute(0, 3, 1, 2, 4, 5).reshape(strips, STRIP, num_groups * GROUP)
    top = groups[..., NIBBLE_BYTES : NIBBLE_BYTES + HIGH_BYTES].reshape(strips, num_groups, STRIP, 1, 4)
    by_k = (top >> (2 * torch.arange(4, dtype=torch.uint8)).view(4, 1)) & 3  # [s, g, c, q, b]: k = 4 q + b
    return low | (by_k.transpose(1, 2) << 4).reshape(strips, STRIP, num_groups * GROUP)


def _scales(blocks: torch.Tensor) -> torch.Tensor:  # [s, B, 3360] -> [s, 16, G] fp32
    d, _ = super_scales(blocks[..., :HEAD_BYTES], _groups(blocks)[..., NIBBLE_BYTES + HIGH_BYTES :], has_min=False)
    return d.transpose(1, 2)


def _values(codes: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """codes [..., K], d [..., K / 16] -> [..., K] fp32: `d * (q - 32)`, one fp32 rounding (gguf's)."""
    q = (codes.to(torch.int16) - OFFSET).float().reshape(*d.shape, GROUP)
    return (d[..., None] * q).reshape(codes.shape)


def pack_int6(
    codes: torch.Tensor,  # [N, K] uint8, 0..63; K a multiple of 256
    scales: SuperScales,  # groups of 16, no minimums (Q6_K's)
) -> Int6Weight:
    """Given codes and two-level scales (`w = (d_super * d_sub) * (q - 32)` per group of 16), packed with the
    scales as the file has them; ValueError where they do not fit."""
    if codes.dim() != 2 or codes.dtype != torch.uint8 or (codes.numel() > 0 and int(codes.max()) > 63):
        raise ValueError("int6: codes must be [N, K] uint8 in 0..63")
    n, k = codes.shape
    scales.check(n, k, GROUP, "int6")
    if scales.has_min:
        raise ValueError("int6: symmetric (Q6_K's): no minimums")
    n_pad = round_up(n, STRIP)
    strips, supers = n_pad // STRIP, k // SUPER
    head, (subs,) = scales.strip_parts(n_pad)
    q = F.pad(codes.cpu(), (0, 0, 0, n_pad - n))  # [N_pad, K]: zero codes in the padding channels
    groups = torch.cat((_nibble_bytes(q), _top_bytes(q), subs), dim=2)  # [s, G, 208]
    packed = torch.cat((head, groups.view(strips, supers, -1)), dim=2).contiguous()
    return Int6Weight(packed, n, k)


def _nibble_bytes(q: torch.Tensor) -> torch.Tensor:  # [N_pad, K] uint8 codes -> [N_pad / 16, G, 128] uint8
    strips, groups = q.shape[0] // STRIP, q.shape[1] // GROUP
    q6 = (q & 15).view(strips, STRIP, groups, 2, 2, 4).permute(0, 2, 3, 1, 4, 5)  # [s, g, j, c, half, b]
    return (q6[..., 0, :] | (q6[..., 1, :] << 4)).reshape(strips, groups, NIBBLE_BYTES)


def _top_bytes(q: torch.Tensor) -> torch.Tensor:  # [N_pad, K] uint8 codes -> [N_pad / 16, G, 64] uint8
    """The top two bits of each group's codes as the kernel reads them: byte `4 c + b`, bits `2 q` for k `4 q + b`."""
    strips, groups = q.shape[0] // STRIP, q.shape[1] // GROUP
    high = (q >> 4).view(strips, STRIP, groups, 4, 4)  # [s, c, g, q, b]
    top = (high << (2 * torch.arange(4, dtype=torch.uint8)).view(4, 1)).sum(dim=3, dtype=torch.uint8)  # [s, c, g, b]
    return top.transpose(1, 2).reshape(strips, groups, HIGH_BYTES)


def int6_linear_ref(
    x: torch.Tensor,  # [M, K]
    weight: Int6Weight,
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [M, N], x's dtype
    """The reference: the kernel's int16 inputs (groups of 16), the represented weights, an fp64 matmul."""
    xq, s = quantize_activations(x.float(), GROUP)
    x_hat = (xq.double() * s.double()[..., None]).view(x.shape[0], -1)
    y = F.linear(x_hat, weight.dequantize().double())
    if bias is not None:
        y = y + bias.double()
    return y.to(x.dtype)
