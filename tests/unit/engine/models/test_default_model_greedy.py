"""The default model (SmolLM2-135M-Instruct): our greedy tokens equal transformers' on the same weights."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from infer import LLM, SamplingParams
from tests.helpers.hf_reference import hf_greedy

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
CHAT = [{"role": "user", "content": "Give me three tips for staying focused."}]


@pytest.fixture(scope="module")
def reference(default_model_dir: Path) -> Any:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()


def test_greedy_32_tokens_match_transformers(default_model_dir: Path, reference: Any) -> None:
    llm = LLM(str(default_model_dir), max_model_len=512)
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS] + [llm.tokenizer.encode_chat(CHAT)]
    # min_tokens bans eos as transformers' min_new_tokens does
    params = SamplingParams(max_tokens=32, temperature=0, min_tokens=32)
    ours = [o.token_ids for o in llm.generate(prompts, params)]
    assert ours == [hf_greedy(reference, p, 32) for p in prompts]
    llm.core.block_manager.assert_no_leaks()


def test_cli_generate_prints_the_transformers_continuation(default_model_dir: Path, reference: Any) -> None:
    from infer.engine.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(default_model_dir)
    prompt = "The capital of France is"
    expected = tokenizer.decode(hf_greedy(reference, tokenizer.encode(prompt), 16, ignore_eos=False))
    cmd = [sys.executable, "-m", "infer", "generate", prompt, "--max-tokens", "16", "--temperature", "0"]
    cmd += ["--model", str(default_model_dir)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout == expected + "\n"
