"""The real GGUF files of `make models`, served as users serve them (`quantization` auto: every tensor in the bits
it was shipped with): greedy tokens equal transformers' on the same file (dequantized to fp32) for 64 tokens on 8
prompts, and the instruct models' chats end at their end-of-turn token. Files not downloaded are skipped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.real_models import model_path
from infer.engine import LLM, SamplingParams
from tests.helpers.hf_reference import hf_greedy

pytestmark = [pytest.mark.models, pytest.mark.timeout(3600)]  # transformers at 1.5B in fp32: minutes

MODELS = ["gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
INSTRUCT = {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
NUM_NEW = 64
TEXTS = [
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Once upon a time, in a village at the edge of a great forest,",
    "Die Hauptstadt von Deutschland ist",
    "SELECT name, COUNT(*) FROM orders JOIN customers ON",
    "1, 1, 2, 3, 5, 8, 13,",
]
CHATS = [
    [{"role": "user", "content": "Write a Python function that checks whether a string is a palindrome."}],
    [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "What is 17 * 23?"}],
]


@pytest.fixture(scope="module", params=MODELS)
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, LLM, Any, Any]]:
    import transformers

    name = str(request.param)
    path: Path = model_path(name)
    if not path.is_file():
        pytest.skip(f"{path} is missing: run `make models`")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    llm = LLM(str(path), max_model_len=1024)
    yield name, llm, tokenizer, reference
    llm.core.block_manager.assert_no_leaks()


def _prompts(name: str, tokenizer: Any) -> list[list[int]]:
    prompts = [tokenizer.encode(t) for t in TEXTS]
    if name in INSTRUCT:
        chats = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in CHATS]
        prompts += [tokenizer.encode(c, add_special_tokens=False) for c in chats]
    else:  # a base model without a chat template: two more texts
        prompts += [tokenizer.encode("import numpy as np\n\n"), tokenizer.encode("Q: Why is the sky blue?\nA:")]
    return [list(p) for p in prompts]


def test_greedy_tokens_equal_transformers_on_the_same_file(served: tuple[str, LLM, Any, Any]) -> None:
    name, llm, tokenizer, reference = served
    prompts = _prompts(name, tokenizer)
    params = SamplingParams(max_tokens=NUM_NEW, temperature=0, min_tokens=NUM_NEW)  # eos banned, as min_new_tokens
    ours = [o.token_ids for o in llm.generate(prompts, params)]
    # NOTE: both forbid the same ids until NUM_NEW: every end-of-generation id infer stops on (a GGUF's eot, FIM
    # separators, ...), which are more than transformers' eos for the file
    eos = llm.core.model_info.eos_token_ids
    theirs = [hf_greedy(reference, p, NUM_NEW, eos_token_ids=eos) for p in prompts]
    agree = [
        next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), NUM_NEW)
        for x, y in zip(ours, theirs, strict=True)
    ]
    assert agree == [NUM_NEW] * len(prompts), f"{name}: tokens before the first difference, per prompt: {agree}"


def test_instruct_chats_end_at_the_end_of_turn_token(served: tuple[str, LLM, Any, Any]) -> None:
    name, llm, tokenizer, _ = served
    if name not in INSTRUCT:
        pytest.skip("a base model without a chat template")
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = [llm.tokenizer.encode_chat(c) for c in CHATS]
    for out in llm.generate(prompts, SamplingParams(max_tokens=400, temperature=0)):
        assert out.finish_reason == "stop", out.text
        assert out.token_ids[-1] == end_of_turn
