"""Gated MLP activations on a fused gate/up projection: the Triton kernel and its wrappers.

References: `infer.kernels.activation.silu_and_mul_ref`, `gelu_tanh_and_mul_ref`.
Imported lazily (it imports triton).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK_COLS = 1024
_TILE_ELEMENTS = 4096


@triton.jit
def _act_and_mul_kernel(
    x_ptr,  # [num_tokens, 2 * d]: gate | up
    out_ptr,  # [num_tokens, d] contiguous
    num_tokens, d, stride_xt,
    ROWS: tl.constexpr, BLOCK: tl.constexpr,
    IS_GELU: tl.constexpr,  # gelu (tanh approximation) instead of silu
):  # fmt: skip
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)[None, :]
    mask = (rows < num_tokens) & (cols < d)
    gate = tl.load(x_ptr + rows * stride_xt + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + rows * stride_xt + d + cols, mask=mask, other=0.0).to(tl.float32)
    if IS_GELU:
        # 0.5 * (1 + tanh(z)) == sigmoid(2 * z), z = sqrt(2 / pi) * (g + 0.044715 * g**3)
        act = gate * tl.sigmoid(2.0 * 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate))
    else:
        act = gate * tl.sigmoid(gate)
    tl.store(out_ptr + rows * d + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def _act_and_mul(x: torch.Tensor, is_gelu: bool) -> torch.Tensor:  # [num_tokens, 2 * d] -> [num_tokens, d]
    assert x.dim() == 2 and x.shape[1] % 2 == 0
    x = x if x.stride(-1) == 1 else x.contiguous()
    num_tokens, d = x.shape[0], x.shape[1] // 2
    out = torch.empty(num_tokens, d, dtype=x.dtype, device=x.device)
    if num_tokens == 0 or d == 0:
        return out
    block = min(_BLOCK_COLS, triton.next_power_of_2(d))
    rows = max(1, _TILE_ELEMENTS // block)
    grid = (triton.cdiv(num_tokens, rows), triton.cdiv(d, block))
    _act_and_mul_kernel[grid](x, out, num_tokens, d, x.stride(0), ROWS=rows, BLOCK=block, IS_GELU=is_gelu)
    return out


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:  # [num_tokens, 2 * d] -> [num_tokens, d]
    return _act_and_mul(x, is_gelu=False)


def gelu_tanh_and_mul_triton(x: torch.Tensor) -> torch.Tensor:  # [num_tokens, 2 * d] -> [num_tokens, d]
    return _act_and_mul(x, is_gelu=True)
