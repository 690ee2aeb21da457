"""The compiled fp32 RMSNorm and residual-add + RMSNorm against the PyTorch references, and when they run."""

from __future__ import annotations

import pytest
import torch

from infer.kernels import Kernels, cpu
from infer.kernels.compiled import CompiledCpuKernels
from infer.kernels.norm import fused_add_rms_norm_ref, rms_norm_ref
from tests.helpers.compiled import require_compiled_kernels


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3


# 1 row (decode, on the calling thread); 40 rows (split over threads); odd and tiny widths
@pytest.mark.parametrize(("rows", "hidden"), [(1, 576), (7, 64), (40, 96), (3, 37), (2, 1), (0, 64)])
def test_rms_norm_matches_the_reference(rows: int, hidden: int) -> None:
    require_compiled_kernels()
    x, weight = _randn(rows, hidden), _randn(hidden, seed=1)
    actual = torch.ops.infer_cpu.rms_norm(x, weight, 1e-6)
    torch.testing.assert_close(actual, rms_norm_ref(x, weight, 1e-6), atol=1e-5, rtol=1e-5)


def test_rms_norm_per_head_on_a_strided_view() -> None:
    # Qwen3's q/k norm: [num_tokens, num_heads, head_dim] sliced out of a fused qkv projection
    require_compiled_kernels()
    qkv, weight = _randn(5, 3 * 4 * 32), _randn(32, seed=1)
    q = qkv[:, 4 * 32 : 2 * 4 * 32].view(5, 4, 32)
    actual = torch.ops.infer_cpu.rms_norm(q, weight, 1e-6)
    torch.testing.assert_close(actual, rms_norm_ref(q, weight, 1e-6), atol=1e-5, rtol=1e-5)
    assert actual.is_contiguous() and actual.shape == q.shape


@pytest.mark.parametrize("rows", [1, 5, 33])
def test_fused_add_rms_norm_matches_the_reference_and_leaves_its_inputs(rows: int) -> None:
    require_compiled_kernels()
    x, residual, weight = _randn(rows, 64), _randn(rows, 64, seed=1), _randn(64, seed=2)
    x_before, residual_before = x.clone(), residual.clone()
    normed, summed = torch.ops.infer_cpu.fused_add_rms_norm(x, residual, weight, 1e-5)
    expected_normed, expected_summed = fused_add_rms_norm_ref(x, residual, weight, 1e-5)
    torch.testing.assert_close(summed, expected_summed, atol=0, rtol=0)
    torch.testing.assert_close(normed, expected_normed, atol=1e-5, rtol=1e-5)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)


def test_the_kernels_refuse_what_they_cannot_take() -> None:
    require_compiled_kernels()
    with pytest.raises(RuntimeError, match="fp32 only"):
        torch.ops.infer_cpu.rms_norm(_randn(2, 8).bfloat16(), _randn(8).bfloat16(), 1e-6)
    with pytest.raises(RuntimeError, match="weight must be"):
        torch.ops.infer_cpu.rms_norm(_randn(2, 8), _randn(9), 1e-6)
    with pytest.raises(RuntimeError, match="last dimension must be contiguous"):
        torch.ops.infer_cpu.rms_norm(_randn(8, 2).t(), _randn(8), 1e-6)
    with pytest.raises(RuntimeError, match=r"\[T, hidden\]"):
        torch.ops.infer_cpu.fused_add_rms_norm(_randn(2, 8), _randn(3, 8), _randn(8), 1e-6)


def _calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    called: list[str] = []
    for name in ("rms_norm", "fused_add_rms_norm"):
        original = getattr(cpu, name)

        def counted(*args: object, _name: str = name, _original: object = original) -> object:
            called.append(_name)
            return _original(*args)  # type: ignore[operator]

        monkeypatch.setattr(cpu, name, counted)
    return called


def test_the_backends_norms_take_the_compiled_kernels_in_fp32_models_only(
    monkeypatch: pytest.MonkeyPatch, compiled: Kernels, reference: Kernels
) -> None:
    called = _calls(monkeypatch)
    x, residual, weight = _randn(3, 64), _randn(3, 64, seed=1), _randn(64, seed=2)
    with torch.inference_mode():
        torch.testing.assert_close(compiled.rms_norm(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6))
        compiled.fused_add_rms_norm(x, residual, weight, 1e-6)
        assert called == ["rms_norm", "fused_add_rms_norm"]
        # a bf16 model's backend, chosen once: its norms round as the reference does
        bf16_model = CompiledCpuKernels(torch.device("cpu"), torch.bfloat16)
        bf16 = bf16_model.rms_norm(x.bfloat16(), weight.bfloat16(), 1e-6)
        assert torch.equal(bf16, rms_norm_ref(x.bfloat16(), weight.bfloat16(), 1e-6))
        bf16_model.fused_add_rms_norm(x.bfloat16(), residual.bfloat16(), weight.bfloat16(), 1e-6)
        reference.rms_norm(x, weight, 1e-6)
    assert called == ["rms_norm", "fused_add_rms_norm"]
