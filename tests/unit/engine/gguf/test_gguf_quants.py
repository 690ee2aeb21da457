"""GGUF blocks in grouped form: for every type infer keeps, `scale * code + minimum` equals `gguf.quants.dequantize`
(bit for bit but the sign of Q4_0's zeros), on random blocks: every bit pattern of codes and sub-block scales,
finite fp16 super-block scales."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from infer.engine.gguf.quants import EXACT_TYPES, decode

T = GGMLQuantizationType
# byte offsets of each type's fp16 scales inside its block: random bytes there could be inf or NaN
FP16_FIELDS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,), T.IQ4_NL: (0,),
}  # fmt: skip


def random_blocks(qtype: GGMLQuantizationType, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """[rows, bytes per row] uint8: random blocks whose fp16 scales are finite, of either sign, some tiny."""
    rng = np.random.default_rng(seed)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // block_size, type_size), dtype=np.uint8)
    for offset in FP16_FIELDS[qtype]:
        scales = (rng.standard_normal(blocks.shape[0]) * 10.0 ** rng.integers(-6, 1, blocks.shape[0])).astype(
            np.float16
        )
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


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


@pytest.mark.parametrize(
    ("qtype", "group", "is_4bit", "symmetric"),
    [(T.Q4_0, 32, True, False), (T.Q4_1, 32, True, False), (T.Q4_K, 32, True, False), (T.Q5_0, 32, False, True),
     (T.Q5_K, 32, False, False), (T.Q6_K, 16, False, True), (T.Q8_0, 32, False, True), (T.Q3_K, 16, False, True)],
    ids=lambda v: getattr(v, "name", str(v)),
)  # fmt: skip
def test_each_type_lands_on_its_group_and_code_range(
    qtype: GGMLQuantizationType, group: int, is_4bit: bool, symmetric: bool
) -> None:
    grouped = decode(random_blocks(qtype, 2, 256), qtype, 2, 256)
    assert (grouped.group, grouped.is_4bit, grouped.minimum is None) == (group, is_4bit, symmetric)


def test_fp16_scales_are_recognised_and_folded_k_scales_are_not() -> None:
    assert decode(random_blocks(T.Q4_1, 2, 64), T.Q4_1, 2, 64).scales_fit_fp16
    # d (fp16, 11 bits) times a 6-bit sub-block scale needs up to 17 bits
    assert not decode(random_blocks(T.Q4_K, 64, 256), T.Q4_K, 64, 256).scales_fit_fp16


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
