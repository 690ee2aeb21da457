"""Choosing the kernel backend once per device and dtype: INFER_KERNELS, the defaults, refusals, the log line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from infer.kernels import Kernels, backend, cpu, select_kernels
from tests.helpers.compiled import require_compiled_kernels
from tests.helpers.device import TEST_DEVICE


def test_auto_on_the_cpu_is_the_compiled_kernels_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    require_compiled_kernels()
    monkeypatch.delenv("INFER_KERNELS", raising=False)
    assert select_kernels("cpu", torch.float32).name == "cpu"
    monkeypatch.setattr(cpu, "load", lambda: False)
    assert select_kernels("cpu", torch.float32).name == "torch"


def test_auto_on_cuda_is_triton_when_installed_else_the_references(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFER_KERNELS", raising=False)
    monkeypatch.setattr(backend, "triton_installed", lambda: False)
    assert select_kernels("cuda", torch.float16).name == "torch"
    monkeypatch.setattr(backend, "triton_installed", lambda: True)
    assert select_kernels("cuda", torch.float16).name == "triton"


@pytest.mark.parametrize("name", ["torch", "triton"])
def test_env_var_forces_a_backend(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFER_KERNELS", name)
    kernels = select_kernels("cpu", torch.float32)
    assert kernels.name == name and kernels.device == torch.device("cpu") and kernels.dtype == torch.float32


def test_a_name_passed_in_wins_over_the_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFER_KERNELS", "cuda-please")
    assert select_kernels("cpu", torch.float32, "torch").name == "torch"


def test_unknown_backend_is_refused_naming_the_setting_that_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFER_KERNELS", "cuda")
    with pytest.raises(ValueError, match=r"^INFER_KERNELS='cuda': expected one of auto, torch, cpu, triton"):
        select_kernels("cpu", torch.float32)
    monkeypatch.setenv("INFER_KERNELS", "torch")  # a name passed in chose: the engine's `kernels` setting
    with pytest.raises(ValueError, match=r"^kernels='cuda': expected one of auto, torch, cpu, triton"):
        select_kernels("cpu", torch.float32, "cuda")


def test_forcing_triton_without_the_package_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend, "triton_installed", lambda: False)
    with pytest.raises(RuntimeError, match="`triton` package is not installed"):
        select_kernels("cuda", torch.float16, "triton")


def test_triton_off_cuda_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        select_kernels("cpu", torch.float32, "triton")


def test_the_compiled_cpu_kernels_on_another_device_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFER_KERNELS", "cpu")
    with pytest.raises(RuntimeError, match=r"^INFER_KERNELS=cpu runs on device cpu, not cuda"):
        select_kernels("cuda", torch.float16)


@pytest.mark.parametrize("env", [None, "cpu", "torch"])
def test_a_name_passed_in_is_the_setting_its_errors_name(env: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--kernels` / `EngineConfig.kernels` reach here as `name`: the error says `kernels=`, never the variable."""
    if env is None:
        monkeypatch.delenv("INFER_KERNELS", raising=False)
    else:
        monkeypatch.setenv("INFER_KERNELS", env)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match=r"^kernels=cpu runs on device cpu, not cuda"):
        select_kernels("cuda", torch.float16, "cpu")
    with pytest.raises(RuntimeError, match=r"^kernels=triton runs on CUDA, or on cpu under TRITON_INTERPRET=1"):
        select_kernels("cpu", torch.float32, "triton")
    monkeypatch.setattr(backend, "triton_installed", lambda: False)
    with pytest.raises(RuntimeError, match=r"^kernels=triton but the `triton` package is not installed"):
        select_kernels("cuda", torch.float16, "triton")


def test_the_choice_is_logged_once_with_device_and_dtype(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="infer.kernels.backend"):
        select_kernels("cpu", torch.bfloat16, "torch")
    lines = [r.getMessage() for r in caplog.records if r.name == "infer.kernels.backend" and r.levelname == "INFO"]
    assert lines == ["kernels: PyTorch reference kernels (INFER_KERNELS=torch) on cpu bfloat16 (asked for torch)"]


def test_bf16_on_a_cpu_without_bf16_dot_products_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2"}))
    with caplog.at_level("WARNING", logger="infer.kernels.backend"):
        select_kernels("cpu", torch.float32, "torch")
        assert "bf16 runs slower" not in caplog.text
        select_kernels("cpu", torch.bfloat16, "torch")
    assert "this CPU has no bf16 dot products" in caplog.text


@pytest.mark.triton
def test_the_triton_backend_runs_triton_kernels_and_the_reference_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    from infer.kernels import activation_triton

    calls = []

    def fake(x: torch.Tensor) -> torch.Tensor:
        calls.append(x)
        return x

    monkeypatch.setattr(activation_triton, "silu_and_mul_triton", fake)
    x = torch.randn(2, 8, device=TEST_DEVICE)  # the GPU under `make test-gpu`, else the interpreter's CPU
    select_kernels(TEST_DEVICE, torch.float32, "torch").silu_and_mul(x)
    triton: Kernels = select_kernels(TEST_DEVICE, torch.float32, "triton")
    triton.silu_and_mul(x)
    assert len(calls) == 1 and calls[0] is x


def test_the_cpu_path_never_imports_triton() -> None:
    code = (
        "import sys, torch\n"
        "from infer.kernels import RopeConfig, RotaryAngles, cos_sin_cache, select_kernels\n"
        "kernels = select_kernels('cpu', torch.float32)\n"
        "x = torch.randn(3, 2, 8)\n"
        "rope = RotaryAngles.lookup(torch.arange(3), cos_sin_cache(RopeConfig(1e4, 8), 8))\n"
        "kernels.apply_rotary(x, rope)\n"
        "kernels.rms_norm(x, torch.ones(8), 1e-6)\n"
        "kernels.silu_and_mul(x[:, 0])\n"
        "kernels.linear(x, torch.ones(4, 8))\n"
        "assert kernels.name in ('cpu', 'torch')\n"
        "print('triton' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("INFER_KERNELS", "TRITON_INTERPRET")}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
