"""Rotary position embeddings with explicit positions: the Triton kernel and its wrapper.

Reference: `infer.kernels.rotary.apply_rotary_ref`. Imported lazily (it imports triton).
The table comes from `cos_sin_cache` (default, linear or llama3-scaled frequencies):
the kernel only reads it, so every RoPE flavour shares one kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotary_kernel(
    x_ptr,  # [num_tokens, num_heads, head_dim]
    out_ptr,  # [num_tokens, num_heads, head_dim]; may be x itself (in place)
    positions_ptr,  # [num_tokens] int64
    cache_ptr,  # [max_positions, rotary_dim] fp32: cos | sin
    stride_xt, stride_xh, stride_ot, stride_oh, stride_cache,
    num_heads, head_dim,
    HALF: tl.constexpr,  # rotary_dim // 2
    BLOCK_H: tl.constexpr,  # >= num_heads
    BLOCK_HALF: tl.constexpr,  # >= HALF
    BLOCK_REST: tl.constexpr,  # >= head_dim - 2 * HALF; 0 when nothing to copy
):  # fmt: skip
    # one program per token: all its heads (neox: rotate the halves of the first rotary_dim dims)
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token)
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < num_heads) & (dims < HALF)
    cos = tl.load(cache_ptr + pos * stride_cache + dims, mask=dims < HALF)
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + dims, mask=dims < HALF)
    x_row = x_ptr + token * stride_xt + heads * stride_xh
    out_row = out_ptr + token * stride_ot + heads * stride_oh
    x1 = tl.load(x_row + dims, mask=mask).to(tl.float32)
    x2 = tl.load(x_row + HALF + dims, mask=mask).to(tl.float32)
    tl.store(out_row + dims, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_row + HALF + dims, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    if BLOCK_REST > 0:
        # partial rotary: the dims past rotary_dim pass through
        rest = 2 * HALF + tl.arange(0, BLOCK_REST)[None, :]
        rest_mask = (heads < num_heads) & (rest < head_dim)
        tl.store(out_row + rest, tl.load(x_row + rest, mask=rest_mask), mask=rest_mask)


def apply_rotary_triton(
    x: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    positions: torch.Tensor,  # [num_tokens] int64
    cache: torch.Tensor,  # [max_positions, rotary_dim] from cos_sin_cache
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]; `x` rotates in place
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim], neox (half-split) rotation
    """Rotate `x` by the angles of its tokens' positions; into `out` when given."""
    num_tokens, num_heads, head_dim = x.shape
    rotary_dim = cache.shape[1]
    assert positions.shape == (num_tokens,) and rotary_dim % 2 == 0 and rotary_dim <= head_dim
    assert cache.dtype == torch.float32 and cache.stride(1) == 1
    out = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    assert out.shape == x.shape and out.dtype == x.dtype and out.stride(-1) == 1
    if x.stride(-1) != 1:
        x = x.contiguous()
    if num_tokens == 0:
        return out
    copy_rest = head_dim > rotary_dim and out.data_ptr() != x.data_ptr()
    _rotary_kernel[(num_tokens,)](
        x, out, positions, cache,
        x.stride(0), x.stride(1), out.stride(0), out.stride(1), cache.stride(0),
        num_heads, head_dim,
        HALF=rotary_dim // 2,
        BLOCK_H=triton.next_power_of_2(num_heads),
        BLOCK_HALF=triton.next_power_of_2(rotary_dim // 2),
        BLOCK_REST=triton.next_power_of_2(head_dim - rotary_dim) if copy_rest else 0,
    )  # fmt: skip
    return out
