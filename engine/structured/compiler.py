"""`GrammarCompiler`: a `Constraint` compiled into a token-level automaton, off the step thread, cached.

xgrammar compiles once per (kind, text), on the compiler's own threads (never the step thread); each request
then walks it with its own matcher (`grammar_state.GrammarState`), and the sampler masks the tokens the automaton
forbids.
xgrammar is imported on first use: it takes ~2 s (it pulls in transformers).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from infer.engine.structured.constraint import JSON_OBJECT_SCHEMA, Constraint, ConstraintKind, choice_grammar
from infer.engine.structured.grammar_budget import (
    CHEAP_COMPILE_CPU_S,
    CompileDroppedError,
    CompileRefused,
    CompileStats,
    Refusals,
    Trial,
    TrialTokenizer,
    lower_priority,
    refusal,
    trial_worker,
)
from infer.engine.structured.schema import json_schema_grammar
from infer.engine.validation import InvalidInput, QueueFullError

if TYPE_CHECKING:
    import xgrammar as xgr

    from infer.engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

MAX_CACHED_GRAMMARS = 256
MAX_CACHED_GRAMMAR_BYTES = 256 << 20
DEFAULT_COMPILE_BUDGET_S = 10.0  # CPU seconds one compile may take (grammar_compile_budget_s)
DEFAULT_MAX_PENDING_GRAMMARS = 16  # compiles queued or running (max_pending_grammars)
TRIAL_WALL_LIMIT_S = 60.0  # and 10 x the budget: a trial with no answer by then is given up (not refused)


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
    """Compiles constraints off the step thread; a bounded cache of results keyed by (kind, text).

    `submit` is thread-safe and returns at once: a Future of the compiled grammar, or of a ValueError that
    names the kind; QueueFullError when `max_pending` compiles are already under way. Each `submit` counts a
    caller until the compile is done or the caller calls `release`: a compile whose callers all left before
    its trial ended is dropped. A failure is cached like a success (the same text fails the same way), and a
    refusal for its cost (`CompileRefused`) is also remembered beyond the cache.

    Each compile is tried first in a worker process, killed at `budget_s` of CPU time (`grammar_budget`), on a
    thread of its own that waits for it; then it is compiled here for the engine's matchers: at once when the
    trial took at most CHEAP_COMPILE_CPU_S, else on one thread at nice 19.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        budget_s: float = DEFAULT_COMPILE_BUDGET_S,
        max_pending: int = DEFAULT_MAX_PENDING_GRAMMARS,
    ) -> None:
        self.tokenizer, self.vocab_size, self.stop_token_ids = tokenizer, vocab_size, tuple(stop_token_ids)
        self.budget_s, self.max_pending = budget_s, max_pending
        # NOTE: a thread per compile under way (most wait for their trial): a slow one holds up no other
        self._executor = ThreadPoolExecutor(max_pending + 1, thread_name_prefix="infer-grammar")
        self._slow = ThreadPoolExecutor(1, thread_name_prefix="infer-grammar-slow", initializer=lower_priority)
        self._lock = threading.RLock()  # NOTE: reentrant: a done callback may run inside submit or release
        self._cache: OrderedDict[Constraint, Future[xgr.CompiledGrammar]] = OrderedDict()
        self._sizes: dict[Constraint, int] = {}  # memory of the compiled grammars in the cache
        self._callers: dict[Future[xgr.CompiledGrammar], int] = {}  # compiles not done: their callers waiting
        self._refused = Refusals()  # beyond the cache
        self._backend: tuple[xgr.GrammarCompiler, TrialTokenizer] | None = None
        self._backend_lock = threading.Lock()
        self._stopped = threading.Event()  # shutdown: the compiles under way give up
        self.num_pending = 0  # compiles under way
        self.num_compiled = self.num_refused = 0  # compiles run (whatever their outcome); refusals for cost
        self.compile_s_total = 0.0  # their time, trial included

    def start(self) -> Future[None]:
        """Import xgrammar, read the vocabulary and start the trial worker now (else the first compile does)."""
        return self._executor.submit(self._start)

    def _start(self) -> None:
        self._compiler()
        trial_worker().warm()

    def submit(self, constraint: Constraint) -> Future[xgr.CompiledGrammar]:
        with self._lock:
            future = self._cache.get(constraint)
            if future is not None and not future.cancelled():
                self._cache.move_to_end(constraint)
                if not future.done():
                    self._callers[future] = self._callers.get(future, 0) + 1
                return future
            if (refused := self._refused.get(constraint)) is not None:
                failed: Future[xgr.CompiledGrammar] = Future()
                failed.set_exception(refused)
                return failed
            if self.num_pending >= self.max_pending:
                raise QueueFullError(f"{self.num_pending} grammars are compiling or waiting to (max_pending_grammars)")
            future = Future()
            self._executor.submit(self._run, constraint, future)
            self.num_pending += 1
            self._callers[future] = 1
            self._cache[constraint] = future
            self._evict()
        return future

    def release(self, future: Future[xgr.CompiledGrammar]) -> None:
        """One caller of `submit` no longer waits for it; when none does, the compile is dropped (its trial is
        killed) unless it is compiling here already."""
        with self._lock:
            if future not in self._callers:  # done
                return
            self._callers[future] -= 1
            if self._callers[future] == 0 and future.cancel():  # NOTE: once it runs, its trial sees no caller
                self._settle(future, None)

    def _is_wanted(self, future: Future[xgr.CompiledGrammar]) -> bool:
        return not self._stopped.is_set() and self._callers.get(future, 0) > 0

    def _run(self, constraint: Constraint, future: Future[xgr.CompiledGrammar]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            compiled = self._compile(constraint, lambda: self._is_wanted(future))
        except BaseException as e:  # NOTE: the caller's to see, as an executor's future would have it
            self._settle(future, e, constraint=constraint)
            future.set_exception(e)
        else:
            self._settle(future, None, compiled, constraint)
            future.set_result(compiled)

    def _settle(
        self,
        future: Future[xgr.CompiledGrammar],
        error: BaseException | None,
        compiled: xgr.CompiledGrammar | None = None,
        constraint: Constraint | None = None,
    ) -> None:
        """The books of a compile that ended (or was dropped before it started), kept before its callers hear."""
        with self._lock:
            self.num_pending -= 1
            self._callers.pop(future, None)
            if constraint is None:  # dropped: found by its future
                constraint = next((c for c, f in self._cache.items() if f is future), None)
            if isinstance(error, CompileRefused) and constraint is not None:
                self.num_refused += 1
                self._refused.add(constraint, error)
            if constraint is None or self._cache.get(constraint) is not future:
                return
            if compiled is not None:
                self._sizes[constraint] = compiled.memory_size_bytes
                self._evict()
            elif error is None or isinstance(error, (QueueFullError, CompileDroppedError)):  # not the text's fault
                del self._cache[constraint]

    def _compile(self, constraint: Constraint, is_wanted: Callable[[], bool]) -> xgr.CompiledGrammar:
        started_s = time.perf_counter()
        try:
            return self._compile_tried(constraint, is_wanted)
        finally:
            elapsed_s = time.perf_counter() - started_s
            with self._lock:
                self.num_compiled += 1
                self.compile_s_total += elapsed_s
            logger.debug("compiled a %s constraint in %.1f ms", constraint.kind, elapsed_s * 1e3)

    def _compile_tried(self, constraint: Constraint, is_wanted: Callable[[], bool]) -> xgr.CompiledGrammar:
        """Compiled here once a worker compiled it within the budget: on this thread when that was cheap."""
        backend, tokenizer = self._compiler()
        wall_limit_s = TRIAL_WALL_LIMIT_S + 10 * self.budget_s
        trial, cpu_s = trial_worker().run(constraint, tokenizer, self.budget_s, wall_limit_s, is_wanted)
        if trial is not Trial.FINISHED:
            raise refusal(constraint.kind, trial, self.budget_s, wall_limit_s)
        if cpu_s <= CHEAP_COMPILE_CPU_S:
            return self._compile_here(backend, constraint)
        return self._slow.submit(self._compile_slow, backend, constraint, is_wanted).result()

    def _compile_slow(
        self, backend: xgr.GrammarCompiler, constraint: Constraint, is_wanted: Callable[[], bool]
    ) -> xgr.CompiledGrammar:
        if not is_wanted():  # its callers left while it waited for this thread
            raise CompileDroppedError(f"{constraint.kind}: compile given up: no caller waits for it")
        return self._compile_here(backend, constraint)

    def _compile_here(self, backend: xgr.GrammarCompiler, constraint: Constraint) -> xgr.CompiledGrammar:
        try:
            compiled = _compile(backend, constraint)
        except RuntimeError as e:  # xgrammar's errors for a schema, regex or grammar it cannot take
            raise compile_error(constraint.kind, e) from None
        if not _allows_a_token(compiled, self.vocab_size):  # e.g. a JSON schema whose $refs only loop
            raise InvalidInput(constraint.kind, "does not compile: no output can match it")
        return compiled

    def _evict(self) -> None:
        """Oldest first, while over either bound; the newest entry always stays."""
        while len(self._cache) > 1 and (
            len(self._cache) > MAX_CACHED_GRAMMARS or self.cached_bytes > MAX_CACHED_GRAMMAR_BYTES
        ):
            oldest, _ = self._cache.popitem(last=False)
            self._sizes.pop(oldest, None)

    def _compiler(self) -> tuple[xgr.GrammarCompiler, TrialTokenizer]:
        with self._backend_lock:
            if self._backend is None:
                import xgrammar as xgr

                started_s = time.perf_counter()
                info = tokenizer_info(self.tokenizer, self.vocab_size, self.stop_token_ids)
                backend = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
                self._backend = backend, TrialTokenizer.of(info.serialize_json())
                logger.info("grammar compiler ready in %.1f s", time.perf_counter() - started_s)
            return self._backend

    @property
    def num_cached(self) -> int:
        return len(self._cache)

    @property
    def cached_bytes(self) -> int:
        return sum(self._sizes.values())

    @property
    def stats(self) -> CompileStats:
        with self._lock:
            return CompileStats(self.num_pending, self.num_compiled, self.num_refused, self.compile_s_total)

    def shutdown(self) -> None:
        self._stopped.set()
        with self._lock:
            for future in list(self._callers):
                if future.cancel():  # those not started; those under way see `_stopped`
                    self._settle(future, None)
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._slow.shutdown(wait=False, cancel_futures=True)
