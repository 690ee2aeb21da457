"""Weight-only int4 linear layers: group-wise asymmetric quantization (like llama.cpp's Q4_1), packing, references.

A weight `[N, K]` is cut into groups of `GROUP` (32) input features per output
channel; each group gets a scale `d` and a minimum `m` (fp16, as Q4_1 stores
them) with `w ~ d * q + m`, `q` in 0..15 (round to nearest, `d = (max - min) / 15`).
`in_features` that are not a multiple of 32 are padded with zero columns (an
input is padded with zeros the same way, so the padding adds nothing).

Packed for the compiled kernel (`csrc/int4_linear.cpp`) as one byte stream per
strip of 16 output channels, `[N_pad / 16, K_pad / 32, BLOCK_BYTES]` uint8: each
group's 320-byte block is 4 x 64 bytes of nibbles (64 bytes hold 16 channels x
8 k: byte `4 c + b` holds k `8 j + b` in its low nibble and `8 j + 4 + b` in its
high nibble, for the j-th 64 bytes), then `d` and `m` as 16 fp16 each. A strip
is read front to back, once per call.

Inputs are quantized per row and group of 32 to int16 (`quantize_activations`:
`s = max|x| / 32767`, `xq = round(x / s)`), so the kernel's products are exact
integers (`csrc/int4_linear.cpp`: 32 per instruction, no float conversion per
weight) and a row's result is the same whatever the rows beside it (batch
invariant). The step `max|x| / 32767` moves a layer's output by ~1e-5, far
below the int4 weights' own error. (int8 inputs per group, as llama.cpp's Q8_1,
were tried first and dropped: a group holding one large activation rounds its
small ones to a step of `max|x| / 127`, which moved SmolLM2's layers by up to
1.3% and changed a greedy answer.) `int4_linear_ref` is the reference: the
same activation quantization, dequantized weights, an fp64 matmul.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

GROUP = 32  # input features per scale and minimum
STRIP = 16  # output channels per packed strip
NIBBLE_BYTES = STRIP * GROUP // 2  # 256: one group of a strip's weights
BLOCK_BYTES = NIBBLE_BYTES + 2 * STRIP * 2  # 320: nibbles, then d and m as fp16
FP16_MAX, FP16_TINY = 65504.0, 2.0**-24  # fp16's largest value and smallest (subnormal) step
INT16_MAX = 32767  # activations: round(x / s) with s = max|x| / INT16_MAX per group


@dataclass(frozen=True)
class Int4Weight:
    """A quantized `[out_features, in_features]` weight, packed for the kernel (see the module's docstring)."""

    packed: torch.Tensor  # [N_pad / 16, K_pad / 32, 320] uint8
    out_features: int
    in_features: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    @property
    def padded_in_features(self) -> int:
        return self.packed.shape[1] * GROUP

    def codes(self) -> torch.Tensor:  # [N_pad, K_pad] uint8, 0..15
        strips, groups = self.packed.shape[:2]
        nib = self.packed[..., :NIBBLE_BYTES].reshape(strips, groups, 4, STRIP, 4)  # [s, g, j, c, b]
        both = torch.stack((nib & 15, nib >> 4), dim=4)  # [s, g, j, c, half, b]: k = 8 j + 4 half + b
        return both.permute(0, 3, 1, 2, 4, 5).reshape(strips * STRIP, groups * GROUP)

    def scales(self) -> tuple[torch.Tensor, torch.Tensor]:  # d, m: [N_pad, K_pad / 32] fp32 each
        strips, groups = self.packed.shape[:2]
        tail = self.packed[..., NIBBLE_BYTES:].contiguous().view(torch.float16).float()  # [s, g, 32]
        d, m = (t.permute(0, 2, 1).reshape(strips * STRIP, groups) for t in (tail[..., :STRIP], tail[..., STRIP:]))
        return d, m

    def dequantize(self) -> torch.Tensor:  # [N_pad, K_pad] fp32 (the padding included)
        d, m = self.scales()
        q = self.codes().float().view(d.shape[0], d.shape[1], GROUP)
        return (q * d[..., None] + m[..., None]).view(d.shape[0], -1)


def quantize_int4(weight: torch.Tensor) -> Int4Weight:  # weight: [N, K] float
    """Group-wise asymmetric int4 (round to nearest over each group's min..max), packed for the kernel."""
    n, k = weight.shape
    n_pad, k_pad = -(-n // STRIP) * STRIP, -(-k // GROUP) * GROUP
    w = weight.detach().float().cpu()
    if not bool(w.isfinite().all()) or (w.numel() > 0 and float(w.abs().max()) > FP16_MAX):
        raise ValueError(f"int4: weights must be finite and within fp16's range (|w| <= {FP16_MAX})")
    lo = F.pad(w, (0, k_pad - k), value=float("inf")).view(n, -1, GROUP).amin(dim=2)  # [N, G]
    hi = F.pad(w, (0, k_pad - k), value=float("-inf")).view(n, -1, GROUP).amax(dim=2)
    # NOTE: d and m are rounded to fp16 first, then the codes chosen against the stored values
    m = lo.half()
    d = ((hi - m.float()) / 15).clamp(min=FP16_TINY).half()
    wg = F.pad(w, (0, k_pad - k)).view(n, -1, GROUP)
    q = torch.round((wg - m.float()[..., None]) / d.float()[..., None]).clamp(0, 15).to(torch.uint8)
    q = F.pad(q.view(n, k_pad), (0, 0, 0, n_pad - n))  # [N_pad, K_pad]
    d, m = (F.pad(t, (0, 0, 0, n_pad - n)) for t in (d, m))
    return Int4Weight(_pack(q, d, m), n, k)


def _pack(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """q [N_pad, K_pad] uint8 codes, d and m [N_pad, G] fp16 -> [N_pad / 16, G, 320] uint8 blocks."""
    n_pad, k_pad = q.shape
    strips, groups = n_pad // STRIP, k_pad // GROUP
    q6 = q.view(strips, STRIP, groups, 4, 2, 4).permute(0, 2, 3, 1, 4, 5)  # [s, g, j, c, half, b]
    nibbles = (q6[..., 0, :] | (q6[..., 1, :] << 4)).reshape(strips, groups, NIBBLE_BYTES)
    dm = torch.cat([t.view(strips, STRIP, groups).permute(0, 2, 1) for t in (d, m)], dim=2)  # [s, g, 32] fp16
    return torch.cat((nibbles, dm.contiguous().view(torch.uint8)), dim=2).contiguous()


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K_pad] fp32 -> (xq [M, K_pad / 32, 32] integers as fp32, s [M, K_pad / 32]): x ~ s * xq per group,
    the kernel's operations (an fp32 division, round half to even); an all-zero group has s = 0, xq = 0."""
    xg = x.float().reshape(x.shape[0], -1, GROUP)
    s = xg.abs().amax(dim=2) / INT16_MAX
    xq = torch.where(s[..., None] > 0, torch.round(xg / s[..., None]), torch.zeros((), dtype=torch.float32))
    return xq, s


def int4_linear_ref(
    x: torch.Tensor,  # [M, K]
    weight: Int4Weight,
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [M, N], x's dtype
    """The reference: the kernel's int16 inputs (padded with zeros to the packed groups), dequantized weights,
    an fp64 matmul."""
    n, k_pad = weight.out_features, weight.padded_in_features
    xq, s = quantize_activations(F.pad(x.float(), (0, k_pad - x.shape[1])))
    x_hat = (xq.double() * s.double()[..., None]).view(x.shape[0], k_pad)
    y = F.linear(x_hat, weight.dequantize()[:n].double())
    if bias is not None:
        y = y + bias.double()
    return y.to(x.dtype)
