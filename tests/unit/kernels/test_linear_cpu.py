"""The model's `linear`: the compiled fp32/bf16 kernel (`dense_linear`) against F.linear, and the choice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from infer.kernels import select_kernels
from infer.kernels.compiled import CompiledCpuKernels
from tests.helpers.compiled import require_compiled_kernels

SHAPES = [(96, 64), (101, 37), (3, 5), (576, 1536), (49, 576), (20, 70)]  # (N, K): odd, tails of 16 and 32


@pytest.mark.parametrize("rows", [0, 1, 2, 3, 4, 5, 9, 70])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_dense_linear_fp32_matches_f_linear(rows: int, n: int, k: int, with_bias: bool) -> None:
    require_compiled_kernels()
    gen = torch.Generator().manual_seed(rows * 1000 + n + k)
    x, w = torch.randn(rows, k, generator=gen), torch.randn(n, k, generator=gen)
    bias = torch.randn(n, generator=gen) if with_bias else None
    actual = torch.ops.infer_cpu.dense_linear(x, w, bias)
    torch.testing.assert_close(actual, F.linear(x, w, bias), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("rows", [0, 1, 3, 4, 5, 33])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_dense_linear_bf16_matches_fp32_rounded_once(rows: int, n: int, k: int, with_bias: bool) -> None:
    require_compiled_kernels()
    gen = torch.Generator().manual_seed(rows * 1000 + n + k + 7)
    x, w = torch.randn(rows, k, generator=gen).bfloat16(), torch.randn(n, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16() if with_bias else None
    actual = torch.ops.infer_cpu.dense_linear(x, w, bias)
    assert actual.dtype == torch.bfloat16
    # bf16 x bf16 products are exact in fp32: only the fp32 sum order and the one final rounding differ
    expected = F.linear(x.float(), w.float(), None if bias is None else bias.float()).bfloat16()
    torch.testing.assert_close(actual, expected, atol=2e-2, rtol=1e-2)


def test_dense_linear_reads_strided_inputs() -> None:
    require_compiled_kernels()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 40, generator=gen)[:, ::2]  # non-contiguous rows of x
    w = torch.randn(30, 50, generator=gen)[:, 5:25]  # weight rows with a stride longer than K
    torch.testing.assert_close(torch.ops.infer_cpu.dense_linear(x, w, None), F.linear(x, w), atol=1e-5, rtol=1e-5)


def test_dense_linear_refuses_what_it_cannot_take() -> None:
    require_compiled_kernels()
    with pytest.raises(RuntimeError, match="both be fp32 or both bf16"):
        torch.ops.infer_cpu.dense_linear(torch.randn(1, 8).half(), torch.randn(3, 8).half(), None)
    with pytest.raises(RuntimeError, match="both be fp32 or both bf16"):
        torch.ops.infer_cpu.dense_linear(torch.randn(1, 8), torch.randn(3, 8).bfloat16(), None)
    with pytest.raises(RuntimeError, match=r"x \[M, K\] and weight \[N, K\]"):
        torch.ops.infer_cpu.dense_linear(torch.randn(1, 8), torch.randn(3, 9), None)
    with pytest.raises(RuntimeError, match="rows must be contiguous"):
        torch.ops.infer_cpu.dense_linear(torch.randn(1, 8), torch.randn(8, 3).t(), None)
    with pytest.raises(RuntimeError, match="bias must be"):
        torch.ops.infer_cpu.dense_linear(torch.randn(1, 8), torch.randn(3, 8), torch.randn(4))


@pytest.mark.parametrize("name", ["cpu", "torch"])
@pytest.mark.parametrize("shape", [(1, 64), (3, 1, 64), (5, 64), (2, 7, 64)])
def test_linear_equals_f_linear_for_any_rows_and_backend(name: str, shape: tuple[int, ...]) -> None:
    if name == "cpu":
        require_compiled_kernels()
    kernels = select_kernels("cpu", torch.float32, name)
    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(*shape, generator=gen), torch.randn(48, 64, generator=gen), torch.randn(48, generator=gen)
    with torch.inference_mode():
        out = kernels.linear(x, w, b)
    assert out.shape == (*shape[:-1], 48)
    torch.testing.assert_close(out, F.linear(x, w, b), atol=1e-5, rtol=1e-5)


def test_linear_takes_the_kernel_in_fp32_and_bf16_models_at_any_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    # chosen once per backend by the model's dtype: an fp16 model's float weights run torch's
    calls: list[tuple[tuple[int, ...], torch.dtype]] = []
    kernel = torch.ops.infer_cpu.dense_linear

    def counting(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        calls.append((tuple(x.shape), x.dtype))
        return kernel(x, w, b)

    monkeypatch.setattr(torch.ops.infer_cpu, "dense_linear", counting)
    w = torch.randn(16, 32)
    with torch.inference_mode():
        fp32 = CompiledCpuKernels(torch.device("cpu"), torch.float32)
        fp32.linear(torch.randn(1, 32), w)
        fp32.linear(torch.randn(65, 32), w)
        CompiledCpuKernels(torch.device("cpu"), torch.bfloat16).linear(torch.randn(3, 32).bfloat16(), w.bfloat16())
        CompiledCpuKernels(torch.device("cpu"), torch.float16).linear(torch.randn(1, 32).half(), w.half())
    assert calls == [((1, 32), torch.float32), ((65, 32), torch.float32), ((3, 32), torch.bfloat16)]
