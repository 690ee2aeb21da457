"""Weight-only int8 linear layers: per-output-channel symmetric quantization, packing, the reference.

The compiled CPU backend runs `torch.ops.infer_cpu.int8_linear` on an `Int8Weight`; the others this reference.

A weight `[N, K]` becomes int8 `q` and fp32 `scale[N]` with `w ~ scale[:, None] * q`,
`scale = max|w_row| / 127`. The compiled kernel (`csrc/int8_linear.cpp`) reads
`q` packed as `[N_pad / 16, K_pad / 2, 16, 2]`: strips of 16 output channels, k in
pairs. Where the CPU has AVX-512 BF16, it multiplies in bf16 (int8 is exact in
bf16; activations are rounded to bf16) and accumulates in fp32, so that it beats
fp32 at 64 rows as well as at one; elsewhere it computes in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from infer.kernels.packed import STRIP, PackedWeight, bias_arg, channel_of


@dataclass(frozen=True)
class Int8Weight(PackedWeight):
    """A quantized `[out_features, in_features]` weight, packed for the kernel."""

    format_id: ClassVar[int] = 1
    packed: torch.Tensor  # [N_pad / 16, K_pad / 2, 16, 2] int8
    scale: torch.Tensor  # [N_pad] fp32 (0 in padding rows)
    out_features: int
    in_features: int

    def unpack(self) -> torch.Tensor:  # [out_features, in_features] int8
        strips, pairs = self.packed.shape[:2]
        q = self.packed.permute(0, 2, 1, 3).reshape(strips * STRIP, pairs * 2)
        return q[: self.out_features, : self.in_features]

    def dequantize(self) -> torch.Tensor:  # [out_features, in_features] fp32: q * scale
        return self.unpack().float() * self.scale[: self.out_features, None]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:  # [n] -> [n, in_features] fp32
        strip, channel = channel_of(ids, self.out_features)
        q = self.packed[strip, :, channel].reshape(len(strip), 2 * self.packed.shape[1])  # [n, K_pad]
        return q[:, : self.in_features].float() * self.scale[strip * STRIP + channel, None]

    def linear_reference(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return int8_linear_ref(x, self, bias)

    def linear_compiled(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y: torch.Tensor = torch.ops.infer_cpu.int8_linear(x, self.packed, self.scale, bias, self.out_features)
        return y

    def fused_args(self, bias: torch.Tensor | None) -> list[torch.Tensor]:
        return [self.packed, self.scale, bias_arg(bias)]


def quantize_int8(weight: torch.Tensor) -> Int8Weight:  # weight: [N, K] float
    """Per-output-channel symmetric int8 (round to nearest), packed for the kernel."""
    n, k = weight.shape
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [N]
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    n_pad, k_pad = -(-n // STRIP) * STRIP, k + k % 2
    q = F.pad(q, (0, k_pad - k, 0, n_pad - n))
    packed = q.view(n_pad // STRIP, STRIP, k_pad // 2, 2).permute(0, 2, 1, 3).contiguous()
    return Int8Weight(packed, F.pad(scale, (0, n_pad - n)).contiguous(), n, k)


def int8_linear_ref(
    x: torch.Tensor,  # [M, K]
    weight: Int8Weight,
    bias: torch.Tensor | None = None,  # [N]
    bf16_inputs: bool = False,  # round x to bf16 first, as the AVX-512 BF16 kernel does
) -> torch.Tensor:  # [M, N], x's dtype
    """The reference: dequantize, then an fp32 matmul."""
    xf = x.float()
    if bf16_inputs:
        xf = xf.bfloat16().float()
    y = F.linear(xf, weight.unpack().float()) * weight.scale[: weight.out_features]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def kernel_uses_bf16() -> bool:
    """Whether the compiled int8 kernel rounds activations to bf16 (built with AVX-512 BF16)."""
    return bool(torch.ops.infer_cpu.int8_linear_uses_bf16())
