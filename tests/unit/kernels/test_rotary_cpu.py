"""The compiled fp32 RoPE against the PyTorch reference, and when the compiled backend's `apply_rotary` takes it."""

from __future__ import annotations

import pytest
import torch

from infer.kernels import Kernels, cpu
from infer.kernels.compiled import CompiledCpuKernels
from infer.kernels.rotary import RopeConfig, RotaryAngles, apply_rotary_ref, cos_sin_cache
from tests.helpers.compiled import require_compiled_kernels

NEOX = RopeConfig(theta=10000.0, rotary_dim=64)
LLAMA3 = RopeConfig(theta=500000.0, rotary_dim=64, rope_type="llama3", factor=8.0, original_max_position_embeddings=64)


def _qkv_heads(num_tokens: int, num_heads: int, head_dim: int, seed: int = 0) -> torch.Tensor:
    # q as the model sees it: a strided view into a fused qkv projection
    qkv = torch.randn(num_tokens, 3 * num_heads * head_dim, generator=torch.Generator().manual_seed(seed))
    return qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)


@pytest.mark.parametrize("rope", [NEOX, LLAMA3], ids=["neox", "llama3"])
@pytest.mark.parametrize(("num_tokens", "num_heads"), [(1, 15), (7, 3), (40, 4)])  # 160 rows: several threads
def test_matches_the_reference(rope: RopeConfig, num_tokens: int, num_heads: int) -> None:
    require_compiled_kernels()
    cache = cos_sin_cache(rope, 300)
    x = _qkv_heads(num_tokens, num_heads, 64)
    positions = torch.randint(0, 300, (num_tokens,), generator=torch.Generator().manual_seed(num_tokens))
    actual = torch.ops.infer_cpu.rotary(x, positions, cache, None)
    torch.testing.assert_close(actual, apply_rotary_ref(x, positions, cache), atol=1e-6, rtol=1e-6)
    assert actual.is_contiguous()


def test_partial_rotary_copies_the_other_dims_and_rotates_in_place() -> None:
    require_compiled_kernels()
    cache = cos_sin_cache(RopeConfig(theta=10000.0, rotary_dim=32), 16)
    x, positions = _qkv_heads(4, 2, 80), torch.tensor([1, 5, 7, 15])
    expected = apply_rotary_ref(x, positions, cache)
    actual = torch.ops.infer_cpu.rotary(x, positions, cache, None)
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=1e-6)
    assert torch.equal(actual[..., 32:], x[..., 32:])
    assert torch.ops.infer_cpu.rotary(x, positions, cache, x).data_ptr() == x.data_ptr()  # through the view
    torch.testing.assert_close(x, expected, atol=1e-6, rtol=1e-6)


def test_it_refuses_what_it_cannot_take() -> None:
    require_compiled_kernels()
    cache, x = cos_sin_cache(NEOX, 8), _qkv_heads(2, 2, 64)
    with pytest.raises(RuntimeError, match="position 8 outside the table of 8"):
        torch.ops.infer_cpu.rotary(x, torch.tensor([0, 8]), cache, None)
    with pytest.raises(RuntimeError, match="fp32 only"):
        torch.ops.infer_cpu.rotary(x.bfloat16(), torch.tensor([0, 1]), cache, None)
    with pytest.raises(RuntimeError, match="positions must be"):
        torch.ops.infer_cpu.rotary(x, torch.tensor([0, 1], dtype=torch.int32), cache, None)
    with pytest.raises(RuntimeError, match="rotary_dim even and <= head_dim"):
        torch.ops.infer_cpu.rotary(_qkv_heads(2, 2, 32), torch.tensor([0, 1]), cache, None)


def test_apply_rotary_takes_the_compiled_kernel_in_fp32_models_only(
    monkeypatch: pytest.MonkeyPatch, compiled: Kernels
) -> None:
    calls: list[torch.Tensor] = []
    kernel = cpu.rotary
    monkeypatch.setattr(cpu, "rotary", lambda x, *args: calls.append(x) or kernel(x, *args))
    cache = cos_sin_cache(NEOX, 64)
    positions = torch.tensor([3, 9])
    angles = RotaryAngles.lookup(positions, cache)
    x = _qkv_heads(2, 2, 64)
    with torch.inference_mode():
        torch.testing.assert_close(compiled.apply_rotary(x, angles), apply_rotary_ref(x, positions, cache))
        assert len(calls) == 1
        out = torch.empty(2, 2, 64)
        assert compiled.apply_rotary(x, angles, out) is out and len(calls) == 2
        bf16, bf16_model = x.bfloat16(), CompiledCpuKernels(torch.device("cpu"), torch.bfloat16)
        assert torch.equal(bf16_model.apply_rotary(bf16, angles), apply_rotary_ref(bf16, positions, cache))
        assert len(calls) == 2  # a bf16 model's backend, chosen once: the reference
