"""Weight-only int8: quantization error, the compiled kernel against the reference, the fallback."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from infer.kernels import Kernels, select_kernels
from infer.kernels.int8 import int8_linear_ref, kernel_uses_bf16, quantize_int8
from tests.helpers.compiled import require_compiled_kernels


def _weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen)  # rows of different ranges


@pytest.mark.parametrize(("n", "k"), [(64, 32), (100, 37), (3, 5)])
def test_quantization_error_is_at_most_half_a_step(n: int, k: int) -> None:
    w = _weight(n, k)
    q = quantize_int8(w)
    assert q.shape == (n, k) and q.packed.dtype == torch.int8
    dequantized = q.unpack().float() * q.scale[:n, None]
    assert bool(((dequantized - w).abs() <= q.scale[:n, None] / 2 + 1e-7).all())
    assert int(q.unpack().abs().amax(dim=1).min()) == 127  # each row uses its full range


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 17, 64])
@pytest.mark.parametrize(("n", "k"), [(96, 64), (100, 37), (48, 576)])
def test_compiled_kernel_matches_the_reference(rows: int, n: int, k: int) -> None:
    require_compiled_kernels()
    gen = torch.Generator().manual_seed(rows)
    q, x, bias = quantize_int8(_weight(n, k)), torch.randn(rows, k, generator=gen), torch.randn(n, generator=gen)
    expected = int8_linear_ref(x, q, bias, bf16_inputs=kernel_uses_bf16())
    actual = torch.ops.infer_cpu.int8_linear(x, q.packed, q.scale, bias, n)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-5)


def test_bf16_activations_and_leading_dims(compiled: Kernels) -> None:
    q = quantize_int8(_weight(80, 64))
    x = torch.randn(2, 3, 64).bfloat16()
    out = compiled.linear(x, q)
    assert out.shape == (2, 3, 80) and out.dtype == torch.bfloat16
    expected = int8_linear_ref(x.reshape(6, 64), q).view(2, 3, 80)
    torch.testing.assert_close(out, expected, atol=3e-2, rtol=3e-2)


def test_close_to_the_float_layer_and_the_reference_backend_runs_the_reference(reference: Kernels) -> None:
    w, x = _weight(128, 96), torch.randn(7, 96)
    q = reference.quantize(w, "int8")
    assert torch.equal(reference.linear(x, q), int8_linear_ref(x, q))
    exact = F.linear(x, w)
    assert float((reference.linear(x, q) - exact).norm() / exact.norm()) < 0.01
    assert torch.equal(reference.linear(x, w), F.linear(x, w))


def test_a_format_the_backend_cannot_pack_or_a_device_off_the_cpu_is_refused(reference: Kernels) -> None:
    with pytest.raises(ValueError, match="quantization 'fp8'"):
        reference.quantize(_weight(16, 16), "fp8")
    with pytest.raises(ValueError, match="int8 quantization runs on the CPU only"):
        select_kernels("cuda", torch.float16, "torch").quantize(_weight(16, 16), "int8")
