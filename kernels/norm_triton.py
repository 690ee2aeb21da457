"""RMSNorm and fused residual-add + RMSNorm: the Triton kernel and its wrappers.

References: `infer.kernels.norm.rms_norm_ref`, `fused_add_rms_norm_ref`.
Imported lazily (it imports triton).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_TILE_ELEMENTS = 4096  # elements per program: several short rows, or one long one


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # rows of [num_tokens, num_heads, hidden] or [num_tokens, hidden] (num_heads = 1)
    residual_ptr,  # [num_tokens, hidden]; unused without HAS_RESIDUAL
    residual_out_ptr,  # [num_tokens, hidden]: x + residual; unused without HAS_RESIDUAL
    weight_ptr,  # [hidden]
    out_ptr,  # [num_rows, hidden] contiguous
    num_rows, num_heads, hidden, eps,
    stride_xt, stride_xh, stride_rt, stride_rot,  # x: token, head; residual, residual_out: token
    ROWS: tl.constexpr, BLOCK_D: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)[None, :]
    mask = (rows < num_rows)[:, None] & (cols < hidden)
    rows = rows.to(tl.int64)
    x_offs = ((rows // num_heads) * stride_xt + (rows % num_heads) * stride_xh)[:, None] + cols
    x = tl.load(x_ptr + x_offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + rows[:, None] * stride_rt + cols, mask=mask, other=0.0)
        summed = (x + residual.to(tl.float32)).to(residual_out_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + rows[:, None] * stride_rot + cols, summed, mask=mask)
        normed_dtype = residual_out_ptr.dtype.element_ty
        x = summed.to(tl.float32)
    else:
        normed_dtype = x_ptr.dtype.element_ty
    inv_rms = tl.rsqrt(tl.sum(x * x, 1) / hidden + eps)
    # like the reference: normalise in fp32, round to the input dtype, then scale
    normed = (x * inv_rms[:, None]).to(normed_dtype).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=cols < hidden, other=0.0).to(tl.float32)
    out = (normed * weight).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows[:, None] * hidden + cols, out, mask=mask)


def _launch(
    x: torch.Tensor,  # [num_tokens, num_heads, hidden] or [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None,  # [num_tokens, hidden]
) -> tuple[torch.Tensor, torch.Tensor | None]:  # (normed, x + residual)
    hidden = x.shape[-1]
    assert weight.shape == (hidden,) and x.dim() in (2, 3)
    x = x if x.stride(-1) == 1 else x.contiguous()
    num_heads = x.shape[1] if x.dim() == 3 else 1
    stride_xh = x.stride(1) if x.dim() == 3 else 0
    summed = None
    if residual is not None:
        assert x.dim() == 2 and residual.shape == x.shape and residual.stride(-1) == 1
        summed = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, residual.dtype), device=x.device)
    normed_dtype = x.dtype if summed is None else summed.dtype
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, normed_dtype), device=x.device)
    num_rows = x.numel() // hidden
    if num_rows == 0:
        return out, summed
    block_d = triton.next_power_of_2(hidden)
    rows = max(1, _TILE_ELEMENTS // block_d)
    _rms_norm_kernel[(triton.cdiv(num_rows, rows),)](
        x, x if residual is None else residual, x if summed is None else summed, weight, out,
        num_rows, num_heads, hidden, eps,
        x.stride(0), stride_xh, 0 if residual is None else residual.stride(0), hidden,
        ROWS=rows, BLOCK_D=block_d, HAS_RESIDUAL=residual is not None,
    )  # fmt: skip
    return out, summed


def rms_norm_triton(
    x: torch.Tensor,  # [num_tokens, hidden] or [num_tokens, num_heads, head_dim]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:  # shaped like x
    """Normalise in fp32, then scale: `weight * (x / rms(x))`."""
    return _launch(x, weight, eps, None)[0]


def fused_add_rms_norm_triton(
    x: torch.Tensor,  # [num_tokens, hidden]
    residual: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # (normed, new residual), both [num_tokens, hidden]
    """`residual = x + residual`, then RMSNorm of it, in one pass."""
    normed, summed = _launch(x, weight, eps, residual)
    assert summed is not None
    return normed, summed
