"""Constrained requests inside the engine: each one's grammar matcher, and one token bitmask per step.

A request with a constraint waits in the scheduler's queue, skipped, until its grammar has compiled, so it
never holds up the batch (those waiting requests are the only record of what is compiling); then it gets a
matcher that advances on each token it is given. The matcher only ever sees output tokens, so chunked
prefill, prefix-cache hits and preemption (which recomputes the same tokens) leave it as it is.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from infer.engine.structured.compiler import GrammarCompiler
from infer.engine.structured.constraint import Constraint
from infer.engine.structured.grammar_state import GrammarState

if TYPE_CHECKING:
    import xgrammar as xgr

    from infer.engine.request import Request


@dataclass(frozen=True)
class TokenBitmask:
    """The tokens each constrained row may take this step (xgrammar's packed format: bit i of word j allows
    token 32 * j + i); rows of unconstrained requests are left out of `rows` and never applied."""

    bits: torch.Tensor  # [num_rows, ceil(vocab / 32)] int32
    rows: list[int]  # the constrained rows


def apply_bitmask(logits: torch.Tensor, mask: TokenBitmask) -> None:
    """Forbidden tokens to -inf, in place. logits: [num_rows, vocab]."""
    import xgrammar as xgr

    bits = mask.bits.to(logits.device, non_blocking=True)
    xgr.apply_token_bitmask_inplace(logits, bits, vocab_size=logits.shape[-1], indices=mask.rows)


class StructuredOutputs:
    """The engine core's structured-output manager: compiles off the step thread, starts the matchers of the
    requests whose grammar has compiled, and builds each step's bitmask for the constrained rows only.

    It keeps no table of its own: the requests still compiling are the scheduler's waiting requests that are
    not ready (`Request.is_ready`), and the core passes them in."""

    def __init__(self, compiler: GrammarCompiler, num_rows: int, on_compiled: Callable[[], None]) -> None:
        self.compiler, self.on_compiled = compiler, on_compiled
        self.num_rows = num_rows  # allocated at first; grown when a step samples more (drafts)
        self._bits: torch.Tensor | None = None  # reused, grown to a step's rows: [num_rows, ceil(vocab / 32)]
        self._batch: xgr.BatchGrammarMatcher | None = None

    def grammar(self, constraint: Constraint) -> GrammarState:
        """Start compiling (thread-safe; QueueFullError when the compile queue is full); `on_compiled` runs when
        it is done (the step loop wakes up). `release` it if its request ends before its matcher starts."""
        future = self.compiler.submit(constraint)
        future.add_done_callback(lambda _: self.on_compiled())
        return GrammarState(constraint, future)

    def release(self, request: Request) -> None:
        """The request ended: a compile only it waited for is dropped unless it has started."""
        if request.grammar is not None and request.grammar.matcher is None:
            self.compiler.release(request.grammar.future)

    # the step thread
    def take_compiled(self, compiling: Sequence[Request]) -> tuple[list[Request], list[tuple[Request, BaseException]]]:
        """Of the requests whose grammar was compiling, those now ready (matcher started), and those that failed."""
        ready: list[Request] = []
        failed: list[tuple[Request, BaseException]] = []
        for request in compiling:
            assert request.grammar is not None and request.grammar.matcher is None
            if not request.grammar.is_compiled:
                continue
            try:
                request.grammar.start()
            except Exception as e:
                failed.append((request, e))
                continue
            ready.append(request)
        return ready, failed

    def wait(self, compiling: Sequence[Request], timeout_s: float) -> None:
        """Block until one of these requests' grammar is done, at most `timeout_s`."""
        futures = [r.grammar.future for r in compiling if r.grammar is not None]
        if futures:
            concurrent.futures.wait(futures, timeout_s, return_when=concurrent.futures.FIRST_COMPLETED)

    def bitmask(self, requests: Sequence[Request]) -> TokenBitmask | None:
        """This step's mask for the sampling rows, a request per row in order (a request with drafts fills
        several); None when none is constrained."""
        rows = [i for i, r in enumerate(requests) if r.grammar is not None and r.grammar.matcher is not None]
        if not rows:
            return None
        import xgrammar as xgr

        if self._batch is None:
            self._batch = xgr.BatchGrammarMatcher()
        # NOTE: a step samples a row per request plus one per draft token: with speculation, more than max_num_seqs
        if self._bits is None or self._bits.shape[0] < len(requests):
            num_rows = max(len(requests), self.num_rows)
            self._bits = xgr.allocate_token_bitmask(num_rows, self.compiler.vocab_size)
        bits = self._bits[: len(requests)]
        matchers = [m for i in rows if (m := _matcher(requests[i])) is not None]
        self._batch.batch_fill_next_token_bitmask(matchers, bits, indices=rows)
        return TokenBitmask(bits, rows)


def _matcher(request: Request) -> xgr.GrammarMatcher | None:
    return request.grammar.matcher if request.grammar is not None else None
