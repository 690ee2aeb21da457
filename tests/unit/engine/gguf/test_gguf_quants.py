"""GGUF blocks in grouped form: for every type infer keeps, `scale * code + minimum` equals `gguf.quants.dequantize`
(bit for bit but the sign of Q4_0's zeros), on random blocks: every bit pattern of codes and sub-block scales,
finite fp16 super-block scales."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from infer.engine.gguf.quants import EXACT_TYPES, decode, form
from tests.helpers.tiny_gguf import random_blocks

T = GGMLQuantizationType


@pytest.mark.parametrize("qtype", sorted(EXACT_TYPES, key=lambda t: t.name), ids=lambda t: t.name)
def test_grouped_form_dequantizes_to_the_files_values_bit_for_bit(qtype: GGMLQuantizationType) -> None:
    rows, cols = 5, 512
    data = random_blocks(qtype, rows, cols)
    grouped = decode(data, qtype, rows, cols)
    expected = dequantize(data, qtype).reshape(rows, cols)
    assert grouped.exact and grouped.codes.dtype == np.int8
    # NOTE: equal as numbers; only Q4_0's zeros may differ in sign (8 d - 8 d is +0 where gguf's d * 0 is -0)
    ours = grouped.dequantize()
    assert np.array_equal(ours, expected)
    if qtype != T.Q4_0:
        assert ours.view(np.uint32).tolist() == expected.view(np.uint32).tolist()


@pytest.mark.parametrize("qtype", sorted(EXACT_TYPES, key=lambda t: t.name), ids=lambda t: t.name)
def test_each_types_form_is_what_its_blocks_decode_to(qtype: GGMLQuantizationType) -> None:
    """The type table that packing decides by (`FORMS`: group, minimums, 4-bit codes, two-level and fp16 scales)
    against the decoded blocks: every code and scale pattern of random blocks stays inside what it promises."""
    f = form(qtype)
    grouped = decode(random_blocks(qtype, 64, 256), qtype, 64, 256)
    assert (grouped.group, grouped.minimum is not None, grouped.super is not None) == (f.group, f.has_min, f.two_level)
    # NOTE: int5 takes Q5_0's codes + 16, int6 Q6_K's + 32
    codes = grouped.codes.astype(np.int16) + {T.Q5_0: 16, T.Q6_K: 32}.get(qtype, 0)
    in_range = {bits: int(codes.min()) >= 0 and int(codes.max()) < 2**bits for bits in (4, 5, 6)}
    int6 = f.group == 16 and not f.has_min and f.two_level and in_range[6]  # Q6_K's form
    assert f.bits == (4 if f.group == 32 and in_range[4] else 5 if f.group == 32 and in_range[5] else 6 if int6 else 8)
    fp16_exact = all(np.array_equal(t.astype(np.float16).astype(np.float32), t)
                     for t in (grouped.scale, grouped.minimum) if t is not None)  # fmt: skip
    assert fp16_exact == f.fp16_scales  # NOTE: a K-quant's d (11 bits) times a 6-bit sc needs up to 17 bits


def test_a_type_with_no_grouped_form_is_rounded_to_int8_groups() -> None:
    rows, cols = 3, 256
    data = random_blocks(T.IQ4_NL, rows, cols)
    grouped = decode(data, T.IQ4_NL, rows, cols)
    w = dequantize(data, T.IQ4_NL).reshape(rows, cols)
    step = np.repeat(grouped.scale, 32, axis=1)
    assert not grouped.exact and grouped.group == 32
    assert np.all(np.abs(grouped.dequantize() - w) <= step / 2 * (1 + 1e-6))


def test_a_tensor_that_is_not_whole_blocks_is_refused() -> None:
    with pytest.raises(ValueError, match="not a whole number of Q4_K blocks"):
        decode(np.zeros((1, 144), np.uint8), T.Q4_K, 1, 128)
    with pytest.raises(ValueError, match="blocks for a"):
        decode(np.zeros((1, 144), np.uint8), T.Q4_K, 2, 256)


@pytest.mark.parametrize("qtype", [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda t: t.name)
def test_k_quants_keep_their_two_level_scales(qtype: GGMLQuantizationType) -> None:
    """scale = d * d_sub and minimum = m * m_sub exactly, d and m fp16 values, d_sub and m_sub 8-bit."""
    grouped = decode(random_blocks(qtype, 3, 512), qtype, 3, 512)
    sup = grouped.super
    assert sup is not None and sup.d.shape == (3, 2) and sup.d_sub.dtype == np.int8
    per = 256 // grouped.group
    assert np.array_equal(np.repeat(sup.d, per, axis=1) * sup.d_sub.astype(np.float32), grouped.scale)
    assert np.array_equal(sup.d.astype(np.float16).astype(np.float32), sup.d)
    if grouped.minimum is not None:
        assert sup.m is not None and sup.m_sub is not None
        assert np.array_equal(np.repeat(sup.m, per, axis=1) * sup.m_sub.astype(np.float32), grouped.minimum)
    else:
        assert sup.m is None and sup.m_sub is None
