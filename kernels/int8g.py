"""Weight-only 8-bit grouped linear layers: int8 codes with a scale (and an optional minimum) per group of 16 or 32
input features, the form GGUF's Q8_0, Q5_0, Q5_1, Q6_K, Q5_K (and, exactly, Q2_K and Q3_K) take.

A weight `[N, K]` is `w = d * q + m` per output channel and group of `group` (16 or 32) inputs: `q` int8, `d`
and `m` stored as fp16 or fp32; `m` absent (symmetric, `w = d * q`) for Q8_0, Q5_0, Q6_K, Q3_K. `pack_int8g`
packs given codes, scales and minimums; `pack_int8g_super` keeps K-quants' two-level scales as the file has
them (`packed.SuperScales`: `d = d_super * d_sub`, `m = m_super * m_sub` per group, `scale_dtype` int8);
`quantize_int8g` rounds a float weight to nearest, symmetric, fp16 scales (for tests). `in_features` that are
not a multiple of the group are padded with zero codes.

Packed for the compiled kernel (`csrc/int8g_linear.cpp`) as one byte stream per strip of 16 output channels,
`[N_pad / 16, K_pad / group, block]` uint8: a group's block is its codes for the 16 channels as `[group / 2,
16, 2]` int8 (32 bytes hold k `2 j` and `2 j + 1` of every channel: one load, 16 lanes of an int16 pair),
then the 16 scales, then the 16 minimums if any. Bytes per weight: `1 + scale bytes * (1 + has_min) / group`:
1.0625 for symmetric fp16 groups of 32 (Q8_0's), 1.25 for symmetric fp32 groups of 16. Two-level scales:
`[N_pad / 16, K / 256, block]`, a super-block is its 16 `d_super` (then 16 `m_super`), fp16, then its 16 or 8
groups, each its codes as above, its 16 `d_sub` (then 16 `m_sub`), int8: 1.0703 bytes per weight for symmetric
groups of 16 (Q6_K, Q3_K), 1.0781 for groups of 32 with minimums (Q5_K). A strip is read front to back, once per
call.

Inputs are quantized per row and per weight group (16 or 32 inputs, `packed.quantize_activations`) to int16,
so each group's dot product is exact integer arithmetic and a row's result never depends on the rows beside
it. (Groups of 16 get their own input scale: the same number of operations per group as sharing one per 32,
and a finer step.) `int8g_linear_ref` is the reference: the same inputs, the represented weights exactly (in
fp64), an fp64 matmul.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from infer.kernels.packed import (
    FP16_MAX,
    FP16_TINY,
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

GROUPS = (16, 32)  # input features per scale (and minimum)
PAIR_BYTES = 2 * STRIP  # 32: k 2j and 2j + 1 of the 16 channels


@dataclass(frozen=True)
class Int8GroupWeight(PackedWeight):
    """A `[out_features, in_features]` 8-bit grouped weight, packed for the kernel (see the module's docstring)."""

    format_id: ClassVar[int] = 3
    packed: torch.Tensor  # [N_pad / 16, K_pad / group, block] uint8
    out_features: int
    in_features: int
    group: int  # 16 or 32
    has_min: bool  # False: symmetric, w = d * q
    scale_dtype: torch.dtype  # fp16 or fp32: d and m as stored; SUPER_SCALES: two-level

    @property
    def is_super(self) -> bool:
        return self.scale_dtype == SUPER_SCALES

    @property
    def padded_in_features(self) -> int:
        return self.packed.shape[1] * (SUPER if self.is_super else self.group)

    @property
    def scale_bytes(self) -> int:  # a group's scale as stored: 2 (fp16), 4 (fp32), 1 (int8 d_sub)
        return self.scale_dtype.itemsize

    def codes(self) -> torch.Tensor:  # [N_pad, K_pad] int8
        q = self._codes(self.packed).permute(0, 3, 1, 2, 4)  # [s, c, g, j, b]
        return q.reshape(self.packed.shape[0] * STRIP, self.padded_in_features)

    def scales(self) -> tuple[torch.Tensor, torch.Tensor | None]:  # d, m: [N_pad, K_pad / group] fp32 (m None)
        d, m = self._scales(self.packed)  # [s, G, 16]
        return _by_channel(d), None if m is None else _by_channel(m)

    def dequantize(self) -> torch.Tensor:  # [out_features, in_features] fp32
        d, m = self.scales()
        return _values(self.codes(), d, m, self.group)[: self.out_features, : self.in_features]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:  # [n] -> [n, in_features] fp32
        strip, channel = channel_of(ids, self.out_features)
        blocks = self.packed[strip]  # [n, G | K / 256, block]: the strips of the rows asked for
        pick = torch.arange(blocks.shape[0])
        codes = self._codes(blocks)[pick, :, :, channel].reshape(len(pick), self.padded_in_features)
        d, m = self._scales(blocks)  # [n, G, 16]
        m_rows = None if m is None else m[pick, :, channel]
        return _values(codes, d[pick, :, channel], m_rows, self.group)[:, : self.in_features]  # [n, G] scales

    def linear_reference(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return int8g_linear_ref(x, self, bias)

    def linear_compiled(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y: torch.Tensor = torch.ops.infer_cpu.int8g_linear(
            x, self.packed, bias, self.out_features, self.group, self.scale_bytes, self.has_min
        )
        return y

    def fused_args(self, bias: torch.Tensor | None) -> list[torch.Tensor]:
        layout = torch.tensor([self.group, self.scale_bytes, int(self.has_min)], dtype=torch.int64)
        return [self.packed, layout, bias_arg(bias)]  # aux: the layout, as `int8g_linear` takes it

    def _groups(self, blocks: torch.Tensor) -> torch.Tensor:  # [s, G | K / 256, block] -> [s, G, group's block]
        """A strip's blocks a group each (two-level: the super-blocks' groups, their heads dropped)."""
        if not self.is_super:
            return blocks
        head = _head_bytes(self.has_min)
        return blocks[..., head:].reshape(blocks.shape[0], -1, STRIP * (self.group + 1 + self.has_min))

    def _codes(self, blocks: torch.Tensor) -> torch.Tensor:  # [s, G | K / 256, block] -> [s, G, group / 2, 16, 2]
        groups = self._groups(blocks)
        code_bytes = STRIP * self.group
        return groups[..., :code_bytes].contiguous().view(torch.int8).view(*groups.shape[:2], self.group // 2, STRIP, 2)

    def _scales(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:  # [s, G, 16] fp32 each
        tail = self._groups(blocks)[..., STRIP * self.group :]
        if self.is_super:
            return super_scales(blocks[..., : _head_bytes(self.has_min)], tail, self.has_min)
        values = tail.contiguous().view(self.scale_dtype).float()
        return values[..., :STRIP], values[..., STRIP:] if self.has_min else None


def _head_bytes(has_min: bool) -> int:  # a super-block's fp16 d_super (and m_super)
    return STRIP * 2 * (1 + has_min)


def _by_channel(t: torch.Tensor) -> torch.Tensor:  # [s, G, 16] -> [N_pad, G]
    return t.transpose(1, 2).reshape(-1, t.shape[1])


def _values(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, group: int) -> torch.Tensor:
    """codes [n, K_pad], d and m [n, K_pad / group] -> [n, K_pad] fp32: a product, then a sum (two roundings)."""
    w = codes.float().view(d.shape[0], d.shape[1], group) * d[..., None]
    if m is not None:
        w = w + m[..., None]
    return w.view(d.shape[0], d.shape[1] * group)


def pack_int8g(
    codes: torch.Tensor,  # [N, K] int8
    d: torch.Tensor,  # [N, ceil(K / group)] fp32
    m: torch.Tensor | None,  # [N, ceil(K / group)] fp32; None: symmetric
    group: int = 32,  # 16 or 32
    scale_dtype: torch.dtype = torch.float16,  # fp16 rounds d and m to nearest; fp32 keeps them exactly
) -> Int8GroupWeight:
    """Given codes, scales and (optional) minimums, `w = d * q + m` per group, packed for the kernel."""
    check_scale_dtype(scale_dtype)
    _check_codes(codes, group)
    n, k = codes.shape
    groups, n_pad = -(-k // group), round_up(n, STRIP)
    for t in (d, m):
        if t is not None and t.shape != (n, groups):
            raise ValueError(f"int8g: d and m must be [{n}, {groups}], got {tuple(t.shape)}")
    strips = n_pad // STRIP
    q = F.pad(codes.cpu(), (0, groups * group - k, 0, n_pad - n))  # [N_pad, K_pad]: zero codes in the padding
    parts = [_code_bytes(q, group)]
    for t in (d, m):
        if t is not None:
            stored = F.pad(stored_scales(t.float().cpu(), scale_dtype, "int8g"), (0, 0, 0, n_pad - n))
            parts.append(stored.view(strips, STRIP, groups).transpose(1, 2).contiguous().view(torch.uint8))
    packed = torch.cat(parts, dim=2).contiguous()
    return Int8GroupWeight(packed, n, k, group, m is not None, scale_dtype)


def pack_int8g_super(
    codes: torch.Tensor,  # [N, K] int8; K a multiple of 256
    scales: SuperScales,  # K-quants' two-level scales (minimums optional)
    group: int,  # 16 or 32
) -> Int8GroupWeight:
    """Given codes and two-level scales (`w = (d_super * d_sub) * q + (m_super * m_sub)` per group), packed with
    the scales as the file has them; ValueError where they do not fit (store them as fp32 then)."""
    _check_codes(codes, group)
    n, k = codes.shape
    scales.check(n, k, group, "int8g")
    n_pad = round_up(n, STRIP)
    head, subs = scales.strip_parts(n_pad)
    q = _code_bytes(F.pad(codes.cpu(), (0, 0, 0, n_pad - n)), group)  # [s, G, 16 * group]
    groups = torch.cat((q, *subs), dim=2).view(n_pad // STRIP, k // SUPER, -1)  # [s, K / 256, groups' blocks]
    packed = torch.cat((head, groups), dim=2).contiguous()
    return Int8GroupWeight(packed, n, k, group, scales.has_min, SUPER_SCALES)


def _check_codes(codes: torch.Tensor, group: int) -> None:
    if group not in GROUPS:
        raise ValueError(f"int8g: groups of 16 or 32 inputs, not {group}")
    if codes.dtype != torch.int8 or codes.dim() != 2:
        raise ValueError("int8g: codes must be [N, K] int8")


def _code_bytes(q: torch.Tensor, group: int) -> torch.Tensor:  # [N_pad, K_pad] int8 -> [s, G, 16 * group] uint8
    strips, groups = q.shape[0] // STRIP, q.shape[1] // group
    q = q.view(strips, STRIP, groups, group // 2, 2).permute(0, 2, 3, 1, 4)  # [s, g, j, c, b]
    return q.reshape(strips, groups, STRIP * group).view(torch.uint8)


def quantize_int8g(weight: torch.Tensor, group: int = 32) -> Int8GroupWeight:  # weight: [N, K] float
    """Symmetric int8 per group (like Q8_0: `d = max|w| / 127`, fp16, round to nearest), packed."""
    n, k = weight.shape
    k_pad = round_up(k, group)
    w = weight.detach().float().cpu()
    if not bool(w.isfinite().all()) or (w.numel() > 0 and float(w.abs().max()) > FP16_MAX):
        raise ValueError(f"int8g: weights must be finite and within fp16's range (|w| <= {FP16_MAX})")
    wg = F.pad(w, (0, k_pad - k)).view(n, -1, group)
    d = (wg.abs().amax(dim=2) / 127).clamp(min=FP16_TINY).half().float()  # NOTE: codes against the stored d
    q = torch.round(wg / d[..., None]).clamp(-127, 127).to(torch.int8).view(n, k_pad)
    return pack_int8g(q[:, :k], d, None, group, torch.float16)


def int8g_linear_ref(
    x: torch.Tensor,  # [M, K]
    weight: Int8GroupWeight,
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [M, N], x's dtype
    """The reference: the kernel's int16 inputs (per weight group, zeros in the padding), the represented
    weights `codes * d + m` exactly in fp64, an fp64 matmul."""
    n, k_pad = weight.out_features, weight.padded_in_features
    xq, s = quantize_activations(F.pad(x.float(), (0, k_pad - x.shape[1])), weight.group)
    x_hat = (xq.double() * s.double()[..., None]).view(x.shape[0], k_pad)
    d, m = weight.scales()
    w = weight.codes()[:n].double().view(n, -1, weight.group) * d[:n, :, None].double()
    if m is not None:
        w = w + m[:n, :, None].double()
    y = F.linear(x_hat, w.view(n, k_pad))
    if bias is not None:
        y = y + bias.double()
    return y.to(x.dtype)
