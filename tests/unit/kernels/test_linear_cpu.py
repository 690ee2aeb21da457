"""The model's `linear`: the compiled matrix-vector kernel for a few fp32 rows against F.linear, and the choice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from infer.kernels import Kernels, select_kernels
from infer.kernels.compiled import SMALL_ROWS
from tests.helpers.compiled import require_compiled_kernels


@pytest.mark.parametrize("rows", [0, 1, 2, 3, 4])
@pytest.mark.parametrize(("n", "k"), [(96, 64), (101, 37), (3, 5), (576, 1536), (49, 576)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_small_linear_matches_f_linear(rows: int, n: int, k: int, with_bias: bool) -> None:
    require_compiled_kernels()
    gen = torch.Generator().manual_seed(rows * 1000 + n + k)
    x, w = torch.randn(rows, k, generator=gen), torch.randn(n, k, generator=gen)
    bias = torch.randn(n, generator=gen) if with_bias else None
    actual = torch.ops.infer_cpu.small_linear(x, w, bias)
    torch.testing.assert_close(actual, F.linear(x, w, bias), atol=1e-4, rtol=1e-5)


def test_small_linear_reads_strided_inputs() -> None:
    require_compiled_kernels()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 40, generator=gen)[:, ::2]  # non-contiguous rows of x
    w = torch.randn(30, 50, generator=gen)[:, 5:25]  # weight rows with a stride longer than K
    torch.testing.assert_close(torch.ops.infer_cpu.small_linear(x, w, None), F.linear(x, w), atol=1e-5, rtol=1e-5)


def test_small_linear_refuses_what_it_cannot_take() -> None:
    require_compiled_kernels()
    with pytest.raises(RuntimeError, match="at most 4 rows"):
        torch.ops.infer_cpu.small_linear(torch.randn(5, 8), torch.randn(3, 8), None)
    with pytest.raises(RuntimeError, match="fp32 only"):
        torch.ops.infer_cpu.small_linear(torch.randn(1, 8).bfloat16(), torch.randn(3, 8).bfloat16(), None)
    with pytest.raises(RuntimeError, match=r"x \[M, K\] and weight \[N, K\]"):
        torch.ops.infer_cpu.small_linear(torch.randn(1, 8), torch.randn(3, 9), None)


@pytest.mark.parametrize("name", ["cpu", "torch"])
@pytest.mark.parametrize("shape", [(1, 64), (3, 1, 64), (SMALL_ROWS + 1, 64), (2, 7, 64)])
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


def test_linear_takes_the_kernel_for_a_few_fp32_rows_only(compiled: Kernels, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []
    kernel = torch.ops.infer_cpu.small_linear

    def counting(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        calls.append(tuple(x.shape))
        return kernel(x, w, b)

    monkeypatch.setattr(torch.ops.infer_cpu, "small_linear", counting)
    w = torch.randn(16, 32)
    with torch.inference_mode():
        compiled.linear(torch.randn(SMALL_ROWS, 32), w)
        compiled.linear(torch.randn(SMALL_ROWS + 1, 32), w)  # a GEMM: torch's
        compiled.linear(torch.randn(1, 32).bfloat16(), w.bfloat16())  # not fp32
    w.requires_grad_(True)
    compiled.linear(torch.randn(1, 32), w)  # autograd needs a backward the kernel does not have
    assert calls == [(SMALL_ROWS, 32)]
