"""The model's linear layers: `linear(x, weight, bias)` picks the implementation for the weight and the rows.

- an `Int8Weight` (quantized at load time): the int8 kernel (`int8.py`);
- an fp32 weight on the CPU, at most `SMALL_ROWS` rows (decode at batch 1-4), compiled kernels loaded:
  `small_linear` (`csrc/small_linear.cpp`), a matrix-vector product that streams the weight at memory
  speed, where torch's GEMM reaches about a third of it on this kind of input;
- anything else: `F.linear`, which is also the reference for both kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infer.kernels.backend import use_cpu_kernels
from infer.kernels.int8 import Int8Weight, int8_linear

SMALL_ROWS = 4  # rows up to which the compiled matrix-vector kernel runs (its register tile)


def _takes_small_linear(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        x.shape[0] <= SMALL_ROWS
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and weight.stride(-1) == 1
        and not (torch.is_grad_enabled() and weight.requires_grad)  # NOTE: the custom op has no backward
        and use_cpu_kernels(x)
    )


def linear(x: torch.Tensor, weight: torch.Tensor | Int8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` over any leading dims of x, by the fastest implementation that applies."""
    if isinstance(weight, Int8Weight):
        return int8_linear(x, weight, bias)
    x2 = x.reshape(-1, x.shape[-1])
    if _takes_small_linear(x2, weight):
        y: torch.Tensor = torch.ops.infer_cpu.small_linear(x2, weight, bias)
        return y.view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)
