"""A tiny byte-level BPE trained locally: its small vocabulary splits CJK and emoji across tokens."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

CORPUS = [
    "Hello world, the capital of France is Paris. The quick brown fox jumps over the lazy dog.",
    "日本語のテキスト、中文测试。東京は日本の首都です。",
    "Café, naïve façade, déjà vu, Ærøskøbing, straße.",
    "I like 🙂 and 🚀 and my family 👨‍👩‍👧.",
]


def train_byte_bpe(vocab_size: int, specials: Sequence[str], bos_post_processor: bool = False) -> BackendTokenizer:
    tok = BackendTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(specials), initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    if bos_post_processor:  # Llama 3 style: tokenizer.json itself adds BOS
        bos_id = tok.token_to_id("<s>")
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
        )
    return tok
