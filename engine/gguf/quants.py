"""GGUF tensor blocks decoded into one grouped form, exactly: `w = scale * code + minimum` per group of inputs.

Every ggml block type infer keeps is, per group of 16 or 32 inputs of a row, integer codes times one scale plus
one minimum. `decode` turns a tensor's raw blocks into that form (`Grouped`) with no rounding: K-quants' 6-bit
(or 4-bit) sub-block scales are multiplied into the super-block's fp16 `d` in fp32, which is exact (at most 19
significant bits), and `dequantize` of the result equals `gguf.quants.dequantize` of the file bit for bit (the
same fp32 products and sums, in the same order).

| type | group | codes | scale, minimum |
|---|---|---|---|
| Q4_0 | 32 | 0..15 | d, -8 d |
| Q4_1 | 32 | 0..15 | d, m |
| Q5_0 | 32 | -16..15 | d, none |
| Q5_1 | 32 | 0..31 | d, m |
| Q8_0 | 32 | -128..127 | d, none |
| Q2_K | 16 | 0..3 | d sc, -(dmin m) |
| Q3_K | 16 | -4..3 | d (sc - 32), none |
| Q4_K | 32 | 0..15 | d sc, -(dmin m) |
| Q5_K | 32 | 0..31 | d sc, -(dmin m) |
| Q6_K | 16 | -32..31 | d sc, none |

Other quantized types (the IQ family, TQ, ...) have no exact grouped form: `decode` dequantizes them with
`gguf.quants.dequantize` and rounds each group of 32 to int8 codes (`exact` False; the caller logs it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

QK_K = 256
FLOAT_TYPES: dict[GGMLQuantizationType, type[np.floating[Any]] | None] = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.BF16: None,  # no numpy dtype: widened through uint32
}


@dataclass(frozen=True)
class Super:
    """A K-quant's two-level scales: per super-block of 256 inputs an fp16 `d` (and `m`, the negated minimum
    scale), per group 8-bit `d_sub` (and `m_sub`): the group's scale is `d * d_sub`, its minimum `m * m_sub`."""

    d: np.ndarray  # [rows, cols / 256] float32, each value an fp16
    d_sub: np.ndarray  # [rows, cols / group] int8
    m: np.ndarray | None  # [rows, cols / 256] float32; None: symmetric
    m_sub: np.ndarray | None  # [rows, cols / group] int8

    def rows(self, index: np.ndarray) -> Super:
        """The same scales for rows in another order (`index`: the new row order)."""
        pick = [None if t is None else t[index] for t in (self.d, self.d_sub, self.m, self.m_sub)]
        return Super(*pick)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Grouped:
    """A `[rows, cols]` weight as `scale * code + minimum` per group of `group` inputs (see the module doc)."""

    codes: np.ndarray  # [rows, cols] int8
    scale: np.ndarray  # [rows, cols / group] float32
    minimum: np.ndarray | None  # [rows, cols / group] float32; None: symmetric (no minimum)
    group: int  # 16 or 32
    exact: bool = True  # False: rounded from a type with no grouped form
    super: Super | None = None  # a K-quant's two-level scales (`scale` and `minimum` are their products)

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.codes.shape[0]), int(self.codes.shape[1])

    def dequantize(self) -> np.ndarray:  # [rows, cols] float32
        rows, cols = self.shape
        w = self.codes.reshape(rows, -1, self.group).astype(np.float32) * self.scale[..., None]
        if self.minimum is not None:
            w = w + self.minimum[..., None]
        out: np.ndarray = w.reshape(rows, cols)
        return out


def _f16(raw: np.ndarray) -> np.ndarray:  # [n, 2] uint8 -> [n] float32
    return raw.copy().view(np.float16).reshape(-1).astype(np.float32)


def _nibbles(qs: np.ndarray, span: int) -> np.ndarray:
    """[n, k] bytes in chunks of `span`: low nibbles of a chunk, then its high nibbles -> [n, 2k] uint8."""
    n = qs.shape[0]
    chunks = qs.reshape(n, -1, 1, span) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (chunks & np.uint8(15)).reshape(n, -1)


def _bits(packed: np.ndarray, span: int, count: int, width: int) -> np.ndarray:
    """[n, k] bytes in chunks of `span`: `count` fields of `width` bits, lowest first -> [n, k * count] uint8."""
    n = packed.shape[0]
    shifts = (np.arange(count, dtype=np.uint8) * width).reshape(1, 1, count, 1)
    fields = packed.reshape(n, -1, 1, span) >> shifts
    return (fields & np.uint8((1 << width) - 1)).reshape(n, -1)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # [n, 12] -> sc, m [n, 8] uint8
    d, m, m_d = (scales[:, 4 * i : 4 * i + 4] for i in range(3))
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc, mn


def _q4_0(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    d = _f16(b[:, :2])
    return _nibbles(b[:, 2:], 16), d[:, None], (d * np.float32(-8))[:, None]


def _q4_1(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    return _nibbles(b[:, 4:], 16), _f16(b[:, :2])[:, None], _f16(b[:, 2:4])[:, None]


def _five_bit(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:  # 32 codes a block: low nibbles, then bit 4
    high = (qh.copy().view("<u4") >> np.arange(32, dtype=np.uint32)) & np.uint32(1)
    codes: np.ndarray = _nibbles(qs, 16) | (high.astype(np.uint8) << np.uint8(4))
    return codes


def _q5_0(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    codes = _five_bit(b[:, 2:6], b[:, 6:]).astype(np.int8) - np.int8(16)
    return codes, _f16(b[:, :2])[:, None], None


def _q5_1(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    return _five_bit(b[:, 4:8], b[:, 8:]), _f16(b[:, :2])[:, None], _f16(b[:, 2:4])[:, None]


def _q8_0(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    return b[:, 2:].copy().view(np.int8), _f16(b[:, :2])[:, None], None


# K-quants: codes, the super-block's fp16 scale (and minimum scale, negated), 8-bit sub-block scales (and minimums)
KParts = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]


def _q2_k(b: np.ndarray) -> KParts:
    scales, qs = b[:, :16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82])[:, None], _f16(b[:, 82:84])[:, None]
    return _bits(qs, 32, 4, 2), d, scales & 0xF, -dmin, scales >> 4


def _q3_k(b: np.ndarray) -> KParts:
    n = b.shape[0]
    hmask, qs, raw, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])[:, None]
    low = (raw[:, :8].reshape(n, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)).reshape(n, 16)
    high = (raw[:, 8:].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)).reshape(n, 16)
    sc = ((low & 0x0F) | ((high & 0x03) << 4)).astype(np.int8) - np.int8(32)
    ql = _bits(qs, 32, 4, 2).astype(np.int8)
    hbit = _bits(hmask, 32, 8, 1) ^ np.uint8(1)
    return ql - (hbit << np.uint8(2)).astype(np.int8), d, sc, None, None


def _q4_k(b: np.ndarray) -> KParts:
    sc, mn = _k_scale_min(b[:, 4:16])
    return _nibbles(b[:, 16:], 32), _f16(b[:, :2])[:, None], sc, -_f16(b[:, 2:4])[:, None], mn


def _q5_k(b: np.ndarray) -> KParts:
    sc, mn = _k_scale_min(b[:, 4:16])
    codes = _nibbles(b[:, 48:], 32) | (_bits(b[:, 16:48], 32, 8, 1) << np.uint8(4))
    return codes, _f16(b[:, :2])[:, None], sc, -_f16(b[:, 2:4])[:, None], mn


def _q6_k(b: np.ndarray) -> KParts:
    ql, qh, sc, d = b[:, :128], b[:, 128:192], b[:, 192:208], _f16(b[:, 208:210])[:, None]
    codes = (_nibbles(ql, 64) | (_bits(qh, 32, 4, 2) << np.uint8(4))).astype(np.int8) - np.int8(32)
    return codes, d, sc.copy().view(np.int8), None, None


@dataclass(frozen=True)
class Form:
    """What a type's grouped form is, known from the type alone (the table in the module doc): what a packed
    format needs to hold every tensor of the type, decided without reading its codes."""

    group: int  # inputs a scale
    has_min: bool
    bits: int  # 4: codes in 0..15 at groups of 32 (int4 holds them); 5: in 0..31 (int5; Q5_0's + 16); 6: Q6_K's
    # (int6; its codes + 32); else 8
    two_level: bool  # K-quant scales: fp16 per 256 inputs times 8 bits per group
    fp16_scales: bool  # scale and minimum are fp16 values (the file's; Q4_0's -8 d unless it overflows)


FORMS = {
    GGMLQuantizationType.Q4_0: Form(32, has_min=True, bits=4, two_level=False, fp16_scales=True),
    GGMLQuantizationType.Q4_1: Form(32, has_min=True, bits=4, two_level=False, fp16_scales=True),
    GGMLQuantizationType.Q5_0: Form(32, has_min=False, bits=5, two_level=False, fp16_scales=True),
    GGMLQuantizationType.Q5_1: Form(32, has_min=True, bits=5, two_level=False, fp16_scales=True),
    GGMLQuantizationType.Q8_0: Form(32, has_min=False, bits=8, two_level=False, fp16_scales=True),
    GGMLQuantizationType.Q2_K: Form(16, has_min=True, bits=8, two_level=True, fp16_scales=False),
    GGMLQuantizationType.Q3_K: Form(16, has_min=False, bits=8, two_level=True, fp16_scales=False),
    GGMLQuantizationType.Q4_K: Form(32, has_min=True, bits=4, two_level=True, fp16_scales=False),
    GGMLQuantizationType.Q5_K: Form(32, has_min=True, bits=5, two_level=True, fp16_scales=False),
    GGMLQuantizationType.Q6_K: Form(16, has_min=False, bits=6, two_level=True, fp16_scales=False),
}
ROUNDED_FORM = Form(32, has_min=False, bits=8, two_level=False, fp16_scales=False)  # any other type


def form(tensor_type: GGMLQuantizationType) -> Form:
    return FORMS.get(tensor_type, ROUNDED_FORM)


# type -> (decoder of [n_blocks, type_size] bytes, group)
_DECODERS = {
    GGMLQuantizationType.Q4_0: (_q4_0, 32),
    GGMLQuantizationType.Q4_1: (_q4_1, 32),
    GGMLQuantizationType.Q5_0: (_q5_0, 32),
    GGMLQuantizationType.Q5_1: (_q5_1, 32),
    GGMLQuantizationType.Q8_0: (_q8_0, 32),
}
_K_DECODERS = {
    GGMLQuantizationType.Q2_K: (_q2_k, 16),
    GGMLQuantizationType.Q3_K: (_q3_k, 16),
    GGMLQuantizationType.Q4_K: (_q4_k, 32),
    GGMLQuantizationType.Q5_K: (_q5_k, 32),
    GGMLQuantizationType.Q6_K: (_q6_k, 16),
}
EXACT_TYPES = frozenset(_DECODERS) | frozenset(_K_DECODERS)


def is_float(tensor_type: GGMLQuantizationType) -> bool:
    return tensor_type in FLOAT_TYPES


def float_tensor(data: np.ndarray, tensor_type: GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    """An F32 / F16 / BF16 tensor's values as float32 in `shape` (torch order: slowest dimension first)."""
    if tensor_type == GGMLQuantizationType.BF16:
        wide = data.reshape(-1).view(np.uint16).astype(np.uint32) << np.uint32(16)
        return wide.view(np.float32).reshape(shape)
    dtype = FLOAT_TYPES[tensor_type]
    assert dtype is not None
    return data.reshape(-1).view(dtype).astype(np.float32, copy=False).reshape(shape)


def decode(data: np.ndarray, tensor_type: GGMLQuantizationType, rows: int, cols: int) -> Grouped:
    """The raw blocks of a quantized `[rows, cols]` tensor (`cols` along the blocks) in grouped form."""
    block_size, type_size = GGML_QUANT_SIZES[tensor_type]
    if cols % block_size:
        raise ValueError(f"{cols} columns are not a whole number of {tensor_type.name} blocks of {block_size}")
    blocks = np.ascontiguousarray(data).reshape(-1).view(np.uint8).reshape(-1, type_size)
    if blocks.shape[0] != rows * cols // block_size:
        raise ValueError(f"{blocks.shape[0]} {tensor_type.name} blocks for a [{rows}, {cols}] tensor")
    if tensor_type in _K_DECODERS:
        k_decoder, group = _K_DECODERS[tensor_type]
        return _k_grouped(*k_decoder(blocks), rows, cols, group)
    entry = _DECODERS.get(tensor_type)
    if entry is None:
        return _rounded(gguf_dequantize(blocks, tensor_type).reshape(rows, cols))
    decoder, group = entry
    codes, scale, minimum = decoder(blocks)
    return Grouped(
        codes.astype(np.int8, copy=False).reshape(rows, cols),
        np.ascontiguousarray(scale, dtype=np.float32).reshape(rows, cols // group),
        None if minimum is None else np.ascontiguousarray(minimum, dtype=np.float32).reshape(rows, cols // group),
        group,
    )


def _k_grouped(
    codes: np.ndarray,  # [n_blocks, 256]
    d: np.ndarray,  # [n_blocks, 1] float32 (fp16 values)
    d_sub: np.ndarray,  # [n_blocks, 256 / group] 8-bit
    m: np.ndarray | None,  # [n_blocks, 1]: the negated minimum scale
    m_sub: np.ndarray | None,
    rows: int,
    cols: int,
    group: int,
) -> Grouped:
    """A K-quant in grouped form: the group scale `d * d_sub` (and minimum `m * m_sub`) in fp32 products, exact;
    the two levels kept too (`Super`) for formats that store scales the K-quant way."""
    supers = cols // QK_K
    sup = Super(
        d.reshape(rows, supers),
        d_sub.astype(np.int8).reshape(rows, cols // group),
        None if m is None else m.reshape(rows, supers),
        None if m_sub is None else m_sub.astype(np.int8).reshape(rows, cols // group),
    )
    scale = (d * d_sub.astype(np.float32)).reshape(rows, cols // group)
    minimum = None if m is None or m_sub is None else (m * m_sub.astype(np.float32)).reshape(rows, cols // group)
    return Grouped(codes.astype(np.int8, copy=False).reshape(rows, cols), scale, minimum, group, super=sup)


def _rounded(w: np.ndarray, group: int = 32) -> Grouped:
    """Symmetric int8 codes per group of 32 (round half to even) for a type with no exact grouped form."""
    rows, cols = w.shape
    if cols % group:
        raise ValueError(f"{cols} columns are not a whole number of groups of {group}")
    wg = w.reshape(rows, -1, group)
    scale = (np.abs(wg).max(axis=2) / np.float32(127)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))
    codes = np.clip(np.rint(wg / safe[..., None]), -127, 127).astype(np.int8)
    return Grouped(codes.reshape(rows, cols), scale, None, group, exact=False)
