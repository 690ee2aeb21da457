"""RMSNorm and fused residual-add + RMSNorm: PyTorch references."""

from __future__ import annotations

import torch


def rms_norm_ref(
    x: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:  # [num_tokens, hidden]
    """Normalise in fp32, then scale: `weight * (x / rms(x))`."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32 and weight.dim() == 1:
        # one fused op; the same values as the spelled-out formula below in fp32
        return torch.nn.functional.rms_norm(x, weight.shape, weight, eps)
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor,  # [num_tokens, hidden]
    residual: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # (normed, new residual), both [num_tokens, hidden]
    residual = x + residual
    return rms_norm_ref(residual, weight, eps), residual
