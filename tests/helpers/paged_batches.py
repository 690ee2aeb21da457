"""Random flat batches for the paged-attention tests: queries, new K/V, a filled cache, metadata."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from infer.kernels import AttentionMetadata


@dataclass(frozen=True)
class Shape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int = 16
    dtype: torch.dtype = torch.float32


@dataclass
class Batch:
    query: torch.Tensor  # [num_tokens, num_heads, head_dim], a strided view (as the model passes it)
    key: torch.Tensor  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor
    meta: AttentionMetadata

    def args(self) -> tuple[torch.Tensor, ...]:
        """(query, key, value, k_cache, v_cache): the caches cloned, so each implementation gets its own."""
        return self.query, self.key, self.value, self.k_cache.clone(), self.v_cache.clone()


def metadata(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    tables: list[list[int]],
    block_size: int,
    device: torch.device | str = "cpu",
) -> AttentionMetadata:
    """Metadata for sequences whose last `query_lens[i]` of `seq_lens[i]` tokens are new."""
    slots = [
        table[p // block_size] * block_size + p % block_size
        for n, total, table in zip(query_lens, seq_lens, tables, strict=True)
        for p in range(total - n, total)
    ]
    max_blocks = max(len(t) for t in tables)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=torch.tensor([t + [0] * (max_blocks - len(t)) for t in tables], dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_lens=tuple(query_lens),
        context_lens=tuple(seq_lens),
    )


def random_tables(seq_lens: Sequence[int], block_size: int, num_blocks: int, gen: torch.Generator) -> list[list[int]]:
    """Each sequence gets distinct, randomly placed (non-contiguous) physical blocks."""
    needed = [-(-n // block_size) for n in seq_lens]
    assert sum(needed) <= num_blocks, "cache too small for the batch"
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, used = [], 0
    for n in needed:
        tables.append(perm[used : used + n])
        used += n
    return tables


def make_batch(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    shape: Shape,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> Batch:
    """A mixed batch over a cache full of random values (the context, and garbage in other blocks).

    The values are drawn on the CPU (the same numbers on every device), then moved to `device`.
    """
    gen = torch.Generator().manual_seed(seed)
    num_tokens, bs = sum(query_lens), shape.block_size
    num_blocks = sum(-(-n // bs) for n in seq_lens) + 3  # a few blocks nobody owns
    meta = metadata(query_lens, seq_lens, random_tables(seq_lens, bs, num_blocks, gen), bs, device)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen).to(device=device, dtype=shape.dtype)

    q_size, kv_size = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    qkv = randn(num_tokens, q_size + 2 * kv_size)
    q, k, v = qkv[:, :q_size], qkv[:, q_size : q_size + kv_size], qkv[:, q_size + kv_size :]
    cache_shape = (num_blocks, bs, shape.num_kv_heads, shape.head_dim)
    return Batch(
        query=q.view(num_tokens, shape.num_heads, shape.head_dim),
        key=k.view(num_tokens, shape.num_kv_heads, shape.head_dim),
        value=v.view(num_tokens, shape.num_kv_heads, shape.head_dim),
        k_cache=randn(*cache_shape),
        v_cache=randn(*cache_shape),
        meta=meta,
    )
