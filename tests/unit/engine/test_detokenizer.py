"""IncrementalDetokenizer: the stream adds up to the full decode, never splits a character, honours stops."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers

from infer.engine.detokenizer import IncrementalDetokenizer
from infer.engine.tokenizer import Tokenizer
from tests.helpers.tiny_tokenizer import train_byte_bpe

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MULTIBYTE_TEXT = "🙂🚀 family 👨‍👩‍👧 — 日本語のテキスト、中文测试 · Café naïve déjà vu, Ærøskøbing 😀🧪"
PROMPT = "The capital of France is"


def make_tokenizer(vocab_size: int = 330) -> Tokenizer:
    return Tokenizer(train_byte_bpe(vocab_size, SPECIALS), special_tokens={"eos_token": "<|im_end|>"})


@pytest.fixture(scope="module")
def tiny() -> Tokenizer:
    return make_tokenizer()


@pytest.fixture(params=["tiny", "default"])
def tokenizer(request: pytest.FixtureRequest, tiny: Tokenizer) -> Tokenizer:
    """The tiny tokenizer, and the real default model's (SmolLM2) when its fixture is available."""
    if request.param == "tiny":
        return tiny
    model_dir: Path = request.getfixturevalue("default_model_dir")
    return Tokenizer.from_dir(model_dir)


def chunks(ids: Sequence[int], rng: random.Random | None) -> list[list[int]]:
    """One token at a time, or random chunk sizes (1..4) with `rng`."""
    out: list[list[int]] = []
    i = 0
    while i < len(ids):
        n = rng.randint(1, 4) if rng is not None else 1
        out.append(list(ids[i : i + n]))
        i += n
    return out


def stream(det: IncrementalDetokenizer, pieces: Sequence[Sequence[int]]) -> list[str]:
    return [det.push(p) for p in pieces]


# --- the streaming invariant


def test_multibyte_characters_span_tokens(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(MULTIBYTE_TEXT, add_special_tokens=False)
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)


@pytest.mark.parametrize("seed", [None, 0, 1, 2, 3])
@pytest.mark.parametrize("with_prompt", [True, False])
def test_streamed_text_equals_full_decode(tokenizer: Tokenizer, seed: int | None, with_prompt: bool) -> None:
    ids = tokenizer.encode(MULTIBYTE_TEXT, add_special_tokens=False)
    prompt = tokenizer.encode(PROMPT) if with_prompt else []
    det = IncrementalDetokenizer(tokenizer, prompt)
    rng = random.Random(seed) if seed is not None else None
    outputs = stream(det, chunks(ids, rng))
    assert all("\ufffd" not in text for text in outputs)
    tail = det.flush()
    assert "".join(outputs) + tail == tokenizer.decode(ids) == MULTIBYTE_TEXT
    assert det.text == MULTIBYTE_TEXT
    assert det.stopped_on is None
    assert sum(1 for text in outputs if text) > 10  # really streamed, not all held to the end


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_special_tokens_in_the_stream(tiny: Tokenizer, skip_special_tokens: bool) -> None:
    ids = tiny.encode("<|im_start|>日本語<|im_end|>🙂<|im_end|>", add_special_tokens=False)
    det = IncrementalDetokenizer(tiny, tiny.encode("<|im_start|>"), skip_special_tokens=skip_special_tokens)
    text = "".join(stream(det, chunks(ids, None))) + det.flush()
    assert text == tiny.decode(ids, skip_special_tokens=skip_special_tokens)
    assert ("<|im_end|>" in text) != skip_special_tokens


def test_random_token_sequences(tiny: Tokenizer) -> None:
    rng = random.Random(7)
    for _ in range(50):
        ids = [rng.randrange(tiny.vocab_size) for _ in range(rng.randint(1, 30))]
        det = IncrementalDetokenizer(tiny, [rng.randrange(tiny.vocab_size) for _ in range(3)])
        outputs = stream(det, chunks(ids, rng))
        assert "".join(outputs) + det.flush() == tiny.decode(ids)


def test_incomplete_character_is_held_until_flush(tiny: Tokenizer) -> None:
    ids = tiny.encode("ok 🚀", add_special_tokens=False)
    cut = next(n for n in range(len(ids), 0, -1) if tiny.decode(ids[:n]).endswith("\ufffd"))
    det = IncrementalDetokenizer(tiny)
    pushed = "".join(stream(det, chunks(ids[:cut], None)))
    assert pushed.startswith("ok")
    assert "\ufffd" not in pushed
    # the request ended inside a character: flush shows what decode shows
    tail = det.flush()
    assert tail.endswith("\ufffd")
    assert pushed + tail == det.text == tiny.decode(ids[:cut])
    assert det.push(ids[cut:]) == ""  # finished


def test_decodes_a_small_window_per_token(tiny: Tokenizer) -> None:
    class Recorder:
        def __init__(self) -> None:
            self.window_lens: list[int] = []

        def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
            self.window_lens.append(len(ids))
            text: str = tiny.decode(ids, skip_special_tokens)
            return text

    ids = tiny.encode(MULTIBYTE_TEXT * 20, add_special_tokens=False)
    recorder = Recorder()
    det = IncrementalDetokenizer(recorder, tiny.encode(PROMPT * 10))
    text = "".join(stream(det, chunks(ids, None))) + det.flush()
    assert text == MULTIBYTE_TEXT * 20
    assert max(recorder.window_lens) <= 12
    assert len(recorder.window_lens) <= 2 * len(ids) + 2


def test_prompt_context_keeps_sentencepiece_leading_space() -> None:
    # Metaspace decoding drops the space of the first word of a string: context keeps " world" whole
    backend = BackendTokenizer(models.WordLevel({"▁Hello": 0, "▁world": 1, "<unk>": 2}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    tok = Tokenizer(backend)
    assert tok.decode([0, 1]) == "Hello world"
    det = IncrementalDetokenizer(tok, [0])
    assert det.push([1]) + det.flush() == " world"


# --- stop strings


def piece_ids(tok: Tokenizer, pieces: Sequence[str]) -> list[list[int]]:
    """Token ids of each piece on its own, so token boundaries fall between pieces."""
    return [tok.encode(p, add_special_tokens=False) for p in pieces]


def test_stop_string_split_across_tokens(tiny: Tokenizer) -> None:
    det = IncrementalDetokenizer(tiny, stop=["Paris."])
    outputs = stream(det, piece_ids(tiny, ["The capital is ", "Par", "is", ".", " More"]))
    assert outputs == ["The capital is ", "", "", "", ""]
    assert det.stopped_on == "Paris."
    assert det.text == "The capital is "
    assert det.flush() == ""
    assert det.finished


def test_stop_string_within_a_chunk_cuts_the_text(tiny: Tokenizer) -> None:
    det = IncrementalDetokenizer(tiny, stop=["Paris."])
    assert det.push(tiny.encode("It is Paris. Yes", add_special_tokens=False)) == "It is "
    assert det.stopped_on == "Paris."


def test_stop_string_at_the_first_token(tiny: Tokenizer) -> None:
    det = IncrementalDetokenizer(tiny, tiny.encode(PROMPT), stop=["Hello"])
    assert det.push(tiny.encode("Hello", add_special_tokens=False)) == ""
    assert det.stopped_on == "Hello"
    assert det.text == ""


def test_earlier_stop_string_wins(tiny: Tokenizer) -> None:
    det = IncrementalDetokenizer(tiny, stop=["world", "lo w"])
    assert det.push(tiny.encode("Hello world", add_special_tokens=False)) == "Hel"
    assert det.stopped_on == "lo w"
    det = IncrementalDetokenizer(tiny, stop=["fox", "quick"])
    outputs = stream(det, piece_ids(tiny, ["The qu", "ick brown fox"]))
    assert outputs == ["The ", ""]
    assert det.stopped_on == "quick"


def test_held_back_text_is_released_when_it_diverges(tiny: Tokenizer) -> None:
    det = IncrementalDetokenizer(tiny, stop=["Paris."])
    outputs = stream(det, piece_ids(tiny, ["The ", "Par", "ty", " in Pari", "s"]))
    assert outputs == ["The ", "", "Party", " in ", ""]
    assert det.flush() == "Paris"
    assert det.stopped_on is None
    assert det.text == "The Party in Paris"


def test_multibyte_stop_string(tiny: Tokenizer) -> None:
    det = IncrementalDetokenizer(tiny, stop=["テキスト"])
    ids = tiny.encode("日本語のテキスト、中文", add_special_tokens=False)
    text = "".join(stream(det, chunks(ids, None)))
    assert text == "日本語の"
    assert det.stopped_on == "テキスト"


@pytest.mark.parametrize("seed", [0, 1])
def test_unmatched_stop_strings_keep_the_invariant(tokenizer: Tokenizer, seed: int) -> None:
    ids = tokenizer.encode(MULTIBYTE_TEXT, add_special_tokens=False)
    det = IncrementalDetokenizer(tokenizer, stop=["", "family 👨‍👩‍👧!", "日本語のテキスト。", "ïx"])
    outputs = stream(det, chunks(ids, random.Random(seed)))
    assert all("\ufffd" not in text for text in outputs)
    assert "".join(outputs) + det.flush() == MULTIBYTE_TEXT
