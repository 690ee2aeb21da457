"""A whole tiny model with INFER_KERNELS=triton (interpreter) gives the torch path's greedy tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from infer.engine.loader import load_model
from infer.engine.models import CausalLM
from infer.engine.runner import ModelRunner, SeqWork
from infer.kernels import set_kernel_backend
from tests.helpers.tiny_models import ARCHS, VOCAB, make_tiny_model

pytest.importorskip("triton")
pytestmark = pytest.mark.triton

from infer.kernels import attention_triton  # noqa: E402
from infer.kernels.attention_triton import paged_attention_triton  # noqa: E402

BLOCK_SIZE = 4
TABLES = ([7, 2, 11, 4], [1, 8, 3, 10, 0, 5])  # scrambled physical blocks for sequences A and B


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _generate(model: CausalLM) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy tokens of two sequences, and all sampled logits, over mixed steps.

    Step 1 prefills A (8 tokens) and B's first chunk (8 of 14); step 2 decodes A
    beside B's last chunk (6 tokens over 8 cached); steps 3-4 decode both. B's
    context outgrows Gemma 3's sliding window (12).
    """
    set_kernel_backend(None)  # read INFER_KERNELS again
    runner = ModelRunner(model, num_blocks=12, block_size=BLOCK_SIZE)
    a, b = _prompt(8, seed=1), _prompt(14, seed=2)
    work = [SeqWork(a, 0, TABLES[0], True), SeqWork(b[:8], 0, TABLES[1], False)]
    out: list[list[int]] = [[], []]
    logits = []
    for _ in range(4):
        step_logits = runner.execute(work)
        logits.append(step_logits)
        sampling = [i for i, w in enumerate(work) if w.needs_logits]
        for row, i in enumerate(sampling):
            out[i].append(int(step_logits[row].argmax()))
        done = [w.start_pos + len(w.token_ids) for w in work]
        b_next = [out[1][-1]] if out[1] else b[8:]
        work = [SeqWork([out[0][-1]], done[0], TABLES[0], True), SeqWork(b_next, done[1], TABLES[1], True)]
    return out, torch.cat(logits)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_match_the_torch_path(
    arch: str, tmp_path: Path, backend: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = load_model(make_tiny_model(arch, tmp_path / arch))
    monkeypatch.setenv("INFER_KERNELS", "torch")
    expected_tokens, expected_logits = _generate(model)
    launches = []

    def counted(*args: Any) -> torch.Tensor:
        launches.append(1)
        out: torch.Tensor = paged_attention_triton(*args)
        return out

    monkeypatch.setattr(attention_triton, "paged_attention_triton", counted)
    monkeypatch.setenv("INFER_KERNELS", "triton")
    tokens, logits = _generate(model)
    assert len(launches) == 4 * model.cfg.num_layers  # the Triton kernel ran, every step, every layer
    assert tokens == expected_tokens and [len(t) for t in tokens] == [4, 3]
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)
