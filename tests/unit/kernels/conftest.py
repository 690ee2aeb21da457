"""Kernel tests: the Triton kernels run in Triton's interpreter, on CPU tensors, on any machine.

Under `make test-gpu` (INFER_TEST_DEVICE=cuda) the same tests compile the kernels for real and run
them on the GPU instead; the interpreter stays off.

NOTE: TRITON_INTERPRET must be set before the first `@triton.jit` runs, i.e.
before any `infer.kernels.*_triton` module is imported. pytest imports this
file before the test modules of this folder, and nothing outside it imports
those modules (the CPU path never does), so setting it here is early enough;
the check below fails loudly if that ever stops being true. Other tests are
unaffected: the reference path never imports triton.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from infer.kernels import Kernels, select_kernels
from tests.helpers.compiled import require_compiled_kernels
from tests.helpers.device import ON_CUDA

if not ON_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
_early = sorted(m for m in sys.modules if m.startswith("infer.kernels.") and m.endswith("_triton"))
if _early and not ON_CUDA:
    raise RuntimeError(f"{', '.join(_early)} imported before TRITON_INTERPRET=1 was set")


@pytest.fixture
def compiled() -> Kernels:
    """The compiled CPU backend (skipped only where no C++ compiler exists)."""
    require_compiled_kernels()
    return select_kernels("cpu", torch.float32, "cpu")


@pytest.fixture
def reference() -> Kernels:
    """The PyTorch reference backend."""
    return select_kernels("cpu", torch.float32, "torch")
