"""The 8-bit grouped weight format (GGUF's Q8_0, Q5_x, Q6_K...): exact dequantization, row gathers, the compiled
kernel against the reference, batch invariance, every backend."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from infer.kernels import Int8GroupWeight, Kernels, SuperScales, pack_int8g, pack_int8g_super, select_kernels
from infer.kernels.int8g import int8g_linear_ref, quantize_int8g
from tests.helpers.compiled import require_compiled_kernels
from tests.helpers.device import TEST_DEVICE

# (group, has_min, scale dtype): every layout the kernel has
LAYOUTS = [(g, has_min, dt) for g in (16, 32) for has_min in (False, True) for dt in (torch.float16, torch.float32)]


def _ids(layout: tuple[int, bool, torch.dtype]) -> str:
    group, has_min, dtype = layout
    return f"g{group}-{'min' if has_min else 'sym'}-{str(dtype).removeprefix('torch.')}"


def _parts(
    n: int, k: int, group: int, has_min: bool, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Random codes over the whole int8 range, and fp32 scales with all 24 bits (K-quants' d * sc are exact only
    in fp32), minimums of either sign."""
    gen = torch.Generator().manual_seed(seed)
    groups = -(-k // group)
    codes = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    d = torch.rand(n, groups, generator=gen) * 0.02 + 1e-4
    m = (torch.randn(n, groups, generator=gen) * 0.5) if has_min else None
    return codes, d, m


def _packed(n: int, k: int, layout: tuple[int, bool, torch.dtype], seed: int = 0) -> Int8GroupWeight:
    group, has_min, dtype = layout
    codes, d, m = _parts(n, k, group, has_min, seed)
    return pack_int8g(codes, d, m, group, dtype)


def _kernel(x: torch.Tensor, q: Int8GroupWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    return q.linear_compiled(x, bias)


@pytest.mark.parametrize("k_short", [0, 5])
@pytest.mark.parametrize("layout", LAYOUTS, ids=_ids)
def test_dequantize_is_codes_times_d_plus_m_bit_for_bit(layout: tuple[int, bool, torch.dtype], k_short: int) -> None:
    group, has_min, dtype = layout
    n, k = 37, 4 * group - k_short  # odd rows; a last group short of inputs (zero codes pad it)
    codes, d, m = _parts(n, k, group, has_min)
    q = pack_int8g(codes, d, m, group, dtype)
    assert q.shape == (n, k) and q.packed.dtype == torch.uint8
    k_pad = q.padded_in_features
    stored_d = d.to(dtype).float()  # fp16: rounded once, to nearest
    expected = F.pad(codes, (0, k_pad - k)).float().view(n, -1, group) * stored_d[..., None]  # one product ...
    if m is not None:
        expected = expected + m.to(dtype).float()[..., None]  # ... then one sum, each rounded to fp32
    assert torch.equal(q.dequantize(), expected.view(n, k_pad)[:, :k])
    if dtype == torch.float32:
        assert not torch.equal(stored_d, d.half().float())  # these scales need fp32


@pytest.mark.parametrize("layout", LAYOUTS, ids=_ids)
def test_rows_gather_dequantized_rows_from_the_packed_strips(layout: tuple[int, bool, torch.dtype]) -> None:
    q = _packed(70, 3 * layout[0], layout)
    ids = torch.tensor([69, 0, 5, 5, 16, 33, 68])  # the last row of a short strip, a repeat
    assert torch.equal(q.rows(ids), q.dequantize()[ids])
    assert q.rows(torch.tensor([], dtype=torch.long)).shape == (0, q.in_features)
    with pytest.raises(IndexError):
        q.rows(torch.tensor([70]))


@pytest.mark.parametrize(
    ("layout", "per_weight"),
    [((32, False, torch.float16), 1.0625), ((16, False, torch.float32), 1.25), ((32, True, torch.float16), 1.125)],
)
def test_a_token_reads_about_one_byte_per_weight(layout: tuple[int, bool, torch.dtype], per_weight: float) -> None:
    q = _packed(64, 256, layout)
    assert q.packed.numel() / (64 * 256) == per_weight  # bytes


def test_packing_keeps_a_strip_front_to_back_in_the_documented_layout() -> None:
    codes, d, m = _parts(16, 64, 32, has_min=True)
    q = pack_int8g(codes, d, m, 32, torch.float32)
    block = q.packed[0, 1]  # strip 0, group 1 (k 32..63): [16][16][2] codes, then 16 d, then 16 m
    j, c = 5, 9
    assert int(block[32 * j + 2 * c].view(torch.int8)) == int(codes[c, 32 + 2 * j])
    assert int(block[32 * j + 2 * c + 1].view(torch.int8)) == int(codes[c, 32 + 2 * j + 1])
    assert float(block[512:576].view(torch.float32)[c]) == float(d[c, 1])
    assert float(block[576:640].view(torch.float32)[c]) == float(m[c, 1])  # type: ignore[index]


def test_packing_refuses_what_the_format_cannot_hold() -> None:
    codes, d, _ = _parts(16, 64, 32, has_min=False)
    with pytest.raises(ValueError, match="groups of 16 or 32"):
        pack_int8g(codes, d, None, 64)
    with pytest.raises(ValueError, match="int8"):
        pack_int8g(codes.to(torch.int16), d, None)
    with pytest.raises(ValueError, match=r"\[16, 2\]"):
        pack_int8g(codes, d[:, :1], None)
    with pytest.raises(ValueError, match="fp16"):
        pack_int8g(codes, d * 1e7, None, 32, torch.float16)
    with pytest.raises(ValueError, match="float16 or float32"):
        pack_int8g(codes, d, None, 32, torch.bfloat16)


def test_quantize_int8g_rounds_each_group_to_nearest() -> None:
    w = torch.randn(40, 100, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.01, 2, 40)[:, None]
    q = quantize_int8g(w, group=32)
    assert not q.has_min and q.scale_dtype == torch.float16
    d, _ = q.scales()
    step = d[:40].repeat_interleave(32, dim=1)[:, :100]
    assert bool(((q.dequantize() - w).abs() <= step / 2 + 1e-3 * step).all())


@pytest.mark.parametrize("rows", [1, 2, 7, 16, 37, 64])
@pytest.mark.parametrize("layout", LAYOUTS, ids=_ids)
def test_compiled_kernel_matches_the_reference(layout: tuple[int, bool, torch.dtype], rows: int) -> None:
    require_compiled_kernels()
    gen = torch.Generator().manual_seed(rows)
    for n, k in [(37, 4 * layout[0]), (100, 192)]:  # N short of a strip; K a multiple of the group
        q = _packed(n, k, layout, seed=rows)
        x, bias = torch.randn(rows, k, generator=gen), torch.randn(n, generator=gen)
        torch.testing.assert_close(_kernel(x, q, bias), int8g_linear_ref(x, q, bias), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(_kernel(x, q), int8g_linear_ref(x, q), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS, ids=_ids)
def test_padded_inputs_zero_groups_and_extreme_inputs(layout: tuple[int, bool, torch.dtype]) -> None:
    require_compiled_kernels()
    group = layout[0]
    q = _packed(48, 3 * group - 3, layout)  # the last group padded with zero codes
    x = torch.randn(5, 3 * group - 3, generator=torch.Generator().manual_seed(1))
    x[0, :group] = 0  # an all-zero input group
    x[1, 3] = 1e4  # one large input in a group
    x[2] = x[2] * 1e-6  # tiny inputs
    expected = int8g_linear_ref(x, q)
    torch.testing.assert_close(_kernel(x, q), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_kernel(x[2:3], q), expected[2:3], atol=1e-11, rtol=1e-5)
    exact = F.linear(x.double(), q.dequantize().double())  # the int16 inputs' step is far below the weights'
    assert float((expected.double() - exact).norm() / exact.norm()) < 1e-4


@pytest.mark.parametrize("layout", LAYOUTS, ids=_ids)
def test_a_row_alone_equals_the_same_row_in_a_batch_bit_for_bit(layout: tuple[int, bool, torch.dtype]) -> None:
    require_compiled_kernels()
    gen = torch.Generator().manual_seed(3)
    for n, k in [(200, 256), (37, 2 * layout[0])]:
        q, x = _packed(n, k, layout), torch.randn(37, k, generator=gen)
        batched = _kernel(x, q)
        for i in (0, 5, 17, 36):
            assert torch.equal(_kernel(x[i : i + 1], q), batched[i : i + 1])
        for lo, hi in ((8, 16), (20, 22), (30, 33), (1, 5)):  # other tiles than the 37 rows' tiles
            assert torch.equal(_kernel(x[lo:hi], q), batched[lo:hi])


def test_the_compiled_backend_runs_the_kernel_with_bf16_inputs_and_leading_dims(compiled: Kernels) -> None:
    q = _packed(80, 64, (32, True, torch.float32))
    x = torch.randn(2, 3, 64)
    out = compiled.linear(x, q)
    assert out.shape == (2, 3, 80) and torch.equal(out.view(6, 80), _kernel(x.view(6, 64), q))
    out16 = compiled.linear(x.bfloat16(), q)
    assert out16.dtype == torch.bfloat16
    torch.testing.assert_close(out16, int8g_linear_ref(x.view(6, 64).bfloat16(), q).view(2, 3, 80))


def test_the_reference_backend_runs_the_reference_and_quantizes_int8g(reference: Kernels) -> None:
    w, x = torch.randn(96, 64), torch.randn(7, 64)
    q = reference.quantize(w, "int8g")
    assert isinstance(q, Int8GroupWeight)
    assert torch.equal(reference.linear(x, q), int8g_linear_ref(x, q))
    exact = F.linear(x, w)
    assert float((reference.linear(x, q) - exact).norm() / exact.norm()) < 0.01


@pytest.mark.triton
def test_the_triton_backend_falls_back_to_the_reference_for_packed_weights() -> None:
    triton = select_kernels(TEST_DEVICE, torch.float32, "triton")
    q = _packed(40, 64, (16, True, torch.float32))
    x = torch.randn(3, 64)
    assert torch.equal(triton.linear(x, q), int8g_linear_ref(x, q))


def test_the_kernel_refuses_mismatched_shapes_and_layouts() -> None:
    require_compiled_kernels()
    q = _packed(20, 64, (32, False, torch.float16))
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="features"):
        _kernel(torch.randn(2, 96), q)
    with pytest.raises(RuntimeError, match="out_features"):
        torch.ops.infer_cpu.int8g_linear(x, q.packed, None, 40, 32, 2, False)
    with pytest.raises(RuntimeError, match="bias"):
        _kernel(x, q, torch.randn(7))
    with pytest.raises(RuntimeError, match="packed must be"):
        torch.ops.infer_cpu.int8g_linear(x, q.packed, None, 20, 32, 2, True)  # a layout with minimums
    with pytest.raises(RuntimeError, match="group"):
        torch.ops.infer_cpu.int8g_linear(x, q.packed, None, 20, 8, 2, False)


# two-level scales: (group, has_min) as K-quants use them (Q6_K, Q3_K; Q5_K; Q2_K) and the fourth
SUPER_LAYOUTS = [(16, False), (32, True), (16, True), (32, False)]


def _super_ids(layout: tuple[int, bool]) -> str:
    return f"g{layout[0]}-{'min' if layout[1] else 'sym'}"


def _super_parts(n: int, k: int, group: int, has_min: bool, seed: int = 0) -> tuple[torch.Tensor, SuperScales]:
    """K-quant-like: codes over the int8 range, fp16 super-scales (minimums of either sign), int8 sub-scales over
    their whole range (Q6_K's sc is int8)."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    d_super = (torch.rand(n, k // 256, generator=gen) * 1e-4).half().float()  # weights up to ~1.6
    m_super = (torch.randn(n, k // 256, generator=gen) * 1e-3).half().float() if has_min else None
    d_sub, m_sub = (torch.randint(-128, 128, (n, k // group), generator=gen, dtype=torch.int8) for _ in range(2))
    return codes, SuperScales(d_sub, d_super, m_sub if has_min else None, m_super)


def _group_products(s: SuperScales, group: int) -> tuple[torch.Tensor, torch.Tensor | None]:  # d, m [N, G] fp32
    d = s.d_super.repeat_interleave(256 // group, dim=1) * s.d_sub.float()
    if s.m_sub is None or s.m_super is None:
        return d, None
    return d, s.m_super.repeat_interleave(256 // group, dim=1) * s.m_sub.float()


@pytest.mark.parametrize("layout", SUPER_LAYOUTS, ids=_super_ids)
def test_two_level_scales_dequantize_to_the_k_quant_formula_bit_for_bit(layout: tuple[int, bool]) -> None:
    group, has_min = layout
    n, k = 37, 768
    codes, scales = _super_parts(n, k, group, has_min)
    q = pack_int8g_super(codes, scales, group)
    assert q.shape == (n, k) and q.scale_dtype == torch.int8 and q.has_min == has_min and q.padded_in_features == k
    d, m = _group_products(scales, group)
    expected = codes.float().view(n, -1, group) * d[..., None]  # (d_super * d_sub) * q ...
    if m is not None:
        expected = expected + m[..., None]  # ... + (m_super * m_sub): gguf.quants' order for K-quants
    assert torch.equal(q.dequantize(), expected.view(n, k))
    assert torch.equal(q.codes()[:n], codes)
    ids = torch.tensor([36, 0, 5, 5, 16, 33])
    assert torch.equal(q.rows(ids), q.dequantize()[ids])


@pytest.mark.parametrize(
    ("layout", "per_weight"),
    [((16, False), 1 + 1 / 16 + 2 / 256), ((32, True), 1 + 2 / 32 + 4 / 256), ((16, True), 1 + 2 / 16 + 4 / 256)],
)
def test_two_level_scales_cost_the_files_bytes_per_weight(layout: tuple[int, bool], per_weight: float) -> None:
    codes, scales = _super_parts(64, 512, *layout)
    assert pack_int8g_super(codes, scales, layout[0]).packed.numel() / (64 * 512) == per_weight  # Q6_K 1.07, Q5_K 1.08


def test_two_level_blocks_hold_the_head_then_each_groups_codes_and_int8_scales() -> None:
    codes, s = _super_parts(16, 512, 32, has_min=True)
    assert s.m_sub is not None and s.m_super is not None
    block = pack_int8g_super(codes, s, 32).packed[0, 1]  # strip 0, super-block 1 (k 256..511)
    assert block.numel() == 64 + 8 * (512 + 32)
    assert torch.equal(block[:32].view(torch.float16).float(), s.d_super[:, 1])
    assert torch.equal(block[32:64].view(torch.float16).float(), s.m_super[:, 1])
    group = block[64 + 2 * 544 : 64 + 3 * 544]  # group 2 of the super-block: group 10 of the row (k 320..351)
    j, c = 5, 9
    assert int(group[32 * j + 2 * c].view(torch.int8)) == int(codes[c, 320 + 2 * j])
    assert torch.equal(group[512:528].view(torch.int8), s.d_sub[:, 10])
    assert torch.equal(group[528:544].view(torch.int8), s.m_sub[:, 10])


def test_pack_int8g_super_refuses_what_two_level_scales_cannot_hold() -> None:
    codes, s = _super_parts(20, 512, 16, has_min=False)
    with pytest.raises(ValueError, match="multiple of 256"):
        pack_int8g_super(codes[:, :496], SuperScales(s.d_sub[:, :31], s.d_super), 16)
    with pytest.raises(ValueError, match="groups of 16 or 32"):
        pack_int8g_super(codes, s, 64)
    with pytest.raises(ValueError, match=r"\[20, 16\] int8"):
        pack_int8g_super(codes, s, 32)  # sub-scales of groups of 16 given for groups of 32
    with pytest.raises(ValueError, match="exact in fp16"):
        pack_int8g_super(codes, SuperScales(s.d_sub, s.d_super + 1e-7), 16)
    with pytest.raises(ValueError, match="exact in fp16"):
        pack_int8g_super(codes, SuperScales(s.d_sub, s.d_super.clone().fill_(float("nan"))), 16)
    with pytest.raises(ValueError, match="come together"):
        pack_int8g_super(codes, SuperScales(s.d_sub, s.d_super, None, s.d_super), 16)
    with pytest.raises(ValueError, match="int8"):
        pack_int8g_super(codes.to(torch.int16), s, 16)


@pytest.mark.parametrize("rows", [1, 2, 7, 16, 37, 64])
@pytest.mark.parametrize("layout", SUPER_LAYOUTS, ids=_super_ids)
def test_compiled_kernel_with_two_level_scales_matches_the_reference(layout: tuple[int, bool], rows: int) -> None:
    require_compiled_kernels()
    group, has_min = layout
    gen = torch.Generator().manual_seed(rows)
    for n, k in [(37, 512), (100, 256)]:
        codes, scales = _super_parts(n, k, group, has_min, seed=rows)
        q = pack_int8g_super(codes, scales, group)
        x, bias = torch.randn(rows, k, generator=gen), torch.randn(n, generator=gen)
        got = _kernel(x, q, bias)
        torch.testing.assert_close(got, int8g_linear_ref(x, q, bias), atol=1e-5, rtol=1e-5)
        d, m = _group_products(scales, group)  # NOTE: the same products per group: the fp32 kernel's bits
        assert torch.equal(got, _kernel(x, pack_int8g(codes, d, m, group, torch.float32), bias))


@pytest.mark.parametrize("layout", SUPER_LAYOUTS, ids=_super_ids)
def test_two_level_scales_a_row_alone_equals_the_same_row_in_a_batch_bit_for_bit(layout: tuple[int, bool]) -> None:
    require_compiled_kernels()
    q = pack_int8g_super(*_super_parts(200, 512, *layout), layout[0])
    x = torch.randn(37, 512, generator=torch.Generator().manual_seed(6))
    batched = _kernel(x, q)
    for i in (0, 5, 17, 36):
        assert torch.equal(_kernel(x[i : i + 1], q), batched[i : i + 1])
    for lo, hi in ((8, 16), (20, 22), (30, 33), (1, 5)):
        assert torch.equal(_kernel(x[lo:hi], q), batched[lo:hi])


def test_the_kernel_refuses_a_two_level_layout_that_does_not_match() -> None:
    require_compiled_kernels()
    q = pack_int8g_super(*_super_parts(20, 512, 16, has_min=False), 16)
    x = torch.randn(2, 512)
    assert torch.equal(_kernel(x, q), torch.ops.infer_cpu.int8g_linear(x, q.packed, None, 20, 16, 1, False))
    with pytest.raises(RuntimeError, match="packed must be"):
        torch.ops.infer_cpu.int8g_linear(x, q.packed, None, 20, 16, 1, True)  # a layout with minimums
    with pytest.raises(RuntimeError, match="packed must be"):
        torch.ops.infer_cpu.int8g_linear(x, q.packed, None, 20, 32, 1, False)
    with pytest.raises(RuntimeError, match="scale_bytes"):
        torch.ops.infer_cpu.int8g_linear(x, q.packed, None, 20, 16, 3, False)
