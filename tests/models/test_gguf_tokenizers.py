"""The real GGUF files of `make models` (and the default model's): our tokenizer against transformers' conversion of
the same file, on multilingual, code and emoji text and a four-turn chat. Files not downloaded are skipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.real_models import model_path
from infer.engine.default_model import find_default_gguf
from infer.engine.tokenizer import Tokenizer
from tests.helpers.gguf_tokenizers import (
    GEMMA_TEMPLATE,
    load_pair,
    mismatched_chat,
    mismatched_decodes,
    mismatched_ids,
)

pytestmark = pytest.mark.models

# Gemma 3 270M's file has no chat template: the model card's is passed in
MODELS = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]


def gguf_path(name: str) -> Path:
    return find_default_gguf() if name == "smollm2-135m" else model_path(name)


@pytest.fixture(params=MODELS)
def pair(request: pytest.FixtureRequest) -> tuple[Tokenizer, Any]:
    path = gguf_path(request.param)
    if not path.is_file():
        pytest.skip(f"{path} is missing: run `make models`")
    template = GEMMA_TEMPLATE.read_text(encoding="utf-8") if request.param == "gemma3-270m" else None
    return load_pair(path, template)


def test_ids_match_transformers(pair: tuple[Tokenizer, Any]) -> None:
    assert mismatched_ids(*pair) == []


def test_decode_matches_transformers(pair: tuple[Tokenizer, Any]) -> None:
    assert mismatched_decodes(*pair) == []


def test_chat_matches_transformers(pair: tuple[Tokenizer, Any]) -> None:
    assert mismatched_chat(*pair) == []


def test_vocab_and_special_tokens_match_transformers(pair: tuple[Tokenizer, Any]) -> None:
    ours, hf = pair
    assert ours.vocab_size == len(hf)
    assert (ours.bos_token_id, ours.chat_template) == (hf.bos_token_id, hf.chat_template)
    assert hf.eos_token_id in ours.eos_token_ids
    named = {
        k: str(v) for k, v in hf.special_tokens_map.items() if k in ("bos_token", "eos_token", "unk_token", "pad_token")
    }
    assert ours.special_tokens == named
