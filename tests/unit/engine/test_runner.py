"""The runner's step inputs: flat tensors from per-request work, filled into buffers reused step after step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infer.engine.cuda_graphs import EagerGraphs, capture_sizes
from infer.engine.loader import load_model
from infer.engine.runner import ModelRunner, SeqWork
from tests.helpers.compiled import require_compiled_kernels
from tests.helpers.dispatch import Allocations
from tests.helpers.tiny_models import make_tiny_model


def _inputs(runner: ModelRunner, work: list[SeqWork]) -> dict[str, list[int] | list[list[int]]]:
    prepared = runner.prepare(work)
    step, sample_rows = prepared.step, prepared.sample_rows
    meta = step.attn
    return {
        "ids": step.input_ids.tolist(), "positions": step.positions.tolist(), "slots": meta.slot_mapping.tolist(),
        "tables": meta.block_tables.tolist(), "starts": meta.query_start_loc.tolist(),
        "lens": meta.seq_lens.tolist(), "sample_rows": sample_rows.tolist(),
    }  # fmt: skip


def test_each_step_sees_its_own_inputs_in_the_reused_buffers(tmp_path: Path) -> None:
    runner = ModelRunner(load_model(make_tiny_model("llama", tmp_path), kernels="torch"), num_blocks=16, block_size=4)
    big = [SeqWork(list(range(10, 22)), 0, [3, 1, 4], True), SeqWork([7, 8], 5, [2, 6], False)]
    small = [SeqWork([9], 7, [2, 6], True)]
    for _ in range(2):  # the small step after the big one (stale values behind it), then the big one again
        assert _inputs(runner, big) == {
            "ids": [*range(10, 22), 7, 8], "positions": [*range(12), 5, 6],
            "slots": [12, 13, 14, 15, 4, 5, 6, 7, 16, 17, 18, 19, 25, 26], "tables": [[3, 1, 4], [2, 6, 0]],
            "starts": [0, 12, 14], "lens": [12, 7], "sample_rows": [11],
        }  # fmt: skip
        assert _inputs(runner, small) == {
            "ids": [9], "positions": [7], "slots": [27], "tables": [[2, 6]], "starts": [0, 1], "lens": [8],
            "sample_rows": [0],
        }  # fmt: skip
    assert runner.prepare(big).step.input_ids.dtype == torch.int64
    assert runner.prepare(big).step.attn.block_tables.dtype == torch.int32


def _decode(tables: list[list[int]], lens: list[int], ids: list[int]) -> list[SeqWork]:
    return [SeqWork([t], n, table, True) for t, n, table in zip(ids, lens, tables, strict=True)]


def test_a_decode_step_of_a_captured_size_reuses_its_storage_and_makes_no_tensor(tmp_path: Path) -> None:
    """Step after step, every input and the logits sit at the same addresses, and the forward pass makes no
    tensor from host data: what a CUDA graph replays (EagerGraphs runs the same steps). NOTE: the reference
    kernels wait for the host when a slot is negative (a padding row), so the waits are checked on the Triton
    kernels, which graphs capture (tests/unit/kernels/test_model_triton.py)."""
    model = load_model(make_tiny_model("gemma3", tmp_path, vocab_size=64), kernels="torch")  # embed_scale != 1
    runner = ModelRunner(model, num_blocks=16, block_size=4, max_num_seqs=4, max_model_len=32)
    runner.use_graphs(EagerGraphs([1, 2, 4]))
    tables = [[0, 1], [2, 3], [4, 5]]
    addresses = set()
    for step in range(3):
        work = _decode(tables, [4 + step, 2 + step, 5 + step], [7, 8, 9])
        assert runner.graphs is not None and runner.graphs.size_for(work) == 4  # 3 rows padded to 4
        prepared = runner.prepare(work, pad_to=4)
        s, meta = prepared.step, prepared.step.attn
        inputs = (s.input_ids, s.positions, meta.slot_mapping, meta.block_tables, meta.query_start_loc, meta.seq_lens)
        with torch.inference_mode(), Allocations() as counted:
            logits = runner.graphs.run(4, s)
        addresses.add(tuple(t.data_ptr() for t in (*inputs, logits)))
        assert counted.made == [], counted.made
        assert logits.shape == (4, 64) and meta.block_tables.shape == (4, runner.inputs.max_blocks_per_seq)
    assert len(addresses) == 1


def test_padding_rows_change_no_real_rows_logits(tmp_path: Path) -> None:
    """A decode batch of 3 padded to 4 (and to 8): the real rows' logits equal the eager step's, bit for bit,
    and the padding rows write no KV."""
    require_compiled_kernels()  # batch-invariant (the references' matmuls are not: a padded row moves an ulp)
    model = load_model(make_tiny_model("llama", tmp_path, vocab_size=64), kernels="cpu")
    eager = ModelRunner(model, num_blocks=16, block_size=4, max_num_seqs=8, max_model_len=32)
    graphs = ModelRunner(model, num_blocks=16, block_size=4, max_num_seqs=8, max_model_len=32)
    graphs.use_graphs(EagerGraphs([1, 2, 4, 8]))
    prompts = [[3, 4, 5, 6, 7], [9, 10, 11], [12, 13, 14, 15, 16, 17]]
    tables = [[0, 1], [2, 3], [4, 5]]
    for runner in (eager, graphs):
        runner.execute([SeqWork(p, 0, t, True) for p, t in zip(prompts, tables, strict=True)])
    for step, size in ((0, 4), (1, 8)):
        work = _decode(tables, [len(p) + step for p in prompts], [20 + step, 21 + step, 22 + step])
        caches = [c.clone() for pair in graphs.kv_caches for c in pair]
        if size == 8:
            graphs.graphs = EagerGraphs([8])  # the same step padded further
            graphs.graphs.capture(graphs)
        expected, got = eager.execute(work), graphs.execute(work)
        assert torch.equal(got, expected)
        written = [c for pair in graphs.kv_caches for c in pair]
        changed = {(i, int(b)) for i, (a, c) in enumerate(zip(caches, written, strict=True))
                   for b in (a != c).flatten(1).any(1).nonzero().flatten()}  # fmt: skip
        assert {b for _, b in changed} == {w.block_table[w.start_pos // 4] for w in work}  # the real rows' only
    assert graphs.graphs is not None and graphs.graphs.num_replays == 1


def test_steps_that_are_not_plain_decodes_run_eagerly() -> None:
    graphs = EagerGraphs(capture_sizes(16))
    assert capture_sizes(16) == (1, 2, 4, 8, 16) and capture_sizes(40) == (1, 2, 4, 8, 16, 24, 32, 40)
    assert capture_sizes(3) == (1, 2, 3)
    decode = SeqWork([5], 3, [0], True)
    assert graphs.size_for([decode] * 5) == 8
    assert graphs.size_for([decode] * 17) is None  # more rows than the largest graph
    assert graphs.size_for([decode, SeqWork([5, 6], 3, [0], True)]) is None  # a prefill chunk
    assert graphs.size_for([decode, SeqWork([5], 3, [0], False)]) is None  # a row that does not sample
    assert graphs.size_for([decode, SeqWork([5, 6], 3, [0], True, num_logits=2)]) is None  # drafts


def test_inputs_sized_at_start_grow_unless_graphs_hold_them(tmp_path: Path) -> None:
    model = load_model(make_tiny_model("llama", tmp_path, vocab_size=64), kernels="torch")
    runner = ModelRunner(model, num_blocks=16, block_size=4, max_num_seqs=2, max_num_batched_tokens=4)
    before = runner.inputs.buffer.data_ptr()
    runner.execute([SeqWork(list(range(1, 11)), 0, [0, 1, 2], True)])  # 10 tokens > 4: grown
    assert runner.inputs.max_tokens >= 10 and runner.inputs.buffer.data_ptr() != before
    runner.use_graphs(EagerGraphs([1, 2]))
    with pytest.raises(RuntimeError, match="does not fit the inputs sized at start"):
        runner.execute([SeqWork(list(range(1, 41)), 0, list(range(10)), True)])
