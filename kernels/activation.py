"""Gated MLP activations on a fused gate/up projection: PyTorch references."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:  # [num_tokens, 2 * d] -> [num_tokens, d]
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul_ref(x: torch.Tensor) -> torch.Tensor:  # [num_tokens, 2 * d] -> [num_tokens, d]
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up
