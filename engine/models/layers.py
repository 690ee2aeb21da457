"""The model's leaf layers over the kernel backend: `Linear` (float or packed weight) and `RMSNorm`."""

from __future__ import annotations

import torch
from torch import nn

from infer.kernels import Kernels, LinearWeight, PackedWeight


def empty_param(*shape: int) -> nn.Parameter:
    """A parameter the loader fills (no gradient: inference only)."""
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class Linear(nn.Module):
    """`x @ weight.T + bias` on the model's kernels. It owns its weight: a float parameter the loader fills
    (or shares, for a tied LM head), which `quantize` replaces by the backend's packed form (int8, int4); a
    GGUF file's int4, int5 or int8g blocks are placed packed at load."""

    weight: LinearWeight

    def __init__(
        self,
        in_features: int,
        out_features: int,
        kernels: Kernels,
        bias: bool = False,
        weight: nn.Parameter | None = None,  # a parameter shared with another module (a tied LM head)
    ) -> None:
        super().__init__()
        self.kernels, self.in_features, self.out_features = kernels, in_features, out_features
        self.weight = weight if weight is not None else empty_param(out_features, in_features)
        self.bias = empty_param(out_features) if bias else None

    def quantize(self, method: str) -> None:
        """Pack the float weight as `method` (int8, int4); a shared weight stays as it is for its other owner."""
        if not isinstance(self.weight, torch.Tensor):
            raise ValueError(f"this layer's weight is packed already ({type(self.weight).__name__})")
        self.use_packed(self.kernels.quantize(self.weight, method))

    def use_packed(self, weight: PackedWeight) -> None:
        """Run on `weight`, a packed form of this layer's weight (quantized, or a file's own bits)."""
        if weight.shape != (self.out_features, self.in_features):
            raise ValueError(f"a packed weight of shape {weight.shape} for a [{self.out_features}, "
                             f"{self.in_features}] layer")  # fmt: skip
        del self.weight  # NOTE: a packed weight is no parameter: unregister the float one, then keep the packed
        self.weight = weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in_features] -> [..., out_features]
        return self.kernels.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, kernels: Kernels) -> None:
        super().__init__()
        self.weight, self.eps, self.kernels = empty_param(dim), eps, kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, dim] or [num_tokens, heads, dim]
        return self.kernels.rms_norm(x, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`residual = x + residual`, then this norm of it: (normed, residual), both [num_tokens, dim]."""
        return self.kernels.fused_add_rms_norm(x, residual, self.weight, self.eps)
