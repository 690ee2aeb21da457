"""Weight-only int6 (GGUF's Q6_K at its own 0.82 bytes a weight): the packed weight's values equal
`gguf.quants.dequantize` bit for bit, the documented layout, the compiled kernel against the reference at 1-37
rows with each row alone equal to the row in its batch, and what packing and the kernel refuse."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from infer.engine.gguf.quants import decode
from infer.kernels import Int6Weight, SuperScales, pack_int6
from infer.kernels.int6 import int6_linear_ref
from tests.helpers.compiled import require_compiled_kernels
from tests.helpers.tiny_gguf import random_blocks

Q6_K = GGMLQuantizationType.Q6_K


def _from_blocks(rows: int, cols: int, seed: int = 0) -> tuple[Int6Weight, np.ndarray]:
    """(the file's Q6_K blocks packed in int6, gguf's values of them)."""
    blocks = random_blocks(Q6_K, rows, cols, seed=seed)
    g = decode(blocks, Q6_K, rows, cols)
    assert g.super is not None
    scales = SuperScales(torch.from_numpy(g.super.d_sub), torch.from_numpy(g.super.d))
    q = pack_int6(torch.from_numpy((g.codes + np.int8(32)).view(np.uint8)), scales)
    return q, dequantize(blocks, Q6_K).reshape(rows, cols)


def _parts(n: int, k: int, seed: int) -> tuple[torch.Tensor, SuperScales]:
    """Random codes (0..63) and Q6_K-like scales: small fp16 d_super, d_sub over int8's whole range."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 64, (n, k), generator=gen, dtype=torch.uint8)
    d_sub = torch.randint(-128, 128, (n, k // 16), generator=gen, dtype=torch.int8)
    d_super = (torch.rand(n, k // 256, generator=gen) * 1e-3 + 1e-4).half().float()
    return codes, SuperScales(d_sub, d_super)


@pytest.mark.parametrize("rows", [16, 37])
def test_int6_values_are_gguf_dequantize_bit_for_bit(rows: int) -> None:
    q, expected = _from_blocks(rows, 512, seed=rows)
    assert q.shape == (rows, 512) and q.packed.shape == (-(-rows // 16), 2, 3360)
    ours = q.dequantize().numpy()
    assert ours.view(np.uint32).tolist() == expected.view(np.uint32).tolist()
    ids = torch.tensor([rows - 1, 0, 5, 15])
    assert torch.equal(q.rows(ids), q.dequantize()[ids])


def test_int6_reads_the_files_bytes_a_weight() -> None:
    q, _ = _from_blocks(64, 1024)
    assert q.packed.numel() / (64 * 1024) == 210 / 256  # Q6_K's 0.8203 (int8g: 1.0703)


def test_int6_blocks_hold_nibbles_top_bits_and_scales_where_the_kernel_reads_them() -> None:
    """A group's block: byte 4 c + b of the j-th 64 holds k 8 j + b (low nibble) and 8 j + 4 + b (high), as int4's;
    byte 128 + 4 c + b holds at bits 2 q, 2 q + 1 the top two bits of k 4 q + b; then the 16 int8 d_sub."""
    codes = torch.zeros(16, 256, dtype=torch.uint8)
    codes[3, 13] = 0b110000  # k 13 = 4 * 3 + 1: top bits 0b11 at bits 6, 7 of byte 4 * 3 + 1
    codes[9, 16 + 6] = 0b100111  # group 1, k 6 = 4 * 1 + 2: top 0b10 at bits 2, 3 of byte 4 * 9 + 2; nibble 7
    d_sub = torch.arange(16 * 16, dtype=torch.int32).remainder(100).to(torch.int8).view(16, 16)
    scales = SuperScales(d_sub, torch.ones(16, 1))
    packed = pack_int6(codes, scales).packed[0, 0]
    tops = [packed[32 + 208 * g + 128 : 32 + 208 * g + 192] for g in (0, 1)]
    assert tops[0].tolist() == [0b11 << 6 if i == 4 * 3 + 1 else 0 for i in range(64)]
    assert tops[1].tolist() == [0b10 << 2 if i == 4 * 9 + 2 else 0 for i in range(64)]
    assert packed[32 + 208 + 4 * 9 + 2].item() == 7 << 4  # k 6 = 8 * 0 + 4 + 2: byte 4 c + 2, its high nibble
    assert torch.equal(packed[32 + 192 : 32 + 208].view(torch.int8), d_sub[:, 0])


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, 9, 16, 37])
def test_compiled_int6_kernel_matches_the_reference(rows: int) -> None:
    require_compiled_kernels()
    gen = torch.Generator().manual_seed(rows)
    for n, k in [(37, 512), (100, 256)]:
        q = pack_int6(*_parts(n, k, seed=rows))
        x, bias = torch.randn(rows, k, generator=gen), torch.randn(n, generator=gen)
        got = q.linear_compiled(x, bias)
        torch.testing.assert_close(got, int6_linear_ref(x, q, bias), atol=1e-5, rtol=1e-5)
        exact = x.double() @ q.dequantize().double().T + bias.double()  # fp32 inputs: int16's step apart
        assert (got.double() - exact).abs().max() <= 1e-4 * exact.abs().max()
        for i in range(rows):  # a row alone: the same bits as in its batch
            assert torch.equal(q.linear_compiled(x[i : i + 1], bias), got[i : i + 1]), i


def test_compiled_int6_kernel_on_gguf_blocks_and_bf16_inputs() -> None:
    require_compiled_kernels()
    q, _ = _from_blocks(40, 768, seed=5)
    x = torch.randn(5, 768, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(q.linear_compiled(x, None), q.linear_reference(x, None), atol=1e-5, rtol=1e-5)
    y = q.linear_compiled(x.bfloat16(), None)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, q.linear_reference(x.bfloat16(), None), atol=1e-2, rtol=1e-2)


def test_what_packing_and_the_kernel_refuse() -> None:
    codes, scales = _parts(16, 256, seed=0)
    with pytest.raises(ValueError, match=r"0\.\.63"):
        pack_int6(codes + 64, scales)
    with pytest.raises(ValueError, match="multiple of 256"):
        pack_int6(codes[:, :128], SuperScales(scales.d_sub[:, :8], scales.d_super))
    with pytest.raises(ValueError, match="no minimums"):
        pack_int6(codes, SuperScales(scales.d_sub, scales.d_super, scales.d_sub, scales.d_super))
    require_compiled_kernels()
    q = pack_int6(codes, scales)
    with pytest.raises(RuntimeError, match="3360"):
        torch.ops.infer_cpu.int6_linear(torch.randn(1, 256), q.packed[..., :-1].contiguous(), None, 16)
    with pytest.raises(RuntimeError, match="features"):
        torch.ops.infer_cpu.int6_linear(torch.randn(1, 240), q.packed, None, 16)
