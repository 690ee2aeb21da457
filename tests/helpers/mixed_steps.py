"""Greedy decoding of two sequences over mixed steps on a scrambled block table: the whole-model check that
every kernel backend is compared with."""

from __future__ import annotations

import torch

from infer.engine.models import CausalLM
from infer.engine.runner import ModelRunner, SeqWork
from tests.helpers.tiny_models import VOCAB

BLOCK_SIZE = 4
TABLES = ([7, 2, 11, 4], [1, 8, 3, 10, 0, 5])  # scrambled physical blocks for sequences A and B


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def greedy_mixed_steps(model: CausalLM) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy tokens of two sequences, and all sampled logits, over four steps, on the kernels in force.

    Step 1 prefills A (8 tokens) and B's first chunk (8 of 14); step 2 decodes A beside B's last chunk
    (6 tokens over 8 cached); steps 3-4 decode both. B's context outgrows Gemma 3's sliding window (12).
    """
    runner = ModelRunner(model, num_blocks=12, block_size=BLOCK_SIZE)
    a, b = prompt(8, seed=1), prompt(14, seed=2)
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
