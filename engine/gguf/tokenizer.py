"""A GGUF file's tokenizer, rebuilt with `tokenizers` from the file's metadata (no transformers at run time).

The result matches transformers' own conversion (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`) id for id:
- `tokenizer.ggml.model == "gpt2"`: byte-level BPE from the tokens and merges, split by `tokenizer.ggml.pre`
  (engine/gguf/pretokenizers.py); a token outside the byte alphabet is respelled as its UTF-8 bytes.
- `"llama"` (SentencePiece): BPE with byte fallback, its merges rebuilt from the scores when the file has none.
  How it splits is the file's architecture's (`Architecture.gguf_sentencepiece`): Gemma files split no words and
  add no prefix space, and their merge order is the token order; phi3 files prepend "▁" in a normalizer; others
  use Metaspace, with a prefix space unless `add_space_prefix` is false.
- Control tokens (type 3) are special added tokens, user-defined ones (type 4) plain added tokens: never split.
- BOS/EOS are added per `add_bos_token` / `add_eos_token` (BOS by default for SentencePiece, like llama.cpp).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby, repeat
from operator import itemgetter, neg
from typing import Any

import numpy as np
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer

from infer.engine.gguf.config import eos_token_ids
from infer.engine.gguf.merge_cache import cached_merges
from infer.engine.gguf.pretokenizers import KNOWN_NAMES, byte_level_pre_tokenizer
from infer.engine.models.registry import gguf_architecture
from infer.engine.tokenizer import Tokenizer, TokenizerLoadError

KEY = "tokenizer.ggml."
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types
# template variable -> the key of its token id
SPECIAL_TOKEN_KEYS = {
    "bos_token": "bos_token_id", "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id", "pad_token": "padding_token_id",
}  # fmt: skip
EOS_KEYS = ("eos_token_id", "eot_token_id", "eom_token_id")


@dataclass(frozen=True)
class GGUFVocab:
    """The tokenizer fields of one file, checked: `token_types` and `scores` as long as `tokens`, ids in range."""

    source: str
    model: str  # tokenizer.ggml.model
    tokens: list[str]
    token_types: list[int]
    scores: list[float] | None
    merges: list[str] | None
    token_ids: dict[str, int]  # "bos_token_id" -> 1, for the keys the file has

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], source: str) -> GGUFVocab:
        model = _require(meta, "model", str, source)
        tokens = _require(meta, "tokens", list, source)
        if not tokens or not set(map(type, tokens)) <= {str}:
            raise _error(source, "tokens", "must be a non-empty list of strings")
        types = _optional_list(meta, "token_type", len(tokens), source) or [1] * len(tokens)
        scores = _optional_list(meta, "scores", len(tokens), source)
        merges = meta.get(KEY + "merges")
        if merges is not None and not isinstance(merges, list):
            raise _error(source, "merges", "must be a list of strings")
        keys = dict.fromkeys([*SPECIAL_TOKEN_KEYS.values(), *EOS_KEYS])
        token_ids = {key: _token_id(meta, key, len(tokens), source) for key in keys if meta.get(KEY + key) is not None}
        return cls(source, model, tokens, types, scores, merges, token_ids)

    def is_added(self, token_id: int) -> bool:
        """Control and user-defined tokens: matched in the text as they are spelled, never split."""
        return self.token_types[token_id] in (CONTROL, USER_DEFINED)


def tokenizer_from_gguf(meta: Mapping[str, Any], source: str, chat_template: str | None = None) -> Tokenizer:
    """The tokenizer a GGUF file describes. `meta`: its key/value fields (`read_gguf_metadata`); `source`: its
    path, for errors; `chat_template` overrides the file's `tokenizer.chat_template`."""
    vocab = GGUFVocab.from_meta(meta, source)
    backend = _backend(vocab, meta)
    _add_file_tokens(backend, vocab)
    named_ids = {name: vocab.token_ids[key] for name, key in SPECIAL_TOKEN_KEYS.items() if key in vocab.token_ids}
    special = {name: vocab.tokens[i] for name, i in named_ids.items()}
    eos_ids = eos_token_ids(meta)  # eos, eot, eom, FIM separators and known turn ends (gguf/config.py)
    template = chat_template if chat_template is not None else meta.get("tokenizer.chat_template")
    origin = f"the chat template of {source}" if chat_template is None else "the chat template given"
    hint = f"{source} has none (tokenizer.chat_template): give one with --chat-template FILE"
    tokenizer = Tokenizer(backend, special_tokens=special, eos_token_ids=eos_ids, chat_template=template,
                          template_origin=origin, missing_template_hint=hint)  # fmt: skip
    # after Tokenizer has registered the named tokens: a token the vocabulary lacks has its id only then
    add_bos = bool(meta.get(KEY + "add_bos_token", vocab.model == "llama"))
    add_eos = bool(meta.get(KEY + "add_eos_token", False))
    backend.post_processor = _post_processor(backend, special, add_bos, add_eos)
    return tokenizer


def _backend(vocab: GGUFVocab, meta: Mapping[str, Any]) -> BackendTokenizer:
    """The model, normalizer, pre-tokenizer and decoder; added tokens and the post-processor come after."""
    if vocab.model == "gpt2":
        return _byte_level_bpe(vocab, str(meta.get(KEY + "pre", "default")))
    if vocab.model != "llama":
        raise _error(vocab.source, "model", f"{vocab.model!r} is not supported (gpt2 and llama are)")
    unk_id = vocab.token_ids.get("unknown_token_id")
    unk = vocab.tokens[unk_id] if unk_id is not None else "<unk>"
    family = gguf_architecture(meta.get("general.architecture"))
    style = family.gguf_sentencepiece if family is not None else "metaspace"
    if style == "whole":
        return _gemma_bpe(vocab, unk)
    prefix_space = bool(meta.get(KEY + "add_space_prefix", True))
    return _sentencepiece_bpe(vocab, unk, prefix_space, style == "prepend")


# --- byte-level BPE (gpt2)


def _byte_level_bpe(vocab: GGUFVocab, pre: str) -> BackendTokenizer:
    if vocab.merges is None:
        raise _error(vocab.source, "merges", "is missing (a gpt2 tokenizer needs its merges)")
    pre_tokenizer = byte_level_pre_tokenizer(pre)
    if pre_tokenizer is None:
        raise _error(vocab.source, "pre", f"{pre!r} is not a known pre-tokenizer (known: {', '.join(KNOWN_NAMES)})")
    spelling = _byte_spelling()
    outside = re.compile("[^" + "".join(map(re.escape, spelling)) + "]")  # a character not in the byte alphabet
    # NOTE: a control or user-defined token keeps its spelling, e.g. DeepSeek's "<｜begin▁of▁sentence｜>": it is
    # matched as written. transformers respells it and then adds it again, as a new id past the model's vocabulary.
    # A later duplicate spelling wins, as in transformers' dict.
    if outside.search("".join(vocab.tokens)) is None:  # the common case: every token spelled in the alphabet
        ids = _ids(vocab.tokens)
    else:
        ids = {
            t if outside.search(t) is None or vocab.is_added(i) else "".join(spelling[b] for b in t.encode()): i
            for i, t in enumerate(vocab.tokens)
        }
    bpe = _bpe(vocab, ids, _split_merges(vocab), continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    backend = BackendTokenizer(bpe)
    backend.pre_tokenizer = pre_tokenizer
    backend.decoder = decoders.ByteLevel()
    return backend


def _byte_spelling() -> list[str]:
    """GPT-2's printable stand-in for each byte: printable Latin-1 bytes stand for themselves, the rest 256+."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(others)) for b in range(256)]


# --- SentencePiece (llama) as BPE with byte fallback


def _sentencepiece_bpe(vocab: GGUFVocab, unk: str, prefix_space: bool, is_phi3: bool) -> BackendTokenizer:
    ids = _ids(vocab.tokens)
    if vocab.merges is not None:
        merges = _split_merges(vocab)
    elif vocab.scores is not None:
        merges = cached_merges(ids, dict(zip(vocab.tokens, vocab.scores, strict=True)), _rebuild_merges)
    else:
        raise _error(vocab.source, "scores", "is missing (a llama tokenizer without merges needs its scores)")
    backend = BackendTokenizer(_bpe(vocab, ids, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if is_phi3:  # the prefix comes from a normalizer, always: " hi" -> "▁▁hi"
        backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    else:
        scheme = "first" if prefix_space else "never"
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    if prefix_space or is_phi3:
        steps.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(steps)
    return backend


def _gemma_bpe(vocab: GGUFVocab, unk: str) -> BackendTokenizer:
    """No word split, no prefix space. NOTE: Gemma writes its runs of spaces as real spaces ("  " for "▁▁"), and
    its merge order is its token order, not its scores'."""
    tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in vocab.tokens]
    ids = _ids(tokens)
    positions = dict(zip(ids, map(neg, ids.values()), strict=True))  # an earlier token merges first
    merges = _split_merges(vocab) if vocab.merges is not None else cached_merges(ids, positions, _rebuild_merges)
    backend = BackendTokenizer(_bpe(vocab, ids, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return backend


def _rebuild_merges(ids: Mapping[str, int], scores: Mapping[str, float]) -> list[tuple[str, str]]:
    """Every split of a token into two tokens, best score first; ties: longer left part, then longer right part,
    then the order of `scores`. Equal to transformers' `generate_merges` pair for pair (the BPE applies merges in
    this order). NOTE: its sort of each token's splits by their ids never decides anything: two splits with equal
    keys come from two tokens.

    NOTE: the tokens are sorted, not their splits (Gemma: 262,144 tokens, 514,906 merges): a token's splits,
    longer left part first, are already in order; only tokens of equal score interleave theirs (`_tied_splits`).
    Its merges are cached on disk (merge_cache.py): a change to what it returns bumps that cache's version."""
    ordered = sorted(scores.items(), key=itemgetter(1), reverse=True)  # stable: ties keep the order of `scores`
    if len(set(scores.values())) == len(ordered):  # every score once (Gemma's token order)
        return [(left, right) for t, _ in ordered for k in range(len(t) - 1, 0, -1)
                if (left := t[:k]) in ids and (right := t[k:]) in ids]  # fmt: skip
    merges: list[tuple[str, str]] = []
    for _, group in groupby(ordered, key=itemgetter(1)):
        merges += _tied_splits(ids, [t for t, _ in group])
    return merges


def _tied_splits(ids: Mapping[str, int], tokens: list[str]) -> list[tuple[str, str]]:
    """The splits of tokens of one score: longer left part first, then longer right part, then token order."""
    splits = [(t[:k], t[k:]) for t in tokens for k in range(1, len(t)) if t[:k] in ids and t[k:] in ids]
    splits.sort(key=lambda m: (len(m[0]), len(m[1])), reverse=True)  # stable
    return splits


# --- shared


def _ids(tokens: Sequence[str]) -> dict[str, int]:
    """Token -> id, a later duplicate spelling winning (NOTE: as `{t: i for i, t in enumerate(tokens)}`, twice as
    fast: 262,144 tokens)."""
    return dict(zip(tokens, range(len(tokens)), strict=True))


def _split_merges(vocab: GGUFVocab) -> list[tuple[str, str]]:
    merges = vocab.merges or []
    try:  # NOTE: one comprehension (Qwen: 151,387 merges); a malformed entry is then looked for to name it
        return [(left, right) for left, right in map(str.split, merges, repeat(" "))]
    except (TypeError, ValueError):
        index, merge = next((i, m) for i, m in enumerate(merges) if not isinstance(m, str) or m.count(" ") != 1)
        raise _error(vocab.source, "merges", f"entry {index} is {merge!r}, not two tokens and a space") from None


def _bpe(vocab: GGUFVocab, ids: dict[str, int], merges: list[tuple[str, str]], **options: Any) -> models.BPE:
    try:
        return models.BPE(vocab=ids, merges=merges, dropout=None, **options)
    except Exception as e:  # tokenizers raises a bare Exception, e.g. a merge of unknown tokens
        raise _error(vocab.source, "merges", f"do not fit the tokens: {e}") from None


def _add_file_tokens(backend: BackendTokenizer, vocab: GGUFVocab) -> None:
    """Control tokens as special added tokens, user-defined ones as plain added tokens (both keep their ids)."""
    kinds = np.asarray(vocab.token_types)  # NOTE: numpy picks the few among 262,144 in a millisecond
    control = [vocab.tokens[i] for i in np.flatnonzero(kinds == CONTROL)]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    # a user-defined token the vocabulary spells differently (Gemma's spaces: "  " is "▁▁") is left out
    user = [t for i in np.flatnonzero(kinds == USER_DEFINED) if backend.token_to_id(t := vocab.tokens[i]) is not None]
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])


def _post_processor(
    backend: BackendTokenizer, special: Mapping[str, str], add_bos: bool, add_eos: bool
) -> processors.TemplateProcessing:
    """`[BOS] $A [EOS]` as the file asks (a flag for a token the file does not name is dropped)."""
    bos, eos = special.get("bos_token") if add_bos else None, special.get("eos_token") if add_eos else None
    single = " ".join([*([f"{bos}:0"] if bos else []), "$A:0", *([f"{eos}:0"] if eos else [])])
    pair = " ".join([single, *([f"{bos}:1"] if bos else []), "$B:1", *([f"{eos}:1"] if eos else [])])
    tokens = [(t, backend.token_to_id(t)) for t in (bos, eos) if t]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=tokens)


def _token_id(meta: Mapping[str, Any], key: str, num_tokens: int, source: str) -> int:
    token_id = meta[KEY + key]
    if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < num_tokens:
        raise _error(source, key, f"{token_id!r} is out of range (the vocabulary has {num_tokens})")
    return token_id


def _require(meta: Mapping[str, Any], key: str, kind: type, source: str) -> Any:
    value = meta.get(KEY + key)
    if value is None:
        raise _error(source, key, "is missing")
    if not isinstance(value, kind):
        raise _error(source, key, f"must be a {kind.__name__}, not {type(value).__name__}")
    return value


def _optional_list(meta: Mapping[str, Any], key: str, size: int, source: str) -> list[Any] | None:
    value = meta.get(KEY + key)
    if value is not None and (not isinstance(value, Sequence) or len(value) != size):
        raise _error(source, key, f"must hold one entry per token ({size})")
    return list(value) if value is not None else None


def _error(source: str, key: str, problem: str) -> TokenizerLoadError:
    return TokenizerLoadError(f"{source}: {KEY}{key} {problem}")
