"""Which implementation runs a kernel: Triton, the compiled CPU kernels or the PyTorch references.

`INFER_KERNELS` picks one for the whole process (read at the first kernel call):

- unset or `auto`: Triton for CUDA tensors when `triton` is installed; the compiled
  CPU kernels (`kernels/cpu.py`) for CPU tensors when `make setup` built them for
  this machine; the references for everything else;
- `torch`: always the references;
- `cpu`: the compiled CPU kernels for CPU tensors; an error when they are not built;
- `triton`: always Triton. On a machine without CUDA this only works under
  Triton's interpreter (`TRITON_INTERPRET=1`, set before the kernels are
  imported), which is how the tests run the kernels on the CPU.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from infer.kernels import cpu

BACKENDS = ("auto", "torch", "triton", "cpu")
_TRUE = ("1", "true", "yes", "on", "y")

_selected: str | None = None


def is_interpreted() -> bool:
    """True when Triton kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in _TRUE


def _check(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"INFER_KERNELS={name!r}: expected one of {', '.join(BACKENDS)}")
    if name == "triton" and not triton_installed():
        raise RuntimeError("INFER_KERNELS=triton but the `triton` package is not installed")
    if name == "triton" and not torch.cuda.is_available() and not is_interpreted():
        raise RuntimeError("INFER_KERNELS=triton needs CUDA, or TRITON_INTERPRET=1 to run kernels on the CPU")
    if name == "cpu" and not cpu.load():
        raise RuntimeError(f"INFER_KERNELS=cpu but the compiled CPU kernels are not built ({cpu.library_path()})")
    return name


@functools.cache
def triton_installed() -> bool:
    """Whether the `triton` package can be imported (looked up without importing it)."""
    return importlib.util.find_spec("triton") is not None


def kernel_backend() -> str:
    """The backend in force: `auto`, `torch`, `triton` or `cpu` (INFER_KERNELS, checked once)."""
    global _selected
    if _selected is None:
        _selected = _check(os.environ.get("INFER_KERNELS", "auto").strip().lower() or "auto")
    return _selected


def set_kernel_backend(name: str | None) -> None:
    """Force a backend for this process; None goes back to INFER_KERNELS (read at the next call)."""
    global _selected
    _selected = None if name is None else _check(name)


def use_triton(x: torch.Tensor) -> bool:
    """Whether a kernel called on `x` runs in Triton."""
    backend = kernel_backend()
    return backend == "triton" or (backend == "auto" and x.is_cuda and triton_installed())


def use_cpu_kernels(x: torch.Tensor) -> bool:
    """Whether a kernel called on `x` runs the compiled CPU kernels (loaded at the first such call)."""
    backend = kernel_backend()
    return x.device.type == "cpu" and (backend == "cpu" or (backend == "auto" and cpu.load()))
