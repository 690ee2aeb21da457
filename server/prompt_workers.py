"""Where prompts are rendered and tokenized: threads of their own, off the event loop, in two lanes.

A short prompt (the common case, a few milliseconds of work) runs in the short lane; a long one in the
long lane, one at a time, behind at most `max_pending_long_prompts` others, else it is refused. So a
client sending long prompts delays other long prompts only, never the short ones, nor the event loop,
nor the asyncio default pool (which the rest of the server uses). What one prompt may cost is bounded
before it gets here (`InputBounds`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from infer.engine import QueueFullError
from infer.server.convert import InputSize

T = TypeVar("T")

SHORT_PROMPT_CHARS = 4096  # about 1000 tokens: ~4 ms of tokenizing on one core
SHORT_PROMPT_MESSAGES = 64
NUM_SHORT_WORKERS = 2  # NOTE: tokenizing releases the GIL; more threads than cores would not help
NUM_LONG_WORKERS = 1

_pools: dict[str, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(name: str, num_workers: int) -> ThreadPoolExecutor:
    """One pool per lane for the process, started on first use (threads start as work arrives)."""
    with _pools_lock:
        if name not in _pools:
            _pools[name] = ThreadPoolExecutor(num_workers, thread_name_prefix=f"infer-prompt-{name}")
        return _pools[name]


def is_short(size: InputSize) -> bool:
    return size.num_chars <= SHORT_PROMPT_CHARS and size.num_messages <= SHORT_PROMPT_MESSAGES


class PromptWorkers:
    """Runs prompt work in its lane; QueueFullError when the long lane already holds its bound."""

    def __init__(self, max_pending_long_prompts: int) -> None:
        if max_pending_long_prompts < 1:
            raise ValueError("max_pending_long_prompts: must be >= 1")
        self.max_pending_long_prompts = max_pending_long_prompts
        self._lock = threading.Lock()
        self.num_pending_long = 0  # submitted to the long lane and not yet done (queued or running)

    async def run(self, size: InputSize, work: Callable[[], T]) -> T:
        if is_short(size):
            return await asyncio.wrap_future(_pool("short", NUM_SHORT_WORKERS).submit(work))
        with self._lock:
            if self.num_pending_long >= self.max_pending_long_prompts:
                raise QueueFullError(
                    f"{self.num_pending_long} long prompts are waiting to be tokenized (max_pending_long_prompts; "
                    "server setting --max-pending-long-prompts / INFER_MAX_PENDING_LONG_PROMPTS)"
                )
            self.num_pending_long += 1
        future = _pool("long", NUM_LONG_WORKERS).submit(work)
        # NOTE: counted until the work is done, not until its caller leaves: a cancelled RPC whose work still
        # runs holds its place (a queued one is cancelled with the caller and frees it at once)
        future.add_done_callback(self._long_done)
        return await asyncio.wrap_future(future)

    def _long_done(self, _: Future[T]) -> None:
        with self._lock:
            self.num_pending_long -= 1
