"""Constrained decoding: what a request may ask for (`Constraint`), and `GrammarCompiler`, which compiles it.

xgrammar turns a constraint into a token-level automaton once per (kind, text), on the compiler's own
threads (never the step thread); each request then walks it with its own matcher
(`structured_state.GrammarState`), and the sampler masks the tokens the automaton forbids.
xgrammar is imported on first use: it takes ~2 s (it pulls in transformers).
"""

from __future__ import annotations

import enum
import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infer.engine.structured_schema import check_schema, json_schema_grammar
from infer.engine.validation import InvalidInput, check

if TYPE_CHECKING:
    import xgrammar as xgr

    from infer.engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

MAX_CONSTRAINT_CHARS = 65536  # a schema, regex or grammar; choices together
MAX_CHOICES = 1024
MAX_CACHED_GRAMMARS = 256
MAX_CACHED_GRAMMAR_BYTES = 256 << 20
NUM_COMPILE_THREADS = 2  # NOTE: two, so one slow grammar does not hold up every other request's compile
JSON_OBJECT_SCHEMA = '{"type": "object"}'


class ConstraintKind(enum.StrEnum):
    JSON_SCHEMA = "json_schema"  # a JSON schema (JSON text)
    JSON_OBJECT = "json_object"  # any JSON object
    REGEX = "regex"
    GRAMMAR = "grammar"  # EBNF (GBNF-style: `root ::= ...`)
    CHOICE = "choice"  # exactly one of some strings


@dataclass(frozen=True)
class Constraint:
    """The output must match this. ValueError names the kind (`json_schema: ...`) when it is malformed;
    whether it compiles is the compiler's to say."""

    kind: ConstraintKind
    text: str = ""  # the schema, regex or grammar; for a choice, a JSON list of the strings; "" for json_object

    def __post_init__(self) -> None:
        try:
            kind = ConstraintKind(self.kind)
        except ValueError:
            kinds = ", ".join(k.value for k in ConstraintKind)
            raise InvalidInput("constraint", f"{str(self.kind)[:40]!r} is not one of {kinds}") from None
        object.__setattr__(self, "kind", kind)
        check(kind, len(self.text) <= MAX_CONSTRAINT_CHARS, f"at most {MAX_CONSTRAINT_CHARS} characters")
        if kind is ConstraintKind.JSON_OBJECT:
            check(kind, self.text == "", "takes no text")
        elif kind is ConstraintKind.JSON_SCHEMA:
            schema = _json(kind, self.text)
            check(kind, isinstance(schema, dict), "must be a JSON object")
            check_schema(schema, kind)  # what xgrammar would not enforce
        elif kind is ConstraintKind.CHOICE:
            choices = _json(kind, self.text)
            check(kind, isinstance(choices, list) and 0 < len(choices) <= MAX_CHOICES, f"1 to {MAX_CHOICES} strings")
            check(kind, all(isinstance(c, str) and c for c in choices), "must be non-empty strings")
        else:
            check(kind, self.text != "", "must not be empty")

    @classmethod
    def of(cls, kind: str, text: str = "") -> Constraint:
        """A constraint of the kind a string names (`"regex"`); ValueError names an unknown kind."""
        return cls(kind, text)  # type: ignore[arg-type]  # __post_init__ checks the kind and converts it

    @classmethod
    def json_schema(cls, schema: str | Mapping[str, Any]) -> Constraint:
        return cls(ConstraintKind.JSON_SCHEMA, schema if isinstance(schema, str) else json.dumps(schema))

    @classmethod
    def json_object(cls) -> Constraint:
        return cls(ConstraintKind.JSON_OBJECT)

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls(ConstraintKind.REGEX, pattern)

    @classmethod
    def grammar(cls, ebnf: str) -> Constraint:
        return cls(ConstraintKind.GRAMMAR, ebnf)

    @classmethod
    def choice(cls, choices: Sequence[str]) -> Constraint:
        return cls(ConstraintKind.CHOICE, json.dumps(list(choices), ensure_ascii=False))

    @property
    def choices(self) -> list[str]:
        return list(json.loads(self.text)) if self.kind is ConstraintKind.CHOICE else []


def _json(kind: str, text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InvalidInput(kind, f"not valid JSON: {e}") from None


def choice_grammar(choices: Sequence[str]) -> str:
    """EBNF for exactly one of `choices`. NOTE: JSON string escapes are also xgrammar's EBNF literal escapes."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


# xgrammar's errors start with a timestamp and its C++ source position: `[16:32:14] /project/cpp/x.cc:83: `
_ERROR_PREFIX = re.compile(r"^\s*(\[[\d:]+\]\s*)?(\S+\.(cc|h):\d+:\s*)?(Check failed: .*? is false:\s*)?")


def compile_error(kind: str, error: BaseException) -> InvalidInput:
    """A compile failure as an InvalidInput that names the kind, without xgrammar's source positions."""
    message = _ERROR_PREFIX.sub("", str(error)).strip() or type(error).__name__
    return InvalidInput(kind, f"does not compile: {message}")


# --- the tokenizer as xgrammar sees it

# GPT-2's byte-to-unicode alphabet: a byte-level BPE vocabulary spells every byte with one of these
_BYTE_LEVEL_CHARS = frozenset(
    chr(b) for b in [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
) | frozenset(chr(256 + n) for n in range(68))


def vocab_type_name(vocab: Sequence[str]) -> str:
    """ "BYTE_FALLBACK" (sentencepiece `<0x0A>` pieces), "BYTE_LEVEL" (GPT-2 byte alphabet) or "RAW"."""
    present = set(vocab)
    if sum(f"<0x{b:02X}>" in present for b in range(256)) >= 128:
        return "BYTE_FALLBACK"
    if sum(c in present for c in _BYTE_LEVEL_CHARS) >= 128:
        spelled = sum(all(c in _BYTE_LEVEL_CHARS for c in token) for token in vocab if token)
        if spelled >= 0.99 * sum(1 for token in vocab if token):  # added tokens (`<|im_end|>`) may not be
            return "BYTE_LEVEL"
    return "RAW"


def tokenizer_info(tokenizer: Tokenizer, vocab_size: int, stop_token_ids: Sequence[int]) -> xgr.TokenizerInfo:
    """xgrammar's view of the vocabulary: `vocab_size` is the model's logits width (may pad the tokenizer's)."""
    import xgrammar as xgr

    vocab = [tokenizer.id_to_token(i) or "" for i in range(min(vocab_size, tokenizer.vocab_size))]
    vocab += [""] * (vocab_size - len(vocab))
    kind = xgr.VocabType[vocab_type_name(vocab)]
    first = tokenizer.convert_ids_to_tokens(tokenizer.encode("a", add_special_tokens=False)[:1])
    prefix = "▁" if kind is xgr.VocabType.BYTE_FALLBACK else "Ġ"
    add_prefix_space = bool(first and first[0] and first[0].startswith(prefix))
    stops = list(stop_token_ids) or None  # none known: xgrammar finds them
    return xgr.TokenizerInfo(vocab, kind, vocab_size=vocab_size, stop_token_ids=stops,
                             add_prefix_space=add_prefix_space)  # fmt: skip


# --- the compiler service


def _compile(compiler: xgr.GrammarCompiler, constraint: Constraint) -> xgr.CompiledGrammar:
    kind = constraint.kind
    if kind is ConstraintKind.JSON_SCHEMA:
        # NOTE: no free whitespace (`{"a": 1, "b": 2}` only): a small model at temperature 1 may otherwise
        # write spaces and newlines until max_tokens and never close the object
        return compiler.compile_grammar(json_schema_grammar(constraint.text))
    if kind is ConstraintKind.JSON_OBJECT:
        return compiler.compile_json_schema(JSON_OBJECT_SCHEMA, any_whitespace=False, strict_mode=False)
    if kind is ConstraintKind.REGEX:
        return compiler.compile_regex(constraint.text)
    if kind is ConstraintKind.CHOICE:
        return compiler.compile_grammar(choice_grammar(constraint.choices))
    return compiler.compile_grammar(constraint.text)


def _allows_a_token(compiled: xgr.CompiledGrammar, vocab_size: int) -> bool:
    """Whether an output can start: the first step's mask allows some token."""
    import xgrammar as xgr

    bits = xgr.allocate_token_bitmask(1, vocab_size)
    xgr.GrammarMatcher(compiled).fill_next_token_bitmask(bits, 0)
    return bool(bits.any())


class GrammarCompiler:
    """Compiles constraints on its own threads; a bounded cache of results keyed by (kind, text).

    `submit` is thread-safe and returns at once: a Future of the compiled grammar, or of a ValueError that
    names the kind. A failure is cached like a success (the same text fails the same way).
    """

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        self.tokenizer, self.vocab_size, self.stop_token_ids = tokenizer, vocab_size, tuple(stop_token_ids)
        self._executor = ThreadPoolExecutor(NUM_COMPILE_THREADS, thread_name_prefix="infer-grammar")
        self._lock = threading.RLock()  # NOTE: reentrant: a done callback may run inside submit
        self._cache: OrderedDict[Constraint, Future[xgr.CompiledGrammar]] = OrderedDict()
        self._sizes: dict[Constraint, int] = {}  # memory of the compiled grammars in the cache
        self._backend: xgr.GrammarCompiler | None = None
        self._backend_lock = threading.Lock()
        self.num_compiled = 0
        self.compile_s_total = 0.0

    def start(self) -> Future[xgr.GrammarCompiler]:
        """Import xgrammar and read the vocabulary now, on a compile thread (else the first compile does)."""
        return self._executor.submit(self._compiler)

    def submit(self, constraint: Constraint) -> Future[xgr.CompiledGrammar]:
        with self._lock:
            future = self._cache.get(constraint)
            if future is not None and not future.cancelled():
                self._cache.move_to_end(constraint)
                return future
            future = self._executor.submit(self._compile, constraint)
            self._cache[constraint] = future
            self._evict()
            future.add_done_callback(lambda done: self._count_bytes(constraint, done))
        return future

    def _count_bytes(self, constraint: Constraint, future: Future[xgr.CompiledGrammar]) -> None:
        with self._lock:
            if self._cache.get(constraint) is future and not future.cancelled() and future.exception() is None:
                self._sizes[constraint] = future.result().memory_size_bytes
                self._evict()

    def _compile(self, constraint: Constraint) -> xgr.CompiledGrammar:
        started_s = time.perf_counter()
        try:
            compiled = _compile(self._compiler(), constraint)
        except RuntimeError as e:  # xgrammar's errors for a schema, regex or grammar it cannot take
            raise compile_error(constraint.kind, e) from None
        if not _allows_a_token(compiled, self.vocab_size):  # e.g. a JSON schema whose $refs only loop
            raise InvalidInput(constraint.kind, "does not compile: no output can match it")
        elapsed_s = time.perf_counter() - started_s
        with self._lock:
            self.num_compiled += 1
            self.compile_s_total += elapsed_s
        logger.debug("compiled a %s constraint in %.1f ms", constraint.kind, elapsed_s * 1e3)
        return compiled

    def _evict(self) -> None:
        """Oldest first, while over either bound; the newest entry always stays."""
        while len(self._cache) > 1 and (
            len(self._cache) > MAX_CACHED_GRAMMARS or self.cached_bytes > MAX_CACHED_GRAMMAR_BYTES
        ):
            oldest, _ = self._cache.popitem(last=False)
            self._sizes.pop(oldest, None)

    def _compiler(self) -> xgr.GrammarCompiler:
        with self._backend_lock:
            if self._backend is None:
                import xgrammar as xgr

                started_s = time.perf_counter()
                info = tokenizer_info(self.tokenizer, self.vocab_size, self.stop_token_ids)
                self._backend = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
                logger.info("grammar compiler ready in %.1f s", time.perf_counter() - started_s)
            return self._backend

    @property
    def num_cached(self) -> int:
        return len(self._cache)

    @property
    def cached_bytes(self) -> int:
        return sum(self._sizes.values())

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
