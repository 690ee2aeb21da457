"""Choosing the kernel backend, once, for the device and dtype the engine runs on.

`INFER_KERNELS` (or the `name` a caller passes) picks it:

- unset or `auto`: on CUDA, Triton when `triton` is installed; on the CPU, the
  compiled CPU kernels (`cpu.py`) when `make setup` built them for this
  machine; the PyTorch references otherwise;
- `torch`: the references, on any device;
- `cpu`: the compiled CPU kernels; an error when they are not built or the device is not the CPU;
- `triton`: Triton. Off CUDA this works only under Triton's interpreter
  (`TRITON_INTERPRET=1`, set before the kernels are imported), which is how
  the tests run the kernels on the CPU.

The choice is logged, and the engine reports it (`ModelInfo.kernels`). An error names the setting that
made the choice: `kernels=...` for a name passed in (the engine's `kernels` setting: `EngineConfig.kernels`,
which `infer serve` fills from `--kernels` or `INFER_KERNELS`), `INFER_KERNELS=...` when read here.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os

import torch

from infer.kernels import cpu
from infer.kernels.compiled import CompiledCpuKernels
from infer.kernels.env import is_interpreted
from infer.kernels.interface import Kernels
from infer.kernels.reference import ReferenceKernels

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "torch", "cpu", "triton")


@functools.cache
def triton_installed() -> bool:
    """Whether the `triton` package can be imported (looked up without importing it)."""
    return importlib.util.find_spec("triton") is not None


def cpu_has_bf16_dot() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX), so bf16 weights pay off."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu.cpu_flags())


def _setting_name(name: str | None) -> str:
    """The setting that chose the backend, as errors name it: `kernels` when a caller passed `name`, else the
    environment variable this module read."""
    return "INFER_KERNELS" if name is None else "kernels"


def requested_backend(name: str | None = None) -> str:
    """`name`, else INFER_KERNELS, else `auto`; ValueError for anything but auto, torch, cpu or triton."""
    chosen = (os.environ.get("INFER_KERNELS", "") if name is None else name).strip().lower() or "auto"
    if chosen not in BACKENDS:
        raise ValueError(f"{_setting_name(name)}={chosen!r}: expected one of {', '.join(BACKENDS)}")
    return chosen


def _resolve(requested: str, device: torch.device, setting: str) -> str:
    """The backend `requested` (by `setting`) means on `device`; RuntimeError, naming the setting, when it cannot
    run there."""
    if requested == "auto":
        if device.type == "cuda":
            return "triton" if triton_installed() else "torch"
        return "cpu" if device.type == "cpu" and cpu.load() else "torch"
    if requested == "triton" and not triton_installed():
        raise RuntimeError(f"{setting}=triton but the `triton` package is not installed")
    if requested == "triton" and device.type != "cuda" and not is_interpreted():
        raise RuntimeError(f"{setting}=triton runs on CUDA, or on {device.type} under TRITON_INTERPRET=1")
    if requested == "cpu" and device.type != "cpu":
        raise RuntimeError(f"{setting}=cpu runs on device cpu, not {device}")
    if requested == "cpu" and not cpu.load():
        raise RuntimeError(f"{setting}=cpu but the compiled CPU kernels are not built ({cpu.library_path()})")
    return requested


def _backend_class(name: str) -> type[Kernels]:
    if name == "triton":
        # NOTE: imported here, never at module load: the other backends must not import triton
        from infer.kernels.triton_backend import TritonKernels

        return TritonKernels
    return CompiledCpuKernels if name == "cpu" else ReferenceKernels


def select_kernels(device: torch.device | str, dtype: torch.dtype, name: str | None = None) -> Kernels:
    """The kernel backend for a device and dtype: `name` or INFER_KERNELS (auto, torch, cpu, triton), once."""
    device = torch.device(device)
    requested = requested_backend(name)
    kernels = _backend_class(_resolve(requested, device, _setting_name(name)))(device, dtype)
    logger.info("kernels: %s (asked for %s)", kernels, requested)
    if dtype == torch.bfloat16 and device.type == "cpu" and not cpu_has_bf16_dot():
        logger.warning("this CPU has no bf16 dot products (avx512_bf16/amx_bf16): bf16 runs slower than fp32")
    return kernels
