"""The runner's step inputs: flat tensors from per-request work, filled into buffers reused step after step."""

from __future__ import annotations

from pathlib import Path

import torch

from infer.engine.loader import load_model
from infer.engine.runner import ModelRunner, SeqWork
from tests.helpers.tiny_models import make_tiny_model


def _inputs(runner: ModelRunner, work: list[SeqWork]) -> dict[str, list[int] | list[list[int]]]:
    step, sample_rows = runner.prepare(work)
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
    assert runner.prepare(big)[0].input_ids.dtype == torch.int64
    assert runner.prepare(big)[0].attn.block_tables.dtype == torch.int32
