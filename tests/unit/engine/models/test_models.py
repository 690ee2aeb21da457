"""Our Llama, Qwen3 and Gemma 3 against transformers on the same tiny random checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infer.engine.loader import load_model
from infer.engine.models import CausalLM
from infer.engine.runner import ModelRunner, SeqWork
from tests.helpers.tiny_models import ARCHS, VOCAB, make_tiny_model

BLOCK_SIZE = 4
PROMPT_LEN = 48


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    arch = str(request.param)
    return arch, make_tiny_model(arch, tmp_path_factory.mktemp(arch))


def _reference(model_dir: Path) -> torch.nn.Module:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _prompt(seed: int = 1) -> list[int]:
    return torch.randint(3, VOCAB, (PROMPT_LEN,), generator=torch.Generator().manual_seed(seed)).tolist()


def _scrambled_table(num_blocks: int) -> list[int]:
    # physical blocks in a random, non-contiguous order: the paged path must not care
    return torch.randperm(num_blocks, generator=torch.Generator().manual_seed(7)).tolist()


def _all_logits(model: CausalLM, prompt: list[int], chunk: int) -> torch.Tensor:
    """Logits at every prompt position, prefilled `chunk` tokens per forward pass."""
    runner = ModelRunner(model, num_blocks=64, block_size=BLOCK_SIZE)
    table = _scrambled_table(64)
    rows = []
    with torch.inference_mode():
        for start in range(0, len(prompt), chunk):
            step = runner.prepare([SeqWork(prompt[start : start + chunk], start, table, True)]).step
            rows.append(model.compute_logits(model(step)))
    return torch.cat(rows)


def test_logits_match_transformers(tiny: tuple[str, Path]) -> None:
    arch, model_dir = tiny
    prompt = _prompt()
    with torch.no_grad():
        expected = _reference(model_dir)(torch.tensor([prompt])).logits[0]
    got = _all_logits(load_model(model_dir), prompt, chunk=20)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= 1e-4, arch


def _greedy(model: CausalLM, prompt: list[int], num_new: int) -> list[int]:
    runner = ModelRunner(model, num_blocks=64, block_size=BLOCK_SIZE)
    table = _scrambled_table(64)
    tokens, out = list(prompt), []
    work = SeqWork(tokens, 0, table, True)
    for _ in range(num_new):
        next_id = int(runner.execute([work])[0].argmax())
        out.append(next_id)
        work = SeqWork([next_id], len(tokens), table, True)
        tokens.append(next_id)
    return out


def test_greedy_tokens_match_transformers(tiny: tuple[str, Path]) -> None:
    arch, model_dir = tiny
    prompt = _prompt(seed=2)
    ref = _reference(model_dir)
    with torch.no_grad():
        generated = ref.generate(
            torch.tensor([prompt]), max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0
        )
    expected = generated[0, PROMPT_LEN:].tolist()
    assert _greedy(load_model(model_dir), prompt, 32) == expected, arch


def test_batched_sequences_equal_single_runs(tiny: tuple[str, Path]) -> None:
    """A decode and a prefill chunk of different sequences in one forward pass."""
    _, model_dir = tiny
    model = load_model(model_dir)
    a, b = _prompt(3)[:10], _prompt(4)[:30]
    runner = ModelRunner(model, num_blocks=64, block_size=BLOCK_SIZE)
    alone_a = runner.execute([SeqWork(a, 0, list(range(8)), True)])[0]
    alone_b = runner.execute([SeqWork(b, 0, list(range(8, 16)), True)])[0]
    # a decodes one more token while b is prefilled in two chunks, in one batch each
    runner.execute([SeqWork(b[:12], 0, list(range(16, 24)), False)])
    mixed = runner.execute([SeqWork([5], len(a), list(range(8)), True), SeqWork(b[12:], 12, list(range(16, 24)), True)])
    ref_a = runner.execute([SeqWork([*a, 5], 0, list(range(24, 32)), True)])[0]
    assert torch.allclose(mixed[0], ref_a, atol=1e-4)
    assert torch.allclose(mixed[1], alone_b, atol=1e-4)
    assert not torch.allclose(alone_a, alone_b)
