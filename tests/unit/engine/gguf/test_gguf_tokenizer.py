"""GGUF tokenizers: ids, decoding and chats equal transformers' own conversion of the same file; a bad field is
an error naming the file and the field."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from infer.engine.default_model import find_default_gguf
from infer.engine.gguf.config import eos_token_ids
from infer.engine.gguf.metadata import read_gguf_metadata
from infer.engine.gguf.tokenizer import _rebuild_merges, tokenizer_from_gguf
from infer.engine.tokenizer import Tokenizer, TokenizerLoadError
from tests.helpers.gguf_tokenizers import (
    CONVERSATION,
    GEMMA_TEMPLATE,
    TEXTS,
    byte_bpe_fields,
    load_pair,
    mismatched_chat,
    mismatched_decodes,
    mismatched_ids,
    sentencepiece_fields,
    write_gguf,
)

# name -> (architecture, fields, chat template passed in)
TINY_FILES: dict[str, tuple[str, dict[str, Any], str | None]] = {
    "bpe-qwen2": ("qwen2", byte_bpe_fields("qwen2"), None),
    "bpe-llama-bpe": ("llama", byte_bpe_fields("llama-bpe"), None),
    "bpe-smollm": ("llama", byte_bpe_fields("smollm"), None),
    "spm-llama": ("llama", sentencepiece_fields(), None),
    "spm-gemma3": ("gemma3", sentencepiece_fields(gemma=True), GEMMA_TEMPLATE.read_text(encoding="utf-8")),
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gguf_tokenizers")
    for name, (arch, fields, _) in TINY_FILES.items():
        write_gguf(folder / f"{name}.gguf", arch, fields)
    return folder


@pytest.fixture(params=list(TINY_FILES))
def pair(request: pytest.FixtureRequest, tiny_dir: Path) -> tuple[Tokenizer, Any]:
    return load_pair(tiny_dir / f"{request.param}.gguf", TINY_FILES[request.param][2])


# --- against transformers


def test_ids_match_transformers(pair: tuple[Tokenizer, Any]) -> None:
    assert mismatched_ids(*pair) == []


def test_decode_matches_transformers(pair: tuple[Tokenizer, Any]) -> None:
    assert mismatched_decodes(*pair) == []


def test_vocab_and_special_ids_match_transformers(pair: tuple[Tokenizer, Any]) -> None:
    ours, hf = pair
    assert ours.vocab_size == len(hf)
    assert ours.bos_token_id == hf.bos_token_id
    assert hf.eos_token_id in ours.eos_token_ids
    ids = ours.encode("Hello 日本 🙂", add_special_tokens=False)
    assert ours.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)


@pytest.mark.parametrize("name", ["bpe-qwen2", "spm-gemma3"])
def test_chat_matches_transformers(tiny_dir: Path, name: str) -> None:
    """The file's own ChatML template, and Gemma's passed in (Gemma 3 files may have none)."""
    assert mismatched_chat(*load_pair(tiny_dir / f"{name}.gguf", TINY_FILES[name][2])) == []


def test_default_model_gguf_matches_its_converted_directory(default_model_dir: Path) -> None:
    """SmolLM2's GGUF (gpt2 BPE, pre 'smollm') against the tokenizer.json transformers made of the same file."""
    path = find_default_gguf()
    ours = tokenizer_from_gguf(read_gguf_metadata(path), str(path))
    converted = Tokenizer.from_dir(default_model_dir)
    for text in TEXTS:
        assert ours.encode(text) == converted.encode(text), text
        ids = ours.encode(text)
        assert ours.decode(ids, skip_special_tokens=False) == converted.decode(ids, skip_special_tokens=False)
    assert ours.apply_chat_template(CONVERSATION) == converted.apply_chat_template(CONVERSATION)
    assert ours.special_tokens == converted.special_tokens
    assert (ours.bos_token_id, ours.vocab_size) == (converted.bos_token_id, converted.vocab_size)
    # the file's ends of generation, as llama.cpp reads them: its eos <|im_end|>, and <|endoftext|> and the FIM
    # <reponame> by their text (the converted directory keeps transformers' eos alone)
    assert converted.eos_token_ids == {2} and ours.eos_token_ids == {0, 2, 4}


# --- behaviour


def test_control_tokens_stay_whole_and_user_defined_ones_are_kept_in_decode() -> None:
    meta = {"general.architecture": "qwen2", **byte_bpe_fields("qwen2")}
    tok = tokenizer_from_gguf(meta, "tiny.gguf")
    tokens = meta["tokenizer.ggml.tokens"]
    ids = tok.encode("a<|im_end|>b<think>c", add_special_tokens=False)
    assert tokens.index("<|im_end|>") in ids
    assert tokens.index("<think>") in ids
    assert tok.decode(ids) == "ab<think>c"  # special tokens dropped, user-defined ones kept


def test_byte_level_control_tokens_outside_the_byte_alphabet_keep_their_ids() -> None:
    """DeepSeek's "<｜begin▁of▁sentence｜>" is written as is, not in byte-level letters: it is matched as written and
    keeps its id (transformers adds it again, with an id past the model's vocabulary)."""
    meta = {"general.architecture": "qwen2", **byte_bpe_fields("deepseek-r1-qwen")}
    tokens = meta["tokenizer.ggml.tokens"]
    tokens += ["<｜begin▁of▁sentence｜>", "<｜tool▁calls▁begin｜>"]
    meta["tokenizer.ggml.token_type"] += [3, 4]
    meta["tokenizer.ggml.bos_token_id"] = len(tokens) - 2
    meta["tokenizer.ggml.add_bos_token"] = True
    tok = tokenizer_from_gguf(meta, "tiny.gguf")
    assert tok.vocab_size == len(tokens)
    assert tok.bos_token_id == len(tokens) - 2
    ids = tok.encode("hi<｜tool▁calls▁begin｜>")
    assert (ids[0], ids[-1]) == (len(tokens) - 2, len(tokens) - 1)
    assert tok.decode(ids, skip_special_tokens=False) == "<｜begin▁of▁sentence｜>hi<｜tool▁calls▁begin｜>"


@pytest.mark.parametrize(("add_bos", "add_eos"), [(None, None), (False, False), (True, True)])
def test_bos_and_eos_follow_the_file_flags(add_bos: bool | None, add_eos: bool | None) -> None:
    meta: dict[str, Any] = {"general.architecture": "llama", **sentencepiece_fields()}
    for key, flag in (("add_bos_token", add_bos), ("add_eos_token", add_eos)):
        meta.pop(f"tokenizer.ggml.{key}")
        if flag is not None:
            meta[f"tokenizer.ggml.{key}"] = flag
    ids = tokenizer_from_gguf(meta, "tiny.gguf").encode("hello")
    assert (ids[0] == 1) == (add_bos is not False)  # SentencePiece files add BOS unless they say no
    assert (ids[-1] == 2) == bool(add_eos)


def test_eos_ids_are_eos_eot_eom_and_the_known_turn_ends() -> None:
    meta = {"general.architecture": "qwen2", **byte_bpe_fields("qwen2")}
    meta["tokenizer.ggml.eom_token_id"] = 5
    tok = tokenizer_from_gguf(meta, "tiny.gguf")
    tokens = meta["tokenizer.ggml.tokens"]
    # <|endoftext|> by its text, as llama.cpp (it was left out: only eos, eot and eom stopped)
    assert tok.eos_token_ids == {tokens.index("<|im_end|>"), tokens.index("<|eot|>"), 5, tokens.index("<|endoftext|>")}


def test_end_of_generation_ids_follow_llama_cpp() -> None:
    """The ids the file names (FIM separators too) and the tokens spelled as a turn's, a text's or a file's end;
    gpt-oss's <|end|> only ends a message when <|return|> and <|call|> are there."""
    tokens = ["a", "<end_of_turn>", "<|im_end|>", "<|endoftext|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
              "<|end|>", "b", "<|fim_middle|>"]  # fmt: skip
    meta = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.eos_token_id": 8, "tokenizer.ggml.fim_sep_token_id": 0}
    assert eos_token_ids(meta) == [8, 0, 1, 2, 3, 4, 5, 6, 7]  # the eos id first; FIM's middle is no end
    harmony = {"tokenizer.ggml.tokens": ["<|end|>", "<|return|>", "<|call|>", "x"], "tokenizer.ggml.eos_token_id": 1}
    assert eos_token_ids(harmony) == [1, 2]
    assert eos_token_ids({"tokenizer.ggml.tokens": ["<end_of_turn>"]}) == [0]  # no eos key: the text alone


def test_chat_template_argument_overrides_the_files() -> None:
    meta = {"general.architecture": "qwen2", **byte_bpe_fields("qwen2")}
    assert tokenizer_from_gguf(meta, "tiny.gguf", "{{ 'MINE' }}").apply_chat_template(CONVERSATION) == "MINE"
    assert tokenizer_from_gguf(meta, "tiny.gguf").apply_chat_template(CONVERSATION).startswith("<|im_start|>")


def test_add_space_prefix_false_adds_no_space() -> None:
    """llama.cpp's flag (transformers ignores it): no "▁" before the first word, and decode keeps the text."""
    meta: dict[str, Any] = {"general.architecture": "llama", **sentencepiece_fields()}
    with_prefix = tokenizer_from_gguf(meta, "tiny.gguf")
    meta["tokenizer.ggml.add_space_prefix"] = False
    without = tokenizer_from_gguf(meta, "tiny.gguf")
    first = [
        t.convert_ids_to_tokens(t.encode("the world", add_special_tokens=False))[0] for t in (with_prefix, without)
    ]
    assert first[0] is not None and first[0].startswith("▁")
    assert first[1] is not None and not first[1].startswith("▁")
    for text in ("the world", " two  spaces"):
        assert without.decode(without.encode(text)) == text


# --- errors name the file and the field


def error_for(meta: dict[str, Any]) -> str:
    with pytest.raises(TokenizerLoadError) as err:
        tokenizer_from_gguf(meta, "/models/tiny.gguf")
    assert "/models/tiny.gguf" in str(err.value)
    return str(err.value)


def test_missing_merges_of_a_gpt2_tokenizer() -> None:
    meta = byte_bpe_fields("qwen2")
    del meta["tokenizer.ggml.merges"]
    assert "tokenizer.ggml.merges is missing" in error_for(meta)


@pytest.mark.parametrize("model", ["t5", "bert", None])
def test_unknown_or_missing_tokenizer_model(model: str | None) -> None:
    meta = {**byte_bpe_fields("qwen2"), "tokenizer.ggml.model": model}
    assert "tokenizer.ggml.model" in error_for(meta)


def test_unknown_pre_tokenizer() -> None:
    assert "tokenizer.ggml.pre 'chameleon' is not a known pre-tokenizer" in error_for(byte_bpe_fields("chameleon"))


@pytest.mark.parametrize("key", ["bos_token_id", "eos_token_id", "eot_token_id", "padding_token_id"])
def test_token_id_out_of_range(key: str) -> None:
    meta = byte_bpe_fields("qwen2")
    meta[f"tokenizer.ggml.{key}"] = len(meta["tokenizer.ggml.tokens"])
    assert f"tokenizer.ggml.{key} 420 is out of range" in error_for(meta)


@pytest.mark.parametrize(
    ("key", "value"),
    [("token_type", [1, 1]), ("scores", [0.0]), ("tokens", []), ("merges", ["a b c"]), ("merges", ["Ġx Ġy"])],
)
def test_malformed_fields(key: str, value: Any) -> None:
    meta = {**byte_bpe_fields("qwen2"), f"tokenizer.ggml.{key}": value}
    assert f"tokenizer.ggml.{key}" in error_for(meta)


# --- merges rebuilt from the scores (SentencePiece files without merges: Gemma)


def _random_vocab(rng: random.Random, tied: bool) -> tuple[dict[str, int], dict[str, float]]:
    alphabet = "ab▁c"[: rng.randint(1, 4)]
    spellings = ("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 80)))
    tokens = list(dict.fromkeys(spellings))
    ids = {t: i for i, t in enumerate(tokens)}
    scores = {t: float(rng.randint(-3, 3)) if tied else rng.random() for t in rng.sample(tokens, len(tokens))}
    return ids, scores


@pytest.mark.parametrize("tied", [True, False])
def test_merges_rebuilt_from_scores_match_transformers_pair_for_pair(tied: bool) -> None:
    """The BPE applies merges in their order: ours, sorting tokens rather than splits, equal transformers'
    `generate_merges`, with tied scores (llama files) and with every score once (Gemma's token order)."""
    from transformers.convert_slow_tokenizer import generate_merges

    rng = random.Random(26)
    for _ in range(300):
        ids, scores = _random_vocab(rng, tied)
        assert _rebuild_merges(ids, scores) == generate_merges(ids, scores)
