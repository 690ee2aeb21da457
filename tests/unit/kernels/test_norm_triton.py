"""The Triton RMSNorm kernels against the PyTorch references (interpreter, or CUDA)."""

from __future__ import annotations

import pytest
import torch

from infer.kernels.norm import fused_add_rms_norm_ref, rms_norm_ref
from tests.helpers.device import TEST_DEVICE

pytestmark = pytest.mark.triton

from infer.kernels.norm_triton import fused_add_rms_norm_triton, rms_norm_triton  # noqa: E402

ATOL = {torch.float32: 1e-5, torch.float16: 2e-3}


def _randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(TEST_DEVICE, dtype)


@pytest.mark.parametrize("hidden", [64, 96])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm(hidden: int, dtype: torch.dtype) -> None:
    x, weight = _randn(9, hidden, dtype=dtype) * 3, _randn(hidden, dtype=dtype, seed=1)
    expected = rms_norm_ref(x, weight, 1e-6)
    torch.testing.assert_close(rms_norm_triton(x, weight, 1e-6), expected, atol=ATOL[dtype], rtol=ATOL[dtype])


def test_rms_norm_per_head_on_a_strided_view() -> None:
    # Qwen3's q/k norm: [num_tokens, num_heads, head_dim] sliced out of a fused qkv projection
    qkv, weight = _randn(5, 3 * 4 * 32), _randn(32, seed=1)
    q = qkv[:, : 4 * 32].view(5, 4, 32)
    torch.testing.assert_close(rms_norm_triton(q, weight, 1e-6), rms_norm_ref(q, weight, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_add_rms_norm(dtype: torch.dtype) -> None:
    x, residual = _randn(7, 64, dtype=dtype), _randn(7, 64, dtype=dtype, seed=1)
    weight = _randn(64, dtype=dtype, seed=2)
    normed, summed = fused_add_rms_norm_triton(x, residual, weight, 1e-5)
    expected_normed, expected_summed = fused_add_rms_norm_ref(x, residual, weight, 1e-5)
    torch.testing.assert_close(summed, expected_summed, atol=ATOL[dtype], rtol=ATOL[dtype])
    torch.testing.assert_close(normed, expected_normed, atol=ATOL[dtype], rtol=ATOL[dtype])
    assert torch.equal(residual, _randn(7, 64, dtype=dtype, seed=1))  # inputs untouched
