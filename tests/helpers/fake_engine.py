"""An EngineCore over a fake runner and a tiny tokenizer: the step loop's logic in milliseconds, no weights.

The fake model "knows" one text: at position p it predicts the text's token p (logits peak there and fall
off with the id distance, so there is a runner-up for logprobs and randomness for sampling), and eos past
the text's end. So a prompt that is the text's first k tokens continues with the text.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from infer.engine.config import EngineConfig
from infer.engine.core import EngineCore
from infer.engine.interface import ModelInfo
from infer.engine.runner import SeqWork
from infer.engine.sampler import Sampler, SamplerOutput, SamplingBatch
from infer.engine.tokenizer import Tokenizer
from tests.helpers.tiny_tokenizer import train_byte_bpe

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT = "Hello world, the capital of France is Paris. The quick brown fox jumps over the lazy dog."


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer() -> Tokenizer:
    return Tokenizer(train_byte_bpe(330, SPECIALS), special_tokens={"eos_token": "<|im_end|>"}, chat_template=CHATML)


class FakeRunner:
    """Stands in for ModelRunner: records every call; `poison` tokens make a forward pass fail, and so does every
    pass after the first `num_good_calls` (a kernel that fails only on a later call)."""

    def __init__(self, text_ids: list[int], eos_id: int, vocab_size: int, num_blocks: int, seed: int = 0) -> None:
        self.text_ids, self.eos_id, self.vocab_size = text_ids, eos_id, vocab_size
        self.sampler = Sampler(seed, torch.device("cpu"))
        self.num_blocks = num_blocks
        self.device = torch.device("cpu")
        self.calls: list[list[SeqWork]] = []
        self.poison: set[int] = set()
        self.num_good_calls: int | None = None
        self.step_s = 0.0  # simulated forward-pass time per call, plus per token (see `execute`)
        self.token_s = 0.0
        self.gate = threading.Event()  # cleared: a forward pass waits (a stalled engine)
        self.gate.set()
        self.logit_offset = 0.0  # added to every logit (the peak's logit is this; > 0 like a real model's)

    def token_at(self, position: int) -> int:
        return self.text_ids[position] if position < len(self.text_ids) else self.eos_id

    def step(self, work: Sequence[SeqWork], batch: SamplingBatch) -> SamplerOutput:
        """The fake model's logits (`execute`), sampled as the real runner samples them."""
        return self.sampler(self.execute(work), batch)

    def execute(self, work: Sequence[SeqWork]) -> torch.Tensor:  # [num_sampling, vocab] fp32
        self.calls.append(list(work))
        if any(t in self.poison for w in work for t in w.token_ids):
            raise RuntimeError("poisoned batch")
        if self.num_good_calls is not None and len(self.calls) > self.num_good_calls:
            raise RuntimeError(f"forward pass {len(self.calls)} failed")
        self.gate.wait()
        time.sleep(self.step_s + self.token_s * sum(len(w.token_ids) for w in work))
        ids = torch.arange(self.vocab_size, dtype=torch.float32)
        ends = [w.start_pos + len(w.token_ids) for w in work if w.needs_logits for _ in range(w.num_logits)]
        offsets = [j for w in work if w.needs_logits for j in range(w.num_logits - 1, -1, -1)]
        peaks = [self.token_at(end - off) for end, off in zip(ends, offsets, strict=True)]
        rows = [self.logit_offset - (ids - peak).abs() * 0.5 for peak in peaks]
        return torch.stack(rows) if rows else torch.empty(0, self.vocab_size)


def fake_core(**settings: Any) -> tuple[EngineCore, FakeRunner]:
    """A core whose fake model continues TEXT; settings override the EngineConfig defaults."""
    tokenizer = tiny_tokenizer()
    eos_id = tokenizer.token_to_id("<|im_end|>")
    assert eos_id is not None
    config = EngineConfig(**{"max_model_len": 256, "num_blocks": 64, "block_size": 16, **settings})
    runner = FakeRunner(tokenizer.encode(TEXT), eos_id, tokenizer.vocab_size, config.num_blocks or 64, config.seed)
    info = ModelInfo("fake", "", tokenizer.vocab_size, (eos_id,), tokenizer.chat_template is not None)
    return EngineCore(config, runner, tokenizer, info), runner
