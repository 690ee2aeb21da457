"""A GGUF file whose metadata does not fit its tensors or its vocabulary is refused before a layer is built, in
one line naming the key: a block count of a million fails in milliseconds, not minutes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from gguf import GGUFValueType

from infer.engine.config import EngineConfig
from infer.engine.loader import ModelLoadError, gguf_config, load_engine, open_source
from tests.helpers.gguf_layout import patched, rewritten, slot
from tests.helpers.tiny_gguf import VOCAB, write_tiny_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("check") / "tiny.gguf", "llama", tied=False)


def _lie(tiny: Path, tmp_path: Path, label: str, value: float) -> Path:
    out = tmp_path / "lie.gguf"
    out.write_bytes(patched(tiny.read_bytes(), slot(tiny, label), value))
    return out


def _refused(path: Path, match: str) -> None:
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match=match) as err:
        load_engine(EngineConfig(model=str(path)))  # as `infer generate` and `infer serve` load it
    assert time.perf_counter() - start < 1.0  # refused before a layer is built
    assert str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("block_count", [1_000_000, 4_000_000_000])
def test_a_block_count_past_the_bounds_fails_fast_naming_the_key(tiny: Path, tmp_path: Path, block_count: int) -> None:
    _refused(_lie(tiny, tmp_path, "llama.block_count", block_count), f"llama.block_count: {block_count}")


def test_a_block_count_past_the_files_layers_is_refused(tiny: Path, tmp_path: Path) -> None:
    _refused(_lie(tiny, tmp_path, "llama.block_count", 3), "llama.block_count: 3 layers, but .* no tensor of layer 2")


def test_a_block_count_short_of_the_files_layers_is_refused(tiny: Path, tmp_path: Path) -> None:
    _refused(
        _lie(tiny, tmp_path, "llama.block_count", 1), "llama.block_count: 1 layers, but the file has tensor 'blk.1"
    )


@pytest.mark.parametrize(
    ("label", "value"),
    [
        ("llama.embedding_length", 1 << 16),
        ("llama.feed_forward_length", 1 << 19),
        ("llama.attention.head_count", 64),
    ],
)
def test_sizes_that_do_not_fit_the_tensors_name_the_key(tiny: Path, tmp_path: Path, label: str, value: int) -> None:
    _refused(_lie(tiny, tmp_path, label, value), f"{label}: .*tensor 'blk.0|{label}: .*tensor 'token_embd")


def test_a_head_size_that_does_not_fit_the_tensors_is_named(tiny: Path, tmp_path: Path) -> None:
    _refused(_lie(tiny, tmp_path, "llama.attention.key_length", 2048), "implies .* heads of head_dim 2048")


def test_query_heads_not_a_multiple_of_kv_heads_are_refused(tiny: Path, tmp_path: Path) -> None:
    _refused(_lie(tiny, tmp_path, "llama.attention.head_count_kv", 3), "llama.attention.head_count_kv: 4 query heads")


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
def test_a_rope_base_that_is_not_finite_and_positive_is_refused(tiny: Path, tmp_path: Path, value: float) -> None:
    _refused(_lie(tiny, tmp_path, "llama.rope.freq_base", value), "llama.rope.freq_base")


def test_a_context_length_of_the_wrong_kind_is_refused(tiny: Path, tmp_path: Path) -> None:
    path = rewritten(tiny, tmp_path / "k.gguf", {"llama.context_length": (float("inf"), GGUFValueType.FLOAT32, None)})
    _refused(path, "llama.context_length: inf is not a whole number")


def test_a_block_count_that_is_text_is_refused(tiny: Path, tmp_path: Path) -> None:
    path = rewritten(tiny, tmp_path / "k.gguf", {"llama.block_count": ("2", GGUFValueType.STRING, None)})
    _refused(path, "llama.block_count: '2' is not a whole number")


def _vocabulary(tiny: Path, tmp_path: Path, num_tokens: int, eos: int) -> Path:
    meta = open_source(tiny).meta
    tokens = [*meta["tokenizer.ggml.tokens"][: num_tokens - 1], "<|end|>"]
    tokens += [f"<extra_{i}>" for i in range(num_tokens - len(tokens))]
    fields = {
        "tokenizer.ggml.tokens": (tokens, GGUFValueType.ARRAY, GGUFValueType.STRING),
        "tokenizer.ggml.token_type": ([1] * (num_tokens - 1) + [3], GGUFValueType.ARRAY, GGUFValueType.INT32),
        "tokenizer.ggml.eos_token_id": (eos, GGUFValueType.UINT32, None),
        "tokenizer.ggml.bos_token_id": (eos, GGUFValueType.UINT32, None),
    }
    return rewritten(tiny, tmp_path / f"vocab{num_tokens}.gguf", fields)


def test_a_vocabulary_larger_than_the_embedding_is_refused(tiny: Path, tmp_path: Path) -> None:
    _refused(
        _vocabulary(tiny, tmp_path, VOCAB + 44, VOCAB - 1),
        f"tokenizer.ggml.tokens: {VOCAB + 44} tokens, .* {VOCAB} rows",
    )


def test_a_vocabulary_smaller_than_the_embedding_is_fine(tiny: Path, tmp_path: Path) -> None:
    cfg = gguf_config(open_source(_vocabulary(tiny, tmp_path, VOCAB - 6, VOCAB - 7)))  # a padded embedding
    assert cfg.vocab_size == VOCAB


@pytest.mark.parametrize("key", ["eos", "bos"])
def test_a_special_id_past_the_vocabulary_is_refused(tiny: Path, tmp_path: Path, key: str) -> None:
    _refused(_lie(tiny, tmp_path, f"tokenizer.ggml.{key}_token_id", VOCAB), f"tokenizer.ggml.{key}_token_id: {VOCAB}")


@pytest.mark.parametrize("key", ["padding", "fim_pre", "unknown"])
def test_every_special_id_of_the_file_is_checked(tiny: Path, tmp_path: Path, key: str) -> None:
    fields = {f"tokenizer.ggml.{key}_token_id": (VOCAB + 7, GGUFValueType.UINT32, None)}
    path = rewritten(tiny, tmp_path / "special.gguf", fields)
    _refused(path, f"tokenizer.ggml.{key}_token_id: {VOCAB + 7} is not one of the {VOCAB} token ids")


def test_an_output_head_of_other_rows_is_refused(tiny: Path, tmp_path: Path) -> None:
    _refused(_lie(tiny, tmp_path, "output.weight dim 1", VOCAB // 2), "token_embd.weight: tensor 'output.weight'")


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("check") / "gemma.gguf", "gemma3", num_layers=1)


@pytest.mark.parametrize("block_count", [4096 + 1, 4_294_967_295])
def test_gemmas_block_count_is_bounded_before_its_layer_pattern_is_built(
    tiny_gemma: Path, tmp_path: Path, block_count: int
) -> None:
    # NOTE: a list of a flag per layer was built first: 4e9 ran past the fuzzer's 60 s
    _refused(_lie(tiny_gemma, tmp_path, "gemma3.block_count", block_count), f"gemma3.block_count: {block_count} is not")


def test_gemmas_window_pattern_of_zero_is_named(tiny_gemma: Path, tmp_path: Path) -> None:
    fields = {"gemma3.attention.sliding_window_pattern": (0, GGUFValueType.UINT32, None)}
    path = rewritten(tiny_gemma, tmp_path / "pattern.gguf", fields)
    _refused(path, "gemma3.attention.sliding_window_pattern: 0 is not a whole number")


@pytest.mark.parametrize("key", ["general.architecture", "llama.rope.scaling.type"])
def test_a_name_that_is_a_long_list_is_refused_in_a_short_line(tiny: Path, tmp_path: Path, key: str) -> None:
    fields = {key: (list(range(100_000)), GGUFValueType.ARRAY, GGUFValueType.INT32)}
    path = rewritten(tiny, tmp_path / "names.gguf", fields)
    with pytest.raises(ModelLoadError, match=f"{key}: a list of 100000 values is not a name") as err:
        load_engine(EngineConfig(model=str(path)))
    assert len(str(err.value)) < 300  # NOTE: was the list's repr, 600 KB in one line
