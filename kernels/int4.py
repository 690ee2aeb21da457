"""Weight-only int4 linear layers: group-wise asymmetric int4 (like llama.cpp's Q4_1), packing, references.

A weight `[N, K]` is cut into groups of `GROUP` (32) input features per output
channel; each group gets a scale `d` and a minimum `m` with `w = d * q + m`, `q`
in 0..15. `quantize_int4` rounds to nearest (`d = (max - min) / 15`, fp16 as Q4_1
stores them); `pack_int4` packs given codes, scales and minimums, stored as fp16
or, exactly, as fp32 (K-quants' scales, `d_super * sc`, need up to 17 bits);
`pack_int4_super` keeps Q4_K's two-level scales as the file has them
(`packed.SuperScales`: `d = d_super * d_sub`, `m = m_super * m_sub` per group).
`in_features` that are not a multiple of 32 are padded with zero codes (an input
is padded with zeros the same way, so the padding adds nothing).

Packed for the compiled kernel (`csrc/int4_linear.cpp`) as one byte stream per
strip of 16 output channels, `[N_pad / 16, K_pad / 32, 320 | 384]` uint8: each
group's block is 4 x 64 bytes of nibbles (64 bytes hold 16 channels x 8 k: byte
`4 c + b` holds k `8 j + b` in its low nibble and `8 j + 4 + b` in its high
nibble, for the j-th 64 bytes), then `d` and `m` as 16 fp16 each (320 bytes) or
16 fp32 each (384 bytes). Two-level scales: `[N_pad / 16, K / 256, 2368]`, a
super-block of 8 groups is the 16 `d_super` then the 16 `m_super` (fp16, 64
bytes), then per group its 256 bytes of nibbles, its 16 `d_sub` and its 16
`m_sub` (int8, 288 bytes). Bytes per weight: 0.625 (fp16), 0.75 (fp32), 0.578
(two-level). A strip is read front to back, once per call.

Inputs are quantized per row and group of 32 to int16 (`packed.quantize_activations`),
so the kernel's products are exact integers (32 per instruction, no float conversion
per weight) and a row's result is the same whatever the rows beside it (batch
invariant). The step `max|x| / 32767` moves a layer's output by ~1e-5, far below
the int4 weights' own error. (int8 inputs per group, as llama.cpp's Q8_1, were
tried first and dropped: a group holding one large activation rounds its small
ones to a step of `max|x| / 127`, which moved SmolLM2's layers by up to 1.3% and
changed a greedy answer.) `int4_linear_ref` is the reference: the same activation
quantization, dequantized weights, an fp64 matmul.

`Int5Weight` is the same with 5-bit codes (0..31, `w = d * q + m`): GGUF's Q5_0 (codes + 16, m = -16 d), Q5_1
and Q5_K at their own 0.6875-0.75 bytes per weight where the 8-bit grouped format would take 1.06-1.08. A
group's block holds its nibbles as above, then its fifth bits (64 bytes: channel c's 32-bit lane holds at bit
`i = 4 j + p` the fifth bit of the k whose nibble the kernel's p-th shift of the j-th 64 bytes puts in a lane's
low int16, and at bit 16 + i that of its high int16: k `8 j + (0, 4, 1, 5)[p]` and `8 j + (2, 6, 3, 7)[p]`),
then its scales: 384 (fp16), 448 (fp32) or, two-level, 64 + 8 x 352 = 2880 bytes a super-block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from infer.kernels.packed import (
    FP16_MAX,
    FP16_TINY,
    INT16_MAX,
    NO_TENSOR,
    STRIP,
    SUPER,
    SUPER_SCALES,
    PackedWeight,
    SuperScales,
    bias_arg,
    channel_of,
    check_scale_dtype,
    quantize_activations,
    round_up,
    stored_scales,
    super_scales,
)

__all__ = [
    "GROUP",
    "INT16_MAX",
    "Int4Weight",
    "Int5Weight",
    "int4_linear_ref",
    "pack_int4",
    "pack_int4_super",
    "pack_int5",
    "pack_int5_super",
    "quantize_activations",
    "quantize_int4",
]

GROUP = 32  # input features per scale and minimum
NIBBLE_BYTES = STRIP * GROUP // 2  # 256: one group of a strip's weights
HIGH_BYTES = STRIP * 4  # 64: int5's fifth bits of a group, a 32-bit lane a channel
SUPER_GROUPS = SUPER // GROUP  # 8 groups a super-block
HEAD_BYTES = 2 * STRIP * 2  # 64: a super-block's fp16 d_super and m_super
_PAIR_LOW, _PAIR_HIGH = (0, 4, 1, 5), (2, 6, 3, 7)  # k - 8 j of the p-th shift's low and high int16
# int5: lane bit b (0..31) holds the fifth bit of k = K_OF_BIT[b]
K_OF_BIT = torch.tensor([8 * (i // 4) + pair[i % 4] for pair in (_PAIR_LOW, _PAIR_HIGH) for i in range(16)])


def code_bytes(bits: int) -> int:  # a group's codes: nibbles (and fifth bits)
    return NIBBLE_BYTES + (HIGH_BYTES if bits == 5 else 0)


def block_bytes(bits: int) -> dict[torch.dtype, int]:
    """A strip's block per group (int4: 320 fp16, 384 fp32; int5: 384, 448), or per super-block of 8 groups
    (int4: 64 + 8 * 288; int5: 64 + 8 * 352), by how scales are stored."""
    codes = code_bytes(bits)
    return {
        torch.float16: codes + 2 * STRIP * 2,
        torch.float32: codes + 2 * STRIP * 4,
        SUPER_SCALES: HEAD_BYTES + SUPER_GROUPS * (codes + 2 * STRIP),
    }


@dataclass(frozen=True)
class Int4Weight(PackedWeight):
    """A `[out_features, in_features]` int4 weight, packed for the kernel (see the module's docstring)."""

    format_id: ClassVar[int] = 2
    bits: ClassVar[int] = 4
    packed: torch.Tensor  # [N_pad / 16, K_pad / 32, 320 | 384] or [N_pad / 16, K / 256, 2368] uint8
    out_features: int
    in_features: int

    @property
    def scale_dtype(self) -> torch.dtype:  # fp16, fp32 or SUPER_SCALES (two-level)
        return next(dtype for dtype, size in block_bytes(self.bits).items() if size == self.packed.shape[2])

    @property
    def padded_in_features(self) -> int:
        return self.packed.shape[1] * (SUPER if self.scale_dtype == SUPER_SCALES else GROUP)

    def codes(self) -> torch.Tensor:  # [N_pad, K_pad] uint8, 0..15 (int5: 0..31)
        return _codes(_groups(self.packed, self.scale_dtype, self.bits), self.bits).reshape(-1, self.padded_in_features)

    def scales(self) -> tuple[torch.Tensor, torch.Tensor]:  # d, m: [N_pad, K_pad / 32] fp32 each
        d, m = _scales(self.packed, self.scale_dtype, self.bits)
        return d.reshape(-1, d.shape[2]), m.reshape(-1, m.shape[2])

    def dequantize(self) -> torch.Tensor:  # [out_features, in_features] fp32
        return self.dequantize_padded()[: self.out_features, : self.in_features]

    def dequantize_padded(self) -> torch.Tensor:  # [N_pad, K_pad] fp32: `codes * d + m`, two fp32 ops (no fma)
        d, m = self.scales()
        return _values(self.codes(), d, m)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:  # [n] -> [n, in_features] fp32
        strip, channel = channel_of(ids, self.out_features)
        blocks = self.packed[strip]  # [n, G | K / 256, block]: the strips of the rows asked for
        pick = torch.arange(blocks.shape[0])
        groups = _groups(blocks, self.scale_dtype, self.bits)  # [n, G, block]
        nib = groups[..., :NIBBLE_BYTES].reshape(*groups.shape[:2], 4, STRIP, 4)[pick, :, :, channel]  # [n, g, j, b]
        codes = _nibbles(nib)
        if self.bits == 5:
            lanes = groups[..., NIBBLE_BYTES : HIGH_BYTES + NIBBLE_BYTES].reshape(*groups.shape[:2], STRIP, 4)
            codes = codes | _fifth_bits(lanes[pick, :, channel])
        d, m = (t[pick, channel] for t in _scales(blocks, self.scale_dtype, self.bits))  # [n, G]
        return _values(codes, d, m)[:, : self.in_features]

    def linear_reference(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return int4_linear_ref(x, self, bias)

    def linear_compiled(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y: torch.Tensor = torch.ops.infer_cpu.int4_linear(x, self.packed, bias, self.out_features)
        return y

    def fused_args(self, bias: torch.Tensor | None) -> list[torch.Tensor]:
        return [self.packed, NO_TENSOR, bias_arg(bias)]  # the scales live in the packed blocks


class Int5Weight(Int4Weight):
    """A `[out_features, in_features]` int5 weight: int4's layout with each group's fifth bits after its nibbles
    (see the module's docstring); the same reference linear, its own compiled op."""

    format_id: ClassVar[int] = 4
    bits: ClassVar[int] = 5

    def linear_compiled(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y: torch.Tensor = torch.ops.infer_cpu.int5_linear(x, self.packed, bias, self.out_features)
        return y


def _groups(blocks: torch.Tensor, dtype: torch.dtype, bits: int) -> torch.Tensor:  # -> [s, G, block]: codes first
    """A strip's blocks a group each (two-level: the super-blocks' groups, their heads dropped)."""
    if dtype != SUPER_SCALES:
        return blocks
    return blocks[..., HEAD_BYTES:].reshape(blocks.shape[0], -1, code_bytes(bits) + 2 * STRIP)


def _codes(blocks: torch.Tensor, bits: int) -> torch.Tensor:  # [s, G, block] uint8 -> [s, 16, K_pad] uint8
    strips, groups = blocks.shape[:2]
    nib = blocks[..., :NIBBLE_BYTES].reshape(strips, groups, 4, STRIP, 4)  # [s, g, j, c, b]
    codes = _nibbles(nib.permute(0, 3, 1, 2, 4))
    if bits == 5:
        lanes = blocks[..., NIBBLE_BYTES : NIBBLE_BYTES + HIGH_BYTES].reshape(strips, groups, STRIP, 4)
        codes = codes | _fifth_bits(lanes.transpose(1, 2))  # [s, c, g, 4] -> [s, c, K_pad]
    return codes


def _fifth_bits(lanes: torch.Tensor) -> torch.Tensor:  # [..., G, 4] bytes of a channel's lanes -> [..., K_pad]
    """A channel's fifth bits (as 16 or 0) in k order, from its 32-bit lanes."""
    word = lanes.to(torch.int64)
    word = word[..., 0] | word[..., 1] << 8 | word[..., 2] << 16 | word[..., 3] << 24  # [..., G]
    by_bit = (word[..., None] >> torch.arange(32)) & 1  # [..., G, 32]: lane bit b
    by_k = torch.empty_like(by_bit)
    by_k[..., K_OF_BIT] = by_bit
    return (by_k << 4).to(torch.uint8).reshape(*lanes.shape[:-2], lanes.shape[-2] * GROUP)


def _lanes(q: torch.Tensor) -> torch.Tensor:  # [N_pad, K_pad] uint8 codes -> [N_pad / 16, G, 64] uint8
    """int5's fifth bits of each group as the kernel reads them: a 32-bit lane per channel."""
    strips, groups = q.shape[0] // STRIP, q.shape[1] // GROUP
    high = ((q >> 4) & 1).to(torch.int64).view(strips, STRIP, groups, GROUP)[..., K_OF_BIT]  # [s, c, g, bit]
    word = (high << torch.arange(32)).sum(dim=-1)  # [s, c, g]
    lanes = torch.stack([(word >> (8 * i)) & 0xFF for i in range(4)], dim=-1).to(torch.uint8)  # little-endian
    return lanes.permute(0, 2, 1, 3).reshape(strips, groups, HIGH_BYTES)


def _nibbles(nib: torch.Tensor) -> torch.Tensor:  # [..., G, 4 (j), 4 (b)] bytes of one channel -> [..., K_pad]
    both = torch.stack((nib & 15, nib >> 4), dim=-2)  # [..., g, j, half, b]: k = 8 j + 4 half + b
    return both.reshape(*nib.shape[:-3], nib.shape[-3] * GROUP)


def _scales(
    blocks: torch.Tensor, dtype: torch.dtype, bits: int
) -> tuple[torch.Tensor, torch.Tensor]:  # d, m: [s, 16, G]
    codes = code_bytes(bits)
    if dtype == SUPER_SCALES:
        d, m = super_scales(blocks[..., :HEAD_BYTES], _groups(blocks, dtype, bits)[..., codes:], has_min=True)
        assert m is not None
        return d.transpose(1, 2), m.transpose(1, 2)
    tail = blocks[..., codes:].contiguous().view(dtype).float()  # [s, G, 32]
    return tail[..., :STRIP].transpose(1, 2), tail[..., STRIP:].transpose(1, 2)


def _values(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """codes [n, K_pad], d and m [n, K_pad / 32] -> [n, K_pad] fp32: a product, then a sum (two roundings)."""
    q = codes.float().view(d.shape[0], d.shape[1], GROUP)
    return (q * d[..., None] + m[..., None]).view(d.shape[0], d.shape[1] * GROUP)


def pack_int4(
    codes: torch.Tensor,  # [N, K] uint8, 0..15
    d: torch.Tensor,  # [N, ceil(K / 32)] fp32
    m: torch.Tensor,  # [N, ceil(K / 32)] fp32
    scale_dtype: torch.dtype = torch.float16,  # fp16 rounds d and m to nearest; fp32 keeps them exactly
) -> Int4Weight:
    """Given codes, scales and minimums (`w = d * q + m` per group of 32) packed for the kernel."""
    return Int4Weight(_packed(codes, d, m, scale_dtype, 4), codes.shape[0], codes.shape[1])


def pack_int5(
    codes: torch.Tensor,  # [N, K] uint8, 0..31
    d: torch.Tensor,  # [N, ceil(K / 32)] fp32
    m: torch.Tensor,  # [N, ceil(K / 32)] fp32
    scale_dtype: torch.dtype = torch.float16,
) -> Int5Weight:
    """`pack_int4` for 5-bit codes."""
    return Int5Weight(_packed(codes, d, m, scale_dtype, 5), codes.shape[0], codes.shape[1])


def pack_int4_super(
    codes: torch.Tensor,  # [N, K] uint8, 0..15; K a multiple of 256
    scales: SuperScales,  # groups of 32, with minimums (Q4_K's)
) -> Int4Weight:
    """Given codes and two-level scales (`w = (d_super * d_sub) * q + (m_super * m_sub)` per group of 32), packed
    with the scales as the file has them; ValueError where they do not fit (store them as fp32 then)."""
    return Int4Weight(_packed_super(codes, scales, 4), codes.shape[0], codes.shape[1])


def pack_int5_super(codes: torch.Tensor, scales: SuperScales) -> Int5Weight:  # codes 0..31 (Q5_K's)
    """`pack_int4_super` for 5-bit codes."""
    return Int5Weight(_packed_super(codes, scales, 5), codes.shape[0], codes.shape[1])


def _packed(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor, scale_dtype: torch.dtype, bits: int) -> torch.Tensor:
    check_scale_dtype(scale_dtype)
    _check_codes(codes, bits)
    n, k = codes.shape
    groups = -(-k // GROUP)
    if d.shape != (n, groups) or m.shape != (n, groups):
        raise ValueError(f"int{bits}: d and m must be [{n}, {groups}], got {tuple(d.shape)} and {tuple(m.shape)}")
    n_pad = round_up(n, STRIP)
    q = F.pad(codes.cpu(), (0, groups * GROUP - k, 0, n_pad - n))  # [N_pad, K_pad]: zero codes in the padding
    d_s, m_s = (F.pad(stored_scales(t.float().cpu(), scale_dtype, f"int{bits}"), (0, 0, 0, n_pad - n)) for t in (d, m))
    return _pack(q, d_s, m_s, bits)


def _packed_super(codes: torch.Tensor, scales: SuperScales, bits: int) -> torch.Tensor:
    _check_codes(codes, bits)
    n, k = codes.shape
    scales.check(n, k, GROUP, f"int{bits}")
    if not scales.has_min:
        raise ValueError(f"int{bits}: two-level scales need minimums (m_sub, m_super)")
    n_pad = round_up(n, STRIP)
    strips, supers = n_pad // STRIP, k // SUPER
    head, subs = scales.strip_parts(n_pad)
    groups = torch.cat((*_code_parts(F.pad(codes.cpu(), (0, 0, 0, n_pad - n)), bits), *subs), dim=2)
    return torch.cat((head, groups.view(strips, supers, -1)), dim=2).contiguous()  # [s, K / 256, super-block]


def _check_codes(codes: torch.Tensor, bits: int) -> None:
    top = (1 << bits) - 1
    if codes.dim() != 2 or codes.dtype != torch.uint8 or (codes.numel() > 0 and int(codes.max()) > top):
        raise ValueError(f"int{bits}: codes must be [N, K] uint8 in 0..{top}")


def quantize_int4(weight: torch.Tensor) -> Int4Weight:  # weight: [N, K] float
    """Group-wise asymmetric int4 (round to nearest over each group's min..max), fp16 scales, packed."""
    n, k = weight.shape
    k_pad = round_up(k, GROUP)
    w = weight.detach().float().cpu()
    if not bool(w.isfinite().all()) or (w.numel() > 0 and float(w.abs().max()) > FP16_MAX):
        raise ValueError(f"int4: weights must be finite and within fp16's range (|w| <= {FP16_MAX})")
    lo = F.pad(w, (0, k_pad - k), value=float("inf")).view(n, -1, GROUP).amin(dim=2)  # [N, G]
    hi = F.pad(w, (0, k_pad - k), value=float("-inf")).view(n, -1, GROUP).amax(dim=2)
    # NOTE: d and m are rounded to fp16 first, then the codes chosen against the stored values
    m = lo.half().float()
    d = ((hi - m) / 15).clamp(min=FP16_TINY).half().float()
    wg = F.pad(w, (0, k_pad - k)).view(n, -1, GROUP)
    q = torch.round((wg - m[..., None]) / d[..., None]).clamp(0, 15).to(torch.uint8).view(n, k_pad)
    return pack_int4(q[:, :k], d, m, torch.float16)


def _pack(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, bits: int) -> torch.Tensor:
    """q [N_pad, K_pad] uint8 codes, d and m [N_pad, G] (fp16 or fp32) -> [N_pad / 16, G, block] uint8."""
    strips, groups = q.shape[0] // STRIP, q.shape[1] // GROUP
    dm = torch.cat([t.view(strips, STRIP, groups).permute(0, 2, 1) for t in (d, m)], dim=2)  # [s, g, 32]
    return torch.cat((*_code_parts(q, bits), dm.contiguous().view(torch.uint8)), dim=2).contiguous()


def _code_parts(q: torch.Tensor, bits: int) -> list[torch.Tensor]:  # -> [s, G, 256] nibbles (and [s, G, 64] lanes)
    return [_nibble_bytes(q & 15), _lanes(q)] if bits == 5 else [_nibble_bytes(q)]


def _nibble_bytes(q: torch.Tensor) -> torch.Tensor:  # [N_pad, K_pad] uint8 codes -> [N_pad / 16, G, 256] uint8
    strips, groups = q.shape[0] // STRIP, q.shape[1] // GROUP
    q6 = q.view(strips, STRIP, groups, 4, 2, 4).permute(0, 2, 3, 1, 4, 5)  # [s, g, j, c, half, b]
    return (q6[..., 0, :] | (q6[..., 1, :] << 4)).reshape(strips, groups, NIBBLE_BYTES)


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
    y = F.linear(x_hat, weight.dequantize_padded()[:n].double())
    if bias is not None:
        y = y + bias.double()
    return y.to(x.dtype)
