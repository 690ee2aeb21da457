"""The device the kernel tests run on: the CPU (Triton's interpreter) unless `make test-gpu` asks for CUDA.

`INFER_TEST_DEVICE=cuda` compiles the Triton kernels for real and runs them, and their PyTorch
references, on the GPU. Without CUDA those runs are skipped (tests/conftest.py), not failed.
"""

from __future__ import annotations

import os

import torch

TEST_DEVICE = torch.device(os.environ.get("INFER_TEST_DEVICE", "cpu"))
ON_CUDA = TEST_DEVICE.type == "cuda"


def cuda_missing() -> bool:
    """CUDA was asked for and this machine has none."""
    return ON_CUDA and not torch.cuda.is_available()
