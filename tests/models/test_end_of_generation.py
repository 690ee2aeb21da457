"""Where a turn ends on the real GGUF files of `make models`: every end-of-generation token the file has (as
llama.cpp finds them) stops a request, Gemma 3's <end_of_turn> with the model card's template included (it ran
past its turn before: only <eos> stopped). Files not downloaded are skipped."""

from __future__ import annotations

import pytest

from benchmarks.real_models import model_path
from infer.engine.gguf.config import eos_token_ids
from infer.engine.gguf.metadata import read_gguf_metadata
from infer.engine.llm import LLM
from infer.engine.sampling_params import SamplingParams
from tests.helpers.gguf_tokenizers import GEMMA_TEMPLATE

pytestmark = pytest.mark.models

ENDS = {  # the tokens that must end a generation, by their text
    "gemma3-270m": ("<eos>", "<end_of_turn>"),
    "qwen2.5-coder-0.5b": ("<|im_end|>", "<|endoftext|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"),
    "qwen2.5-coder-1.5b": ("<|im_end|>", "<|endoftext|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"),
}
CHATS = [
    [{"role": "user", "content": "Say hello in French, in one word."}],
    [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "What is 17 * 23?"}],
]


@pytest.mark.parametrize("name", list(ENDS))
def test_the_files_end_of_generation_tokens_all_stop(name: str) -> None:
    path = model_path(name)
    if not path.is_file():
        pytest.skip(f"{path} is missing: run `make models`")
    meta = read_gguf_metadata(path)
    tokens = meta["tokenizer.ggml.tokens"]
    assert {tokens.index(t) for t in ENDS[name]} <= set(eos_token_ids(meta))


@pytest.mark.parametrize("name", list(ENDS))
def test_a_chat_stops_at_its_turn_end(name: str) -> None:
    path = model_path(name)
    if not path.is_file():
        pytest.skip(f"{path} is missing: run `make models`")
    template = str(GEMMA_TEMPLATE) if name == "gemma3-270m" else None  # Gemma's file has none
    llm = LLM(str(path), max_model_len=1024, chat_template=template)
    turn_end = llm.tokenizer.token_to_id("<end_of_turn>" if name == "gemma3-270m" else "<|im_end|>")
    assert turn_end in llm.core.eos_token_ids
    prompts = [llm.tokenizer.encode_chat(c) for c in CHATS]
    for out in llm.generate(prompts, SamplingParams(max_tokens=300, temperature=0)):
        assert turn_end not in out.token_ids[:-1]  # never past the turn's end
        if name != "gemma3-270m":  # NOTE: Gemma 3 270M is a base model: it seldom ends a turn at all
            assert out.finish_reason == "stop", out.text
            assert out.token_ids[-1] == turn_end, out.text
    llm.core.block_manager.assert_no_leaks()
