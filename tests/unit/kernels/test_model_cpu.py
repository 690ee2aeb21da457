"""Whole tiny models with INFER_KERNELS=cpu give the reference path's greedy tokens and logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from infer.engine.loader import load_model
from infer.engine.models import CausalLM
from infer.engine.runner import ModelRunner, SeqWork
from infer.kernels import cpu, set_kernel_backend
from tests.helpers.compiled import require_compiled_kernels
from tests.helpers.tiny_models import ARCHS, VOCAB, make_tiny_model

BLOCK_SIZE = 4
TABLES = ([7, 2, 11, 4], [1, 8, 3, 10, 0, 5])  # scrambled physical blocks for sequences A and B


def _generate(model: CausalLM, backend: str) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy tokens of A (8-token prompt) and B (14, in chunks of 8 and 6) over four mixed steps."""
    set_kernel_backend(backend)
    runner = ModelRunner(model, num_blocks=12, block_size=BLOCK_SIZE)
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randint(3, VOCAB, (8,), generator=gen).tolist(), torch.randint(3, VOCAB, (14,), generator=gen).tolist()
    work = [SeqWork(a, 0, TABLES[0], True), SeqWork(b[:8], 0, TABLES[1], False)]
    out: list[list[int]] = [[], []]
    logits = []
    for _ in range(4):
        step_logits = runner.execute(work)
        logits.append(step_logits)
        for row, i in enumerate(i for i, w in enumerate(work) if w.needs_logits):
            out[i].append(int(step_logits[row].argmax()))
        done = [w.start_pos + len(w.token_ids) for w in work]
        b_next = [out[1][-1]] if out[1] else b[8:]
        work = [SeqWork([out[0][-1]], done[0], TABLES[0], True), SeqWork(b_next, done[1], TABLES[1], True)]
    return out, torch.cat(logits)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_match_the_reference_path(
    arch: str, tmp_path: Path, backend: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_compiled_kernels()
    model = load_model(make_tiny_model(arch, tmp_path / arch))
    expected_tokens, expected_logits = _generate(model, "torch")
    calls = []
    compiled = cpu.paged_attention

    def counted(*args: Any) -> torch.Tensor:
        calls.append(1)
        return compiled(*args)

    monkeypatch.setattr(cpu, "paged_attention", counted)
    tokens, logits = _generate(model, "cpu")
    assert len(calls) == 4 * model.cfg.num_layers  # the compiled kernel ran, every step, every layer
    assert tokens == expected_tokens and [len(t) for t in tokens] == [4, 3]
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)
