"""Paged, variable-length attention: the Triton kernel and its wrapper.

Reference: `infer.kernels.attention.paged_attention_ref`. Imported lazily (it imports triton).

One launch serves the whole flat batch. A program owns one query tile of one
sequence and one kv head: `BLOCK_Q` consecutive query tokens times the `GROUP`
query heads that share the kv head, `BLOCK_M = BLOCK_Q * GROUP` rows (so GQA
reads each key once per group). It walks the sequence's keys in tiles of
`TILE_N`, gathered through the block table, with an fp32 online softmax. A
decode token is a tile of one query; a prefill chunk is causal within itself
and sees all of the cached context before it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infer.kernels.attention import AttentionMetadata, AttentionSpec
from infer.kernels.env import is_interpreted
from infer.kernels.kv_cache_triton import write_kv_triton

TILE_N = 32  # keys per step of the online softmax
_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


@triton.jit
def _find_seq(query_start_loc_ptr, num_seqs, q_tile, BLOCK_Q: tl.constexpr):
    # sequence i owns the tiles from query_start_loc[i] // BLOCK_Q + i on: the last i at or below q_tile
    lo = tl.zeros([], tl.int32)
    hi = lo + num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= q_tile:
            lo = mid
        else:
            hi = mid - 1
    return lo


@triton.jit
def _attend_keys(
    q,  # [BLOCK_M, BLOCK_D] query rows, in DOT_DTYPE
    q_pos,  # [BLOCK_M] position of each row in its sequence
    k_cache_ptr, v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    table_ptr,  # [max_blocks] int32: this sequence's block table
    kv_offset, stride_cb, stride_cs,  # kv_head * head stride; block and slot strides
    key_lo, key_hi, seq_len, head_dim, scale, softcap, sliding_window,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, TILE_N: tl.constexpr,
    USE_WINDOW: tl.constexpr, USE_SOFTCAP: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    dims = tl.arange(0, BLOCK_D)
    m_i = tl.full([BLOCK_M], -1e30, tl.float32)  # finite: a row with no visible key yet stays NaN-free
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(key_lo, key_hi, TILE_N):
        keys = start + tl.arange(0, TILE_N)
        key_ok = keys < seq_len
        # NOTE: int64 offsets: block * stride_cb passes 2**31 elements in a large cache
        blocks = tl.load(table_ptr + keys // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
        offs = (blocks * stride_cb + (keys % BLOCK_SIZE) * stride_cs + kv_offset)[:, None] + dims[None, :]
        kv_mask = key_ok[:, None] & (dims < head_dim)[None, :]
        k = tl.load(k_cache_ptr + offs, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # [BLOCK_M, TILE_N] fp32
        if USE_SOFTCAP:
            s = softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0)  # softcap * tanh(s / softcap)
        visible = (keys[None, :] <= q_pos[:, None]) & key_ok[None, :]
        if USE_WINDOW:
            visible = visible & (keys[None, :] > q_pos[:, None] - sliding_window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        v = tl.load(v_cache_ptr + offs, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    return acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]


@triton.jit
def _paged_attention_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_cache_ptr, v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks] int32
    query_start_loc_ptr,  # [num_seqs + 1] int32
    seq_lens_ptr,  # [num_seqs] int32, including this step's tokens
    num_seqs, head_dim, scale, softcap, sliding_window,
    stride_qt, stride_qh, stride_ot, stride_oh,  # query / out: token, head
    stride_cb, stride_cs, stride_ch, stride_table,  # caches: block, slot, head; block table row
    GROUP: tl.constexpr,  # query heads per kv head
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    TILE_N: tl.constexpr, USE_WINDOW: tl.constexpr, USE_SOFTCAP: tl.constexpr, DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    q_tile, kv_head = tl.program_id(0), tl.program_id(1)
    seq = _find_seq(query_start_loc_ptr, num_seqs, q_tile, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    first = (q_tile - (q_start // BLOCK_Q + seq)) * BLOCK_Q  # first query of the tile, in the chunk
    if first >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    rows = tl.arange(0, BLOCK_M)
    tok = first + rows // GROUP  # query index in the chunk
    head = kv_head * GROUP + rows % GROUP
    dims = tl.arange(0, BLOCK_D)
    mask = ((rows // GROUP < BLOCK_Q) & (tok < q_len))[:, None] & (dims < head_dim)[None, :]
    token = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + (token * stride_qt + head * stride_qh)[:, None] + dims[None, :], mask=mask, other=0.0)
    q_pos = seq_len - q_len + tok
    # keys the tile can see: causal up to its last query, and from its first query's window on
    key_hi = tl.minimum(seq_len, seq_len - q_len + first + BLOCK_Q)
    key_lo = 0
    if USE_WINDOW:
        key_lo = tl.maximum(seq_len - q_len + first - sliding_window + 1, 0)
    out = _attend_keys(
        q.to(DOT_DTYPE), q_pos, k_cache_ptr, v_cache_ptr, block_tables_ptr + seq.to(tl.int64) * stride_table,
        kv_head * stride_ch, stride_cb, stride_cs, key_lo, key_hi, seq_len, head_dim, scale, softcap,
        sliding_window, BLOCK_SIZE, BLOCK_M, BLOCK_D, TILE_N, USE_WINDOW, USE_SOFTCAP, DOT_DTYPE, DOT_PRECISION,
    )  # fmt: skip
    out_offs = (token * stride_ot + head * stride_oh)[:, None] + dims[None, :]
    tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def _query_tile(group: int, max_query_len: int) -> tuple[int, int]:
    """(BLOCK_M rows, BLOCK_Q query tokens) of a program's query tile."""
    block_m = max(16, triton.next_power_of_2(group))  # tl.dot needs >= 16 rows
    if max_query_len * group >= 64:
        block_m = max(block_m, 64)  # prefill chunks: larger tiles
    return block_m, block_m // group


def _dot_dtype(dtype: torch.dtype) -> tl.dtype:
    # NOTE: the interpreter's tl.dot is wrong for bf16 operands; it computes those in fp32
    return tl.float32 if dtype == torch.bfloat16 and is_interpreted() else _TL_DTYPES[dtype]


def _dot_precision(dtype: torch.dtype) -> str:
    # NOTE: on CUDA an fp32 tl.dot defaults to TF32 (10-bit mantissas); an fp32 model asked for fp32, as its
    # PyTorch reference computes it (torch leaves TF32 matmuls off), so fp32 caches get IEEE products
    return "ieee" if dtype == torch.float32 else "tf32"


def paged_attention_triton(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    meta: AttentionMetadata,
    spec: AttentionSpec,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Write this step's K/V into the cache, then attend each query to its visible context."""
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    assert num_tokens == meta.num_tokens and num_heads % num_kv_heads == 0
    assert query.dtype == k_cache.dtype and k_cache.shape[3] == head_dim
    write_kv_triton(key, value, k_cache, v_cache, meta.slot_mapping)
    out = torch.empty_like(query, memory_format=torch.contiguous_format)
    if num_tokens == 0:
        return out
    query = query if query.stride(-1) == 1 else query.contiguous()
    group = num_heads // num_kv_heads
    block_m, block_q = _query_tile(group, max(meta.query_lens))
    grid = (num_tokens // block_q + meta.num_seqs, num_kv_heads)
    _paged_attention_kernel[grid](
        out, query, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens,
        meta.num_seqs, head_dim, spec.scale, spec.softcap or 0.0, spec.sliding_window or 0,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), meta.block_tables.stride(0),
        GROUP=group, BLOCK_SIZE=block_size, BLOCK_Q=block_q, BLOCK_M=block_m,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), TILE_N=TILE_N,
        USE_WINDOW=spec.sliding_window is not None, USE_SOFTCAP=spec.softcap is not None,
        DOT_DTYPE=_dot_dtype(k_cache.dtype), DOT_PRECISION=_dot_precision(k_cache.dtype),
    )  # fmt: skip
    return out
