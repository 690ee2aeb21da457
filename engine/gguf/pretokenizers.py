"""How a byte-level BPE file splits text before its merges, by its `tokenizer.ggml.pre` name.

The names and patterns follow transformers' GGUF conversion, the reference our tests compare with. NOTE: where
llama.cpp splits differently, transformers (and so we) differ from it:
- the GPT-2 group below: llama.cpp first isolates every digit for smollm, starcoder, refact, command-r, codeshell,
  exaone and minerva-7b (so "a  1" keeps "  " whole), and "default" is its own four-pattern split there;
- llama3: llama.cpp (and Llama 3's tokenizer.json) take a piece that is a whole vocabulary entry as one token
  (`ignore_merges`), transformers runs the merges.
A name in neither table is refused: a wrong split loses no error, only quality.
"""

from __future__ import annotations

from tokenizers import Regex, pre_tokenizers

# the GPT-2 pattern that ByteLevel applies itself
GPT2_NAMES = frozenset(
    {"default", "gpt2", "gpt-2", "mpt", "olmo", "jais", "trillion",
     "smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}
)  # fmt: skip

_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen 2: digits one by one
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen 3.5: combining marks stay with their letters
_QWEN35 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
# Mistral's tekken: words split at case changes, digits one by one
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# GPT-4o (o200k), also Llama 4
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTION}|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTION}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SPLIT_PATTERNS = {
    **dict.fromkeys(
        ["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "dbrx",
         "smaug-bpe", "jina-v5-nano"], _LLAMA3),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"], _QWEN2),
    "qwen35": _QWEN35,
    "tekken": _TEKKEN,
    **dict.fromkeys(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], _GPT4O),
}  # fmt: skip

KNOWN_NAMES = sorted(GPT2_NAMES | SPLIT_PATTERNS.keys())


def byte_level_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer | None:
    """The pre-tokenizer of a byte-level BPE whose file names `pre`; None for a name we do not know."""
    if pre in GPT2_NAMES:
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    pattern = SPLIT_PATTERNS.get(pre)
    if pattern is None:
        return None
    split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    return pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
