"""The model runner: one forward pass over every scheduled token of every request, and its sampling.

It turns plain per-request work (new tokens, where they start, the block table) into flat tensors, runs the
model once, and samples on the model's device (`step`): the core gets token ids, never logits. Its inputs
live in one buffer at fixed places (`StepInputs`): one host-to-device copy a step, and a decode step of a
captured size replays a CUDA graph (`cuda_graphs.py`) over the same storage. It owns the KV cache tensors;
it never changes scheduler state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from infer.engine.cuda_graphs import DecodeGraphs
from infer.engine.models import CausalLM, StepInput
from infer.engine.sampler import Sampler, SamplerOutput, SamplingBatch, SamplingTensors
from infer.engine.step_inputs import StepInputs
from infer.kernels import AttentionMetadata


@dataclass(frozen=True)
class SeqWork:
    """One request's share of a step."""

    token_ids: Sequence[int]  # the tokens computed this step
    start_pos: int  # tokens already in the KV cache (num_computed_tokens)
    block_table: Sequence[int]  # physical blocks, covering start_pos + len(token_ids)
    needs_logits: bool  # True when this step ends at the request's newest token
    num_logits: int = 1  # with needs_logits: logits at this many last positions (1 + speculative drafts)

    @property
    def is_decode(self) -> bool:
        """One new token that samples once: a step of only these can replay a CUDA graph."""
        return len(self.token_ids) == 1 and self.needs_logits and self.num_logits == 1


def kv_cache_bytes_per_block(model: CausalLM, block_size: int, dtype: torch.dtype) -> int:
    cfg = model.cfg
    element_bytes = torch.tensor([], dtype=dtype).element_size()
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * element_bytes


@dataclass(frozen=True)
class Prepared:
    """A step's inputs on the device (views of `StepInputs`: valid until the next `prepare`)."""

    step: StepInput
    sample_rows: torch.Tensor  # [num_sampling] int64: the rows of the flat batch whose logits are taken
    sampling: SamplingTensors | None  # the sampled rows' parameters, when a batch was given


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        num_blocks: int,
        block_size: int,
        *,
        seed: int = 0,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 256,
        max_model_len: int = 256,
    ) -> None:
        """`max_*`: the inputs' sizes at start (a larger step grows them, unless CUDA graphs hold them)."""
        self.model, self.block_size, self.num_blocks = model, block_size, num_blocks
        self.kernels = model.kernels
        self.sliding_windows = frozenset(model.sliding_windows)
        cfg, weight = model.cfg, model.norm.weight  # NOTE: not the embedding, which may be kept packed
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.device, self.dtype = weight.device, weight.dtype
        self.kv_caches = [
            (torch.zeros(shape, dtype=self.dtype, device=self.device),
             torch.zeros(shape, dtype=self.dtype, device=self.device))
            for _ in range(cfg.num_layers)
        ]  # fmt: skip
        max_tokens = max(max_num_batched_tokens, max_num_seqs)
        self.inputs = StepInputs(self.device, max_tokens, max_num_seqs, -(-max_model_len // block_size))
        self.sampler = Sampler(seed, self.device)
        self.graphs: DecodeGraphs | None = None  # `use_graphs`

    def use_graphs(self, graphs: DecodeGraphs) -> None:
        """Replay decode steps of the graphs' sizes from them (captured here, over this runner's inputs)."""
        self.inputs.reserve(graphs.max_size, graphs.max_size, self.inputs.max_blocks_per_seq)
        self.inputs.freeze()
        graphs.capture(self)
        self.graphs = graphs

    def prepare(self, work: Sequence[SeqWork], batch: SamplingBatch | None = None, pad_to: int = 0) -> Prepared:
        """Flat inputs for the step in the reused buffers, and the sampled rows' parameters when `batch` is
        given. `pad_to`: a decode step padded with rows that write nothing, to this many rows (a graph's size),
        with block tables of the full width."""
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
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        # each request's last num_logits positions (1, or its newest token and its speculative drafts)
        sample_rows = [end - j for w, end in zip(work, starts[1:], strict=True) if w.needs_logits
                       for j in range(w.num_logits, 0, -1)]  # fmt: skip
        if pad_to > len(work):  # rows that write no KV (slot -1) and attend to one slot of block 0
            extra = pad_to - len(work)
            ids += [0] * extra
            positions += [0] * extra
            slots += [-1] * extra
            starts += range(starts[-1] + 1, starts[-1] + 1 + extra)
            query_lens += (1,) * extra
            context_lens += (1,) * extra
        n, num_seqs = len(ids), len(query_lens)
        inputs = self.inputs
        width = inputs.max_blocks_per_seq if pad_to else max(len(w.block_table) for w in work)
        inputs.reserve(n, num_seqs, width)
        inputs.host("input_ids")[:n] = ids
        inputs.host("positions")[:n] = positions
        inputs.host("slot_mapping")[:n] = slots
        inputs.host("sample_rows")[: len(sample_rows)] = sample_rows
        inputs.host("query_start_loc")[: num_seqs + 1] = starts
        inputs.host("seq_lens")[:num_seqs] = context_lens
        tables = inputs.host("block_tables")[: num_seqs * width].reshape(num_seqs, width)
        tables[:] = 0  # padded with 0 (a valid block: masked out by the sequence's length)
        for i, w in enumerate(work):
            tables[i, : len(w.block_table)] = w.block_table
        sampling = self.sampler.write_inputs(batch, inputs) if batch is not None else None
        inputs.send()
        plain = AttentionMetadata(
            slot_mapping=inputs.view("slot_mapping")[:n],
            block_tables=inputs.view("block_tables")[: num_seqs * width].view(num_seqs, width),
            query_start_loc=inputs.view("query_start_loc")[: num_seqs + 1],
            seq_lens=inputs.view("seq_lens")[:num_seqs],
            query_lens=query_lens,
            context_lens=context_lens,
        )
        # the backend's per-step work, once for all layers (the reference attention's plan)
        attn = self.kernels.prepare_attention(plain, self.kv_caches[0][0], self.sliding_windows)
        positions_t = inputs.view("positions")[:n]
        step = StepInput(
            input_ids=inputs.view("input_ids")[:n],
            positions=positions_t,
            attn=attn,
            rope=self.model.rope_angles(positions_t),
            kv_caches=self.kv_caches,
        )
        return Prepared(step, inputs.view("sample_rows")[: len(sample_rows)], sampling)

    @property
    def vocab_size(self) -> int:
        return self.model.cfg.vocab_size

    def padding_step(self, size: int) -> StepInput:
        """A decode step of `size` rows that write no KV (what graphs capture, over the same inputs)."""
        return self.prepare([], pad_to=size).step

    def decode_logits(self, step: StepInput) -> torch.Tensor:  # [num_tokens, vocab] fp32
        """A decode step's forward pass: every row samples. What a CUDA graph captures."""
        return self.model.compute_logits(self.model(step))

    def _forward(self, work: Sequence[SeqWork], batch: SamplingBatch | None) -> tuple[torch.Tensor, Prepared]:
        if self.graphs is not None and (size := self.graphs.size_for(work)) is not None:
            prepared = self.prepare(work, batch, pad_to=size)
            return self.graphs.run(size, prepared.step)[: len(work)], prepared
        prepared = self.prepare(work, batch)
        hidden = self.model(prepared.step)  # [num_tokens, hidden]
        return self.model.compute_logits(hidden[prepared.sample_rows]), prepared

    @torch.inference_mode()
    def execute(self, work: Sequence[SeqWork]) -> torch.Tensor:  # [num_sampling, vocab] fp32
        """Run one forward pass; logits for the requests whose `needs_logits` is set, in order (`num_logits`
        rows each)."""
        return self._forward(work, None)[0]

    @torch.inference_mode()
    def step(self, work: Sequence[SeqWork], batch: SamplingBatch) -> SamplerOutput:
        """Run one forward pass and sample its logits on the device: `batch` has one row per logits row."""
        logits, prepared = self._forward(work, batch)
        return self.sampler(logits, batch, prepared.sampling)
