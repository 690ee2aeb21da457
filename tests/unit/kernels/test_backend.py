"""Choosing the kernel backend: INFER_KERNELS, the CUDA default, and a triton-free CPU path."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from infer import kernels
from infer.kernels import kernel_backend, set_kernel_backend
from infer.kernels.backend import use_triton


def test_default_runs_cpu_tensors_on_the_references(monkeypatch: pytest.MonkeyPatch, backend: None) -> None:
    monkeypatch.delenv("INFER_KERNELS", raising=False)
    set_kernel_backend(None)
    assert kernel_backend() == "auto"
    assert not use_triton(torch.zeros(1))


class _CudaLike:
    is_cuda = True


def test_auto_without_triton_runs_cuda_tensors_on_the_references(
    monkeypatch: pytest.MonkeyPatch, backend: None
) -> None:
    monkeypatch.delenv("INFER_KERNELS", raising=False)
    set_kernel_backend(None)
    monkeypatch.setattr(kernels.backend, "triton_installed", lambda: False)
    assert kernel_backend() == "auto"
    assert not use_triton(_CudaLike())  # type: ignore[arg-type]
    monkeypatch.setattr(kernels.backend, "triton_installed", lambda: True)
    assert use_triton(_CudaLike())  # type: ignore[arg-type]


def test_forcing_triton_without_the_package_says_so(monkeypatch: pytest.MonkeyPatch, backend: None) -> None:
    monkeypatch.setattr(kernels.backend, "triton_installed", lambda: False)
    with pytest.raises(RuntimeError, match="`triton` package is not installed"):
        set_kernel_backend("triton")


@pytest.mark.parametrize("name", ["torch", "triton"])
def test_env_var_forces_a_backend(name: str, monkeypatch: pytest.MonkeyPatch, backend: None) -> None:
    pytest.importorskip("triton")
    monkeypatch.setenv("INFER_KERNELS", name)
    set_kernel_backend(None)
    assert kernel_backend() == name
    assert use_triton(torch.zeros(1)) == (name == "triton")


def test_unknown_backend_is_refused(monkeypatch: pytest.MonkeyPatch, backend: None) -> None:
    monkeypatch.setenv("INFER_KERNELS", "cuda")
    set_kernel_backend(None)
    with pytest.raises(ValueError, match="INFER_KERNELS='cuda'"):
        kernel_backend()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_triton_without_cuda_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch, backend: None) -> None:
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        set_kernel_backend("triton")


@pytest.mark.triton
def test_public_kernels_dispatch_to_triton(monkeypatch: pytest.MonkeyPatch, backend: None) -> None:
    pytest.importorskip("triton")
    from infer.kernels import activation_triton

    calls = []

    def fake(x: torch.Tensor) -> torch.Tensor:
        calls.append(x)
        return x

    monkeypatch.setattr(activation_triton, "silu_and_mul_triton", fake)
    x = torch.randn(2, 8)
    set_kernel_backend("torch")
    kernels.silu_and_mul(x)
    set_kernel_backend("triton")
    kernels.silu_and_mul(x)
    assert len(calls) == 1 and calls[0] is x


def test_cpu_path_never_imports_triton() -> None:
    code = (
        "import sys, torch\n"
        "from infer import kernels\n"
        "x = torch.randn(3, 2, 8)\n"
        "rope = kernels.RotaryAngles.lookup(torch.arange(3), kernels.cos_sin_cache(kernels.RopeConfig(1e4, 8), 8))\n"
        "kernels.apply_rotary(x, rope)\n"
        "kernels.rms_norm(x, torch.ones(8), 1e-6)\n"
        "kernels.silu_and_mul(x[:, 0])\n"
        "assert kernels.kernel_backend() == 'auto'\n"
        "print('triton' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("INFER_KERNELS", "TRITON_INTERPRET")}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
