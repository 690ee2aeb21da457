"""GGUF tokenizer tests: the texts and chat, ours vs transformers' conversion of one file, and tiny GGUF files.

Tiny files hold tokenizer fields and one 4-float tensor (`gguf.GGUFWriter`). `byte_bpe_fields(pre)`: a byte-level
BPE (tokens + merges, `tokenizer.ggml.model = "gpt2"`) trained on a small corpus, with ChatML control tokens and a
user-defined `<think>`. `sentencepiece_fields()`: a SentencePiece-style vocabulary (`"llama"`): special tokens, the
256 byte-fallback tokens, pieces scored by their rank, then Gemma's control and whitespace tokens.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType, GGUFWriter
from tokenizers.implementations import SentencePieceBPETokenizer

from infer.engine.gguf.metadata import read_gguf_metadata
from infer.engine.gguf.tokenizer import tokenizer_from_gguf
from infer.engine.tokenizer import Tokenizer
from tests.helpers.tiny_tokenizer import CORPUS, train_byte_bpe

# multilingual, code, emoji (ZWJ sequences, flags, skin tones), numbers, runs of spaces, special-token strings
TEXTS = [
    "Hello world! The year 1234567 had 3.14159 and 42 apples.",
    "Grüße aus München: Straße, Äpfel, Öl, naïve café déjà vu.",
    "中文测试：你好，世界！日本語のテキスト、東京は日本の首都です。",
    "مرحبا بالعالم. Привет, мир! Как дела?",
    "def f(x):\n    if x > 0:\n\treturn x  # tab\n        return -x\n\n\nprint(f(  -3  ))",
    "🙂🚀 family 👨‍👩‍👧‍👦 flags 🇩🇪🇯🇵 wave 👋🏽",
    "a  b   c    d\n\n\n  e\t\tf   1  22   333",
    "special <|im_end|> inside<|im_start|>user <think> and <bos><start_of_turn> <|endoftext|>",
    " leading space",
    "x  1",
    "   ",
    "",
]
CONVERSATION = [
    {"role": "system", "content": "You are terse. Réponds en français 🙂."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris. 日本語も話せます。"},
    {"role": "user", "content": "And of Japan?\n  def f():\n\treturn 1"},
]
# Gemma 3's chat template (the model card's): Gemma 3 270M's file has none
GEMMA_TEMPLATE = Path(__file__).with_name("gemma3_chat_template.jinja")

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] }}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
BPE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|eot|>", "<think>"]
LLAMA_SPECIALS = [("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL)]
GEMMA_SPECIALS = [("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", CONTROL), ("<mask>", CONTROL)]
GEMMA_TOKENS = [
    ("<start_of_turn>", CONTROL), ("<end_of_turn>", CONTROL),
    *[(text, USER_DEFINED) for text in ("\n", "\n\n", "  ", "   ", "\t\t")],
]  # fmt: skip


# --- ours against transformers


@functools.cache
def load_pair(path: Path, chat_template: str | None = None) -> tuple[Tokenizer, Any]:
    """Ours and transformers' tokenizer of one GGUF file, each loaded once per test session."""
    from transformers import AutoTokenizer

    ours = tokenizer_from_gguf(read_gguf_metadata(path), str(path), chat_template)
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if chat_template is not None:
        hf.chat_template = chat_template
    return ours, hf


def mismatched_ids(ours: Tokenizer, hf: Any) -> list[tuple[str, bool, list[int], list[int]]]:
    """(text, add_special_tokens, ours, transformers') for each of TEXTS the two encode differently."""
    found = []
    for text in TEXTS:
        for add in (True, False):
            mine, theirs = ours.encode(text, add), hf.encode(text, add_special_tokens=add)
            if mine != theirs:
                found.append((text, add, mine, theirs))
    return found


def mismatched_decodes(ours: Tokenizer, hf: Any) -> list[tuple[list[int], bool, str, str]]:
    """(ids, skip_special_tokens, ours, transformers') for each of TEXTS' ids the two decode differently."""
    found = []
    for ids in [ours.encode(text) for text in TEXTS]:
        for skip in (True, False):
            mine, theirs = ours.decode(ids, skip), hf.decode(ids, skip_special_tokens=skip)
            if mine != theirs:
                found.append((ids, skip, mine, theirs))
    return found


def mismatched_chat(ours: Tokenizer, hf: Any) -> list[tuple[str, Any, Any]]:
    """What differs in CONVERSATION rendered with a generation prompt: its text, its ids."""
    text = ours.apply_chat_template(CONVERSATION, add_generation_prompt=True)
    expected = hf.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    ids = list(hf.apply_chat_template(CONVERSATION, tokenize=True, add_generation_prompt=True, return_dict=False))
    found: list[tuple[str, Any, Any]] = []
    if text != expected:
        found.append(("text", text, expected))
    if ours.encode_chat(CONVERSATION) != ids:
        found.append(("ids", ours.encode_chat(CONVERSATION), ids))
    return found


# --- tiny files


def write_gguf(path: Path, arch: str, fields: Mapping[str, Any]) -> Path:
    """A GGUF file of architecture `arch` holding `fields` (ints as INT32, floats as FLOAT32) and one tensor."""
    writer = GGUFWriter(path, arch)
    shape = {"block_count": 1, "context_length": 64, "embedding_length": 4, "feed_forward_length": 8,
             "attention.head_count": 1, "attention.head_count_kv": 1}  # fmt: skip
    for key, value in {**{f"{arch}.{k}": v for k, v in shape.items()}, **fields}.items():
        sub_type = GGUFValueType.get_type(value[0]) if isinstance(value, list) else None
        writer.add_key_value(key, value, GGUFValueType.get_type(value), sub_type)
    writer.add_tensor("output_norm.weight", np.ones(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def byte_bpe_fields(pre: str) -> dict[str, Any]:
    trained = json.loads(train_byte_bpe(420, BPE_SPECIALS).to_str())["model"]
    tokens = [t for t, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in trained["merges"]]
    types = [USER_DEFINED if t == "<think>" else CONTROL if t in BPE_SPECIALS else NORMAL for t in tokens]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
        "tokenizer.ggml.eot_token_id": tokens.index("<|eot|>"),
        "tokenizer.ggml.padding_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML,
    }


def sentencepiece_fields(gemma: bool = False) -> dict[str, Any]:
    """Llama 2's special tokens `<unk> <s> </s>`, or Gemma's `<pad> <eos> <bos> <unk> <mask>`, at the start."""
    trainer = SentencePieceBPETokenizer(add_prefix_space=True)
    trainer.train_from_iterator(CORPUS * 4, vocab_size=300, min_frequency=1, show_progress=False)
    learned = sorted(trainer.get_vocab().items(), key=lambda kv: kv[1])
    specials = GEMMA_SPECIALS if gemma else LLAMA_SPECIALS
    head = [*specials, *[(f"<0x{b:02X}>", BYTE) for b in range(256)]]
    pieces = [(t, NORMAL) for t, _ in learned if t not in dict(head)]
    vocab = [*head, *pieces, *GEMMA_TOKENS]
    tokens = [t for t, _ in vocab]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [float(-i) if kind == NORMAL else 0.0 for i, (_, kind) in enumerate(vocab)],
        "tokenizer.ggml.token_type": [kind for _, kind in vocab],
        "tokenizer.ggml.unknown_token_id": tokens.index("<unk>"),
        "tokenizer.ggml.bos_token_id": tokens.index("<bos>" if gemma else "<s>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<eos>" if gemma else "</s>"),
        "tokenizer.ggml.eot_token_id": tokens.index("<end_of_turn>"),
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
    }
