"""The model runner: one forward pass over every scheduled token of every request.

It turns plain per-request work (new tokens, where they start, the block
table) into flat tensors, runs the model once, and returns logits only at the
positions that sample. It owns the KV cache tensors; it never changes
scheduler state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from infer.engine.models import CausalLM, StepInput
from infer.kernels import AttentionMetadata


@dataclass(frozen=True)
class SeqWork:
    """One request's share of a step."""

    token_ids: Sequence[int]  # the tokens computed this step
    start_pos: int  # tokens already in the KV cache (num_computed_tokens)
    block_table: Sequence[int]  # physical blocks, covering start_pos + len(token_ids)
    needs_logits: bool  # True when this step ends at the request's newest token
    num_logits: int = 1  # with needs_logits: logits at this many last positions (1 + speculative drafts)


def kv_cache_bytes_per_block(model: CausalLM, block_size: int, dtype: torch.dtype) -> int:
    cfg = model.cfg
    element_bytes = torch.tensor([], dtype=dtype).element_size()
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * element_bytes


class ModelRunner:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int) -> None:
        self.model, self.block_size, self.num_blocks = model, block_size, num_blocks
        self.kernels = model.kernels
        self.sliding_windows = frozenset(model.sliding_windows)
        cfg, weight = model.cfg, model.embed_tokens
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.device, self.dtype = weight.device, weight.dtype
        self.kv_caches = [
            (torch.zeros(shape, dtype=self.dtype, device=self.device),
             torch.zeros(shape, dtype=self.dtype, device=self.device))
            for _ in range(cfg.num_layers)
        ]  # fmt: skip

    def prepare(self, work: Sequence[SeqWork]) -> tuple[StepInput, torch.Tensor]:
        """Flat inputs for the step, and the row of each token that samples."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        bs = self.block_size
        for w in work:
            ids.extend(w.token_ids)
            span = range(w.start_pos, w.start_pos + len(w.token_ids))
            positions.extend(span)
            slots.extend(w.block_table[p // bs] * bs + p % bs for p in span)
        query_lens = tuple(len(w.token_ids) for w in work)
        context_lens = tuple(w.start_pos + len(w.token_ids) for w in work)
        max_blocks = max(len(w.block_table) for w in work)
        tables = [list(w.block_table) + [0] * (max_blocks - len(w.block_table)) for w in work]
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        dev = self.device
        plain = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(context_lens, dtype=torch.int32, device=dev),
            query_lens=query_lens,
            context_lens=context_lens,
        )
        # the backend's per-step work, once for all layers (the reference attention's plan)
        attn = self.kernels.prepare_attention(plain, self.kv_caches[0][0], self.sliding_windows)
        positions_t = torch.tensor(positions, dtype=torch.int64, device=dev)
        step = StepInput(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=dev),
            positions=positions_t,
            attn=attn,
            rope=self.model.rope_angles(positions_t),
            kv_caches=self.kv_caches,
        )
        # each request's last num_logits positions (1, or its newest token and its speculative drafts)
        sample_rows = [end - j for w, end in zip(work, starts[1:], strict=True) if w.needs_logits
                       for j in range(w.num_logits, 0, -1)]  # fmt: skip
        return step, torch.tensor(sample_rows, dtype=torch.int64, device=dev)

    @torch.inference_mode()
    def execute(self, work: Sequence[SeqWork]) -> torch.Tensor:  # [num_sampling, vocab] fp32
        """Run one forward pass; logits for the requests whose `needs_logits` is set, in order (`num_logits`
        rows each)."""
        step, sample_rows = self.prepare(work)
        hidden = self.model(step)  # [num_tokens, hidden]
        return self.model.compute_logits(hidden[sample_rows])
