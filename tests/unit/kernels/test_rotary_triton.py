"""The Triton RoPE kernel against the PyTorch reference (interpreter, or CUDA)."""

from __future__ import annotations

import pytest
import torch

from infer.kernels.rotary import RopeConfig, apply_rotary_ref, cos_sin_cache
from tests.helpers.device import TEST_DEVICE

pytestmark = pytest.mark.triton

from infer.kernels.rotary_triton import apply_rotary_triton  # noqa: E402

NEOX = RopeConfig(theta=10000.0, rotary_dim=64)
LLAMA3 = RopeConfig(theta=500000.0, rotary_dim=64, rope_type="llama3", factor=8.0, original_max_position_embeddings=64)
ATOL = {torch.float32: 1e-6, torch.float16: 1e-3}


def _qkv(num_tokens: int, num_heads: int, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    # q as the model sees it: a strided view into a fused qkv projection
    qkv = torch.randn(num_tokens, 3 * num_heads * head_dim, generator=torch.Generator().manual_seed(0))
    return qkv.to(TEST_DEVICE, dtype)[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)


@pytest.mark.parametrize("rope", [NEOX, LLAMA3], ids=["neox", "llama3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_reference_at_explicit_positions(rope: RopeConfig, dtype: torch.dtype) -> None:
    cache = cos_sin_cache(rope, 300).to(TEST_DEVICE)
    x = _qkv(7, 3, 64, dtype)
    positions = torch.tensor([0, 1, 2, 63, 64, 200, 299], device=TEST_DEVICE)
    expected = apply_rotary_ref(x, positions, cache)
    actual = apply_rotary_triton(x, positions, cache)
    torch.testing.assert_close(actual, expected, atol=ATOL[dtype], rtol=ATOL[dtype])


def test_in_place_and_into_out() -> None:
    cache = cos_sin_cache(NEOX, 64).to(TEST_DEVICE)
    x, positions = _qkv(5, 2, 64, torch.float32), torch.tensor([9, 3, 3, 0, 63], device=TEST_DEVICE)
    expected = apply_rotary_ref(x, positions, cache)
    out = torch.empty(5, 2, 64, device=TEST_DEVICE)
    assert apply_rotary_triton(x, positions, cache, out=out) is out
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    apply_rotary_triton(x, positions, cache, out=x)  # in place, through the strided view
    torch.testing.assert_close(x, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("in_place", [False, True])
def test_partial_rotary_leaves_the_other_dims(in_place: bool) -> None:
    cache = cos_sin_cache(RopeConfig(theta=10000.0, rotary_dim=32), 16).to(TEST_DEVICE)
    x, positions = _qkv(4, 2, 80, torch.float32), torch.tensor([1, 5, 7, 15], device=TEST_DEVICE)
    expected = apply_rotary_ref(x, positions, cache)
    actual = apply_rotary_triton(x, positions, cache, out=x if in_place else None)
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=1e-6)
    assert torch.equal(actual[..., 32:], expected[..., 32:])
