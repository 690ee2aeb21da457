"""AsyncEngine: the engine core on its own thread, streamed to asyncio callers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from infer.engine.config import EngineConfig
from infer.engine.core import EngineCore
from infer.engine.input_processor import InputLimits, ProcessedInput, Prompt
from infer.engine.interface import ModelInfo
from infer.engine.request import FinishReason, RequestOutput
from infer.engine.sampling_params import SamplingParams
from infer.engine.stats import EngineStats
from infer.engine.stream import RequestStream
from infer.engine.structured import Constraint
from infer.engine.threads import governor_for
from infer.engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

WARMUP_MAX_TOKENS = 8  # the warm-up's greedy decode: several steps, as a real request takes
# the warm-up's prompt: enough rows for every tile of the kernels (8 a tile) and a chunk of attention; NOTE: half a
# step's budget (128 tokens) took ~3 s of a 1.5B model's time to SERVING on 2 cores, for a prefill rate that real
# prompts refine within a few steps anyway
WARMUP_PROMPT_TOKENS = 32
STEP_RETRY_S = 1.0  # after a step raised: the next step, with work or without, at most this much later


class WarmupError(RuntimeError):
    """The warm-up request failed: the engine cannot serve (the server must not report SERVING)."""


class AsyncEngine:
    """`async with engine.generate(...) as stream`; the step loop never runs on the event loop.

    Implements `EngineClient`, the interface the server uses. `core` is the engine core it drives: for
    tests and tools, not for the server.
    """

    def __init__(self, core: EngineCore) -> None:
        self._start(lambda: core)

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncEngine:
        """Load the model on the engine's own thread, which then runs the steps.

        NOTE: with libgomp (torch's OpenMP), the parallel regions of a thread that is not the first in the
        process to start one ran 2-2.5x slower on the small ops of a decode step (measured: a 1-row linear
        layer 40 -> 100 us; batch-1 decode 130 -> 68 tok/s). Loading here makes the engine thread that first
        thread, as long as nothing in the process ran a parallel torch op before.
        """
        engine = cls.__new__(cls)
        engine._start(lambda: _following_free_cores(EngineCore.from_config(config)))
        return engine

    def _start(self, build: Callable[[], EngineCore]) -> None:
        self._stopped = threading.Event()
        self._step_started_s: float | None = None  # while a step runs: when it started
        self._failing: str | None = None  # since a step raised, until one passes: why
        self._num_failed_steps = 0
        built: queue.Queue[EngineCore | BaseException] = queue.Queue(maxsize=1)
        self._thread = threading.Thread(target=self._run, args=(build, built), name="infer-engine-core", daemon=True)
        self._thread.start()
        result = built.get()
        if isinstance(result, BaseException):
            self._thread.join()
            raise result
        self.core = result

    @property
    def config(self) -> EngineConfig:
        return self.core.config

    @property
    def model_info(self) -> ModelInfo:
        return self.core.model_info

    @property
    def tokenizer(self) -> Tokenizer:
        return self.core.tokenizer

    def process(self, prompt: Prompt, params: SamplingParams, limits: InputLimits | None = None) -> ProcessedInput:
        return self.core.processor.process(prompt, params, limits)

    def tokenize(self, prompt: Prompt, limits: InputLimits | None = None) -> ProcessedInput:
        return self.core.processor.tokenize(prompt, limits)

    def predict_ttft_s(self, num_prompt_tokens: int) -> float:
        return self.core.predict_ttft_s(num_prompt_tokens)

    async def compile_constraint(self, constraint: Constraint) -> None:
        future = self.core.compile_constraint(constraint)
        waiting = asyncio.wrap_future(future)
        waiting.add_done_callback(_read_outcome)  # NOTE: a caller that left never reads it
        try:
            # NOTE: shielded: the compile is shared (cached); a caller that goes away only gives up its interest,
            # and the compile is dropped if no one else waits for it
            await asyncio.shield(waiting)
        finally:
            self.core.release_constraint(future)

    def stats(self) -> EngineStats:
        return self.core.stats()

    def problem(self, stall_timeout_s: float) -> str | None:
        """Why the engine cannot make progress (its thread is gone, its steps raise, or one step has run longer
        than stall_timeout_s), or None when it is healthy."""
        if not self._thread.is_alive() and not self._stopped.is_set():
            return "the engine thread has stopped"
        if self._failing is not None:
            return self._failing
        started_s = self._step_started_s
        if started_s is not None and (running_s := time.monotonic() - started_s) > stall_timeout_s:
            return f"one engine step has run for {running_s:.0f} s (stall timeout {stall_timeout_s:g} s)"
        return None

    def _run(self, build: Callable[[], EngineCore], built: queue.Queue[EngineCore | BaseException]) -> None:
        try:
            core = build()
        except BaseException as e:  # NOTE: handed to the thread that waits in _start, which raises it
            built.put(e)
            return
        built.put(core)
        while not self._stopped.is_set():
            self._step_started_s = time.monotonic()
            try:
                did_work = core.step()
            except Exception as e:
                self._step_failed(core, e)
                self._step_started_s = None
                core.wait_for_work(STEP_RETRY_S)  # then a step again: one that passes, empty or not, clears it
                continue
            self._step_started_s = None
            if self._failing is not None:
                logger.warning("engine steps pass again after %d failed", self._num_failed_steps)
                self._failing, self._num_failed_steps = None, 0
            if not did_work:
                core.wait_for_work()

    def _step_failed(self, core: EngineCore, error: Exception) -> None:
        """A step raised: its requests (every request in the engine) fail, and `problem` says so until a step
        passes. Logged with its traceback once, not once a step (nor once a request)."""
        self._num_failed_steps += 1
        if self._failing is None:
            logger.exception("engine step failed; failing every request in the engine")
        self._failing = f"engine steps are failing ({type(error).__name__}: {error})"
        core.fail_all(RuntimeError("engine step failed"))

    def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        tenant: str | None = None,
    ) -> RequestStream:
        """Enqueue the request and stream its deltas; ValueError for bad input, QueueFullError when the queue is
        full (both at once, from this call). Closing or dropping the stream early aborts the request (see
        `RequestStream`): use `async with engine.generate(...) as stream`. `tenant`: who asks (None: the
        default tenant)."""
        as_prompt = Prompt(text=prompt) if isinstance(prompt, str) else Prompt(token_ids=prompt)
        return self.submit(self.process(as_prompt, params), request_id, tenant)

    def submit(
        self, processed: ProcessedInput, request_id: str | None = None, tenant: str | None = None
    ) -> RequestStream:
        """`generate` for a request `process` has checked: it is not checked again."""
        request_id = request_id or uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue[RequestOutput] = asyncio.Queue()

        def sink(out: RequestOutput) -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: its caller is gone
                loop.call_soon_threadsafe(deltas.put_nowait, out)

        self.core.submit(request_id, processed, sink, tenant)
        return RequestStream(request_id, deltas, self.core.abort)

    def abort(self, request_id: str) -> None:
        self.core.abort(request_id)

    async def warmup(self) -> None:
        """One greedy request the way a real one runs (`generate`: validation, scheduler, runner, sampler,
        detokenizer): a prefill of 32 tokens (at most half a step's budget), then a decode of a few tokens. The
        kernels are warm, the prefill rate that predicts time to first token (deadline admission) is seeded, and a
        path that fails (a kernel that cannot load, one that fails only on a later call) fails here, before the
        server reports SERVING: WarmupError."""
        cfg = self.config
        max_tokens = max(1, min(WARMUP_MAX_TOKENS, cfg.max_model_len // 2))
        num_prefill = max(1, min(WARMUP_PROMPT_TOKENS, cfg.max_num_batched_tokens // 2, cfg.max_model_len - max_tokens))
        hello = self.tokenizer.encode("Hello") or [0]
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        num_tokens = 0
        async with self.generate((hello * num_prefill)[:num_prefill], params, f"warmup-{uuid.uuid4().hex}") as stream:
            async for out in stream:
                if out.finish_reason is FinishReason.ERROR:
                    raise WarmupError(f"the warm-up request failed: {out.error}")
                num_tokens += len(out.token_ids)
        if num_tokens != max_tokens:
            raise WarmupError(f"the warm-up request generated {num_tokens} of {max_tokens} tokens")

    def shutdown(self) -> None:
        self._stopped.set()
        self.core.wake()
        self._thread.join(timeout=10)
        self.core.structured.compiler.shutdown()
        self.core.close()


def _read_outcome(future: asyncio.Future[Any]) -> None:
    """Marks a future's exception as read (asyncio logs one never read)."""
    if not future.cancelled():
        future.exception()


def _following_free_cores(core: EngineCore) -> EngineCore:
    """The core with the thread governor its steps tick (engine/threads.py), on the engine thread."""
    core.threads = governor_for(core.config, core.runner.device)
    if core.threads is not None:
        logger.info("CPU threads follow the free cores: up to %d", core.threads.max_threads)
    return core
