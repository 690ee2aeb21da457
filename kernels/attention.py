"""Paged, variable-length attention: the PyTorch reference (the CPU path).

One call serves a flat batch that mixes decode tokens (query length 1) and
prefill chunks (query length > 1) of many sequences. New keys and values are
written through a slot mapping; all keys and values are read back through
block tables, so a sequence's context may live in any physical blocks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class AttentionSpec:
    """A layer's attention settings."""

    scale: float
    sliding_window: int | None = None  # a query sees keys at distance < sliding_window
    softcap: float | None = None  # logits become tanh(logits / softcap) * softcap


@dataclass(frozen=True)
class AttentionMetadata:
    """Where each token of a flat batch writes its K/V and which context it reads.

    Sequence `i` owns tokens `query_start_loc[i]:query_start_loc[i + 1]` of the
    batch; they are the last `query_lens[i]` tokens of its `seq_lens[i]` tokens.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64: physical KV slot of each new token
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32, padded with 0
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32: context length including the new tokens
    query_lens: tuple[int, ...]  # host copy of the per-sequence query lengths
    context_lens: tuple[int, ...]  # host copy of seq_lens

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


def write_kv_ref(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64; a negative slot skips the token
    skip_check: bool = False,  # the caller knows every slot is >= 0
) -> None:
    """Store each token's key and value at its physical slot (block * block_size + offset)."""
    num_blocks, block_size = k_cache.shape[:2]
    flat_k = k_cache.view(num_blocks * block_size, *k_cache.shape[2:])
    flat_v = v_cache.view(num_blocks * block_size, *v_cache.shape[2:])
    slots = slot_mapping.long()
    if not skip_check and bool((slots < 0).any()):
        keep = slots >= 0
        key, value, slots = key[keep], value[keep], slots[keep]
    flat_k.index_copy_(0, slots, key.to(k_cache.dtype))
    flat_v.index_copy_(0, slots, value.to(v_cache.dtype))


def _attend(
    q: torch.Tensor,  # [batch, num_heads, q_len, head_dim]
    k: torch.Tensor,  # [batch, num_kv_heads, kv_len, head_dim]
    v: torch.Tensor,  # [batch, num_kv_heads, kv_len, head_dim]
    mask: torch.Tensor | None,  # [batch, 1, q_len, kv_len] bool (True = attend), None = causal
    spec: AttentionSpec,
) -> torch.Tensor:  # [batch, num_heads, q_len, head_dim]
    scale, softcap = spec.scale, spec.softcap
    group = q.shape[1] // k.shape[1]
    if softcap is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=group > 1
        )
    # NOTE: SDPA cannot cap logits, so the capped path spells the softmax out.
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    if mask is None:
        q_len, kv_len = q.shape[2], k.shape[2]
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).tril(kv_len - q_len)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(dim=-1), v.float()).to(q.dtype)


def _visible(
    q_pos: torch.Tensor,  # [..., q_len, 1]
    k_pos: torch.Tensor,  # [..., 1, kv_len]
    sliding_window: int | None,
) -> torch.Tensor:  # [..., q_len, kv_len] bool
    visible = k_pos <= q_pos
    if sliding_window is not None:
        visible &= k_pos > q_pos - sliding_window
    return visible


def _gather_context(
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [batch, num_blocks_used]
    out: torch.Tensor | None = None,  # [batch * num_blocks_used, block_size, kv_heads, head_dim] workspace
) -> torch.Tensor:  # [batch, num_kv_heads, num_blocks_used * block_size, head_dim]
    batch, num_blocks_used = block_tables.shape
    # NOTE: index_select into a reused workspace: a fresh buffer per layer costs more in page faults than the copy
    ctx = torch.index_select(cache, 0, block_tables.reshape(-1), out=out)
    return ctx.view(batch, num_blocks_used * cache.shape[1], *cache.shape[2:]).transpose(1, 2)


@dataclass(frozen=True)
class DecodeGroup:
    """Decode tokens of sequences with similar context lengths, gathered together."""

    rows: torch.Tensor | slice  # rows of the flat batch: a slice when consecutive (no gather, no scatter)
    tables: torch.Tensor  # [n, num_blocks_used]
    masks: dict[int | None, torch.Tensor]  # per sliding window of the model: [n, 1, 1, kv_len] bool
    workspace: tuple[torch.Tensor, torch.Tensor]  # gathered K and V, reused by every layer of the step


@dataclass(frozen=True)
class AttentionPlan:
    """The reference path's per-step work, shared by every layer: built once per step by `plan_attention_ref`."""

    decode_groups: tuple[DecodeGroup, ...]
    starts: tuple[int, ...]  # host copy of query_start_loc
    all_slots_valid: bool  # no negative slot: the KV write needs no filter

    @property
    def is_decode_only(self) -> bool:
        """All tokens are decodes, in one group, in batch order: attention needs no gather or scatter."""
        groups = self.decode_groups
        return len(groups) == 1 and isinstance(groups[0].rows, slice) and groups[0].rows == slice(0, self.starts[-1])


def _group_by_length(seqs: list[int], lens: tuple[int, ...], max_waste: float = 1.25) -> list[list[int]]:
    """Split sequences so that padding each group to its longest context wastes little."""
    groups: list[list[int]] = []
    total = 0
    for i in sorted(seqs, key=lambda i: -lens[i]):
        if groups and lens[groups[-1][0]] * (len(groups[-1]) + 1) <= max_waste * (total + lens[i]):
            groups[-1].append(i)
            total += lens[i]
        else:
            groups.append([i])
            total = lens[i]
    return groups


def _decode_group(
    meta: AttentionMetadata,
    seqs: list[int],  # sequences in batch order
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], any layer's
    sliding_windows: tuple[int | None, ...],
) -> DecodeGroup:
    device, block_size = cache.device, cache.shape[1]
    starts = meta.query_start_loc.tolist()
    num_blocks_used = -(-max(meta.context_lens[i] for i in seqs) // block_size)
    rows = [starts[i] for i in seqs]
    span = slice(rows[0], rows[0] + len(rows))
    q_pos = torch.tensor([meta.context_lens[i] - 1 for i in seqs], device=device).view(-1, 1, 1, 1)
    k_pos = torch.arange(num_blocks_used * block_size, device=device).view(1, 1, 1, -1)
    workspace_shape = (len(seqs) * num_blocks_used, *cache.shape[1:])
    return DecodeGroup(
        rows=span if rows == list(range(span.start, span.stop)) else torch.tensor(rows, device=device),
        tables=meta.block_tables[torch.tensor(seqs, device=device), :num_blocks_used].long(),
        masks={w: _visible(q_pos, k_pos, w) for w in sliding_windows},
        workspace=(
            torch.empty(workspace_shape, dtype=cache.dtype, device=device),
            torch.empty(workspace_shape, dtype=cache.dtype, device=device),
        ),
    )


def plan_attention_ref(
    meta: AttentionMetadata,
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], any layer's
    sliding_windows: Iterable[int | None] = (None,),  # every window the model's layers use
) -> AttentionPlan:
    """Once per step: decode groups (by context length), their masks and K/V workspaces, shared by all layers."""
    decodes = [i for i, n in enumerate(meta.query_lens) if n == 1]
    windows = tuple(set(sliding_windows))
    # batch order inside a group: often a plain slice of the batch
    groups = [_decode_group(meta, sorted(g), cache, windows) for g in _group_by_length(decodes, meta.context_lens)]
    starts = tuple(meta.query_start_loc.tolist())
    return AttentionPlan(tuple(groups), starts, bool((meta.slot_mapping >= 0).all()))


def _decode(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    group: DecodeGroup,
    spec: AttentionSpec,
) -> torch.Tensor:  # [n, num_heads, head_dim]
    k = _gather_context(k_cache, group.tables, group.workspace[0])
    v = _gather_context(v_cache, group.tables, group.workspace[1])
    mask = group.masks.get(spec.sliding_window)
    if mask is None:
        raise ValueError(f"the attention plan has no mask for sliding window {spec.sliding_window}")
    q = query[group.rows]  # [n, num_heads, head_dim]
    n, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    # A decode query is one position, so the query heads sharing a KV head become that head's query
    # rows: each K/V head is read once, not once per query head as GQA broadcasting does.
    grouped = q.view(n, num_kv_heads, num_heads // num_kv_heads, head_dim)
    # NOTE: reshape, not view: CUDA's SDPA kernels return [n, kv_heads, group, d] in [n, group, kv_heads, d]
    # strides (a copy there; a view of the CPU's contiguous output)
    return _attend(grouped, k, v, mask, spec).reshape(n, num_heads, head_dim)


def _prefill(
    q: torch.Tensor,  # [query_len, num_heads, head_dim]
    k: torch.Tensor,  # [1, num_kv_heads, context_len, head_dim]
    v: torch.Tensor,  # [1, num_kv_heads, context_len, head_dim]
    spec: AttentionSpec,
) -> torch.Tensor:  # [query_len, num_heads, head_dim]
    query_len, context_len = q.shape[0], k.shape[2]
    mask = None
    if spec.sliding_window is not None or context_len != query_len or spec.softcap is not None:
        q_pos = torch.arange(context_len - query_len, context_len, device=q.device).view(-1, 1)
        k_pos = torch.arange(context_len, device=q.device).view(1, -1)
        mask = _visible(q_pos, k_pos, spec.sliding_window).view(1, 1, query_len, context_len)
    out = _attend(q.transpose(0, 1).unsqueeze(0), k, v, mask, spec)
    return out.squeeze(0).transpose(0, 1)


def _chunk_context(
    key: torch.Tensor,  # [query_len, num_kv_heads, head_dim], this step's keys (or values)
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_table: torch.Tensor,  # [max_blocks]
    context_len: int,
) -> torch.Tensor:  # [1, num_kv_heads, context_len, head_dim]
    if context_len == key.shape[0]:
        # prefill from scratch: this step's keys are the whole context
        return key.transpose(0, 1).unsqueeze(0)
    table = block_table[: -(-context_len // cache.shape[1])].unsqueeze(0)
    return _gather_context(cache, table)[:, :, :context_len]


def paged_attention_ref(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    meta: AttentionMetadata,
    spec: AttentionSpec,
    plan: AttentionPlan | None = None,  # the step's plan (`plan_attention_ref`); None = plan this call alone
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Write this step's K/V into the cache, then attend each query to its visible context.

    Decode tokens of all sequences are batched into one call; each prefill chunk
    is one call (a loop over sequences, never over tokens).
    """
    assert query.dim() == 3 and key.shape == value.shape and query.shape[0] == meta.num_tokens
    if plan is None:
        plan = plan_attention_ref(meta, k_cache, (spec.sliding_window,))
    write_kv_ref(key, value, k_cache, v_cache, meta.slot_mapping, skip_check=plan.all_slots_valid)
    if plan.is_decode_only:
        return _decode(query, k_cache, v_cache, plan.decode_groups[0], spec)
    out = torch.empty_like(query)
    for group in plan.decode_groups:
        out[group.rows] = _decode(query, k_cache, v_cache, group, spec)
    starts = plan.starts
    for i, n in enumerate(meta.query_lens):
        if n > 1:
            s, table, ctx = slice(starts[i], starts[i] + n), meta.block_tables[i], meta.context_lens[i]
            k = _chunk_context(key[s], k_cache, table, ctx)
            v = _chunk_context(value[s], v_cache, table, ctx)
            out[s] = _prefill(query[s], k, v, spec)
    return out
