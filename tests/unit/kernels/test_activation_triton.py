"""The Triton gated-activation kernels against the PyTorch references (interpreter, or CUDA)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from infer.kernels.activation import gelu_tanh_and_mul_ref, silu_and_mul_ref
from tests.helpers.device import TEST_DEVICE

# NOTE: the interpreter's numpy warns when exp(-x) overflows to inf in sigmoid; the result (0) is right
pytestmark = [pytest.mark.triton, pytest.mark.filterwarnings("ignore:overflow encountered in exp")]

from infer.kernels.activation_triton import gelu_tanh_and_mul_triton, silu_and_mul_triton  # noqa: E402

Activation = Callable[[torch.Tensor], torch.Tensor]
ATOL = {torch.float32: 1e-5, torch.float16: 2e-3}
PAIRS = [(silu_and_mul_triton, silu_and_mul_ref), (gelu_tanh_and_mul_triton, gelu_tanh_and_mul_ref)]


@pytest.mark.parametrize(("kernel", "reference"), PAIRS, ids=["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("d", [128, 1100])  # 1100: two column tiles, the second partial
def test_matches_reference(kernel: Activation, reference: Activation, dtype: torch.dtype, d: int) -> None:
    x = (torch.randn(6, 2 * d, generator=torch.Generator().manual_seed(d)) * 4).to(TEST_DEVICE, dtype)
    torch.testing.assert_close(kernel(x), reference(x), atol=ATOL[dtype], rtol=ATOL[dtype])
