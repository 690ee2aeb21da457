"""EngineCore: the step loop. Schedule, run one forward pass, sample, then stream deltas.

Requests and aborts arrive through a thread-safe inbox and are taken in at the
start of a step. Outputs leave through each request's sink callback.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from infer.engine.block_manager import BlockManager
from infer.engine.config import EngineConfig
from infer.engine.detokenizer import IncrementalDetokenizer
from infer.engine.loader import load_model, load_model_config
from infer.engine.request import FinishReason, Request, RequestOutput, Timings, TokenLogprob, Usage
from infer.engine.runner import ModelRunner, SeqWork, kv_cache_bytes_per_block
from infer.engine.sampler import Sampler, SamplerOutput, SamplingRow
from infer.engine.sampling_params import SamplingParams
from infer.engine.scheduler import Scheduler, SchedulerOutput
from infer.engine.stats import EngineStats, ThroughputMeter
from infer.engine.tokenizer import Tokenizer
from infer.engine.validation import check

logger = logging.getLogger(__name__)

Sink = Callable[[RequestOutput], None]


class QueueFullError(RuntimeError):
    """The waiting queue holds max_waiting_requests already; retry later."""


@dataclass
class _Live:
    """Engine-side companions of a request: its sink, detokenizer and generator."""

    request: Request
    sink: Sink
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator | None


def resolve_model_dir(model: str | None) -> Path:
    if model is not None:
        return Path(model).expanduser()
    from infer.engine.default_model import default_model_dir

    return default_model_dir()


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_dir = resolve_model_dir(config.model)
        self.model_config = load_model_config(self.model_dir)
        max_positions = self.model_config.max_position_embeddings
        check("max_model_len", config.max_model_len <= max_positions,
              f"must be <= the model's max_position_embeddings ({max_positions})")  # fmt: skip
        self.tokenizer = Tokenizer.from_dir(self.model_dir)
        model = load_model(self.model_dir, config.torch_dtype, config.device, config.max_model_len, config.quantization)
        self.num_blocks = config.num_blocks or config.kv_cache_memory_bytes // kv_cache_bytes_per_block(
            model, config.block_size, config.torch_dtype
        )
        check("num_blocks", self.num_blocks >= config.max_blocks_per_seq,
              f"the KV pool ({self.num_blocks} blocks) must hold one max_model_len request "
              f"({config.max_blocks_per_seq} blocks)")  # fmt: skip
        self.block_manager = BlockManager(self.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager)
        self.runner = ModelRunner(model, self.num_blocks, config.block_size)
        self.sampler = Sampler(config.seed, self.runner.device)
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids) | frozenset(self.model_config.eos_token_ids)
        self.live: dict[str, _Live] = {}
        self.num_steps = 0
        self.throughput = ThroughputMeter()  # all tokens of every step
        self.prefill_throughput = ThroughputMeter()  # prompt tokens, over steps busy with prefill
        self.num_preemptions_total = self.num_prompt_tokens_total = 0
        self.num_generation_tokens_total = self.num_cached_tokens_total = 0
        self._inbox: queue.SimpleQueue[tuple[Request, Sink] | str] = queue.SimpleQueue()  # adds and aborts
        self._lock = threading.Lock()
        self._num_queued = 0  # accepted but not yet scheduled: bounded by max_waiting_requests
        self._inbox_tokens = 0  # prompt tokens of requests still in the inbox (not yet seen by the scheduler)
        self._ids_in_flight: set[str] = set()
        self.wakeup = threading.Event()

    # intake (thread-safe)
    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        check("prompt", len(prompt_token_ids) > 0, "must not be empty")
        vocab = self.model_config.vocab_size
        check("prompt_token_ids", all(0 <= t < vocab for t in prompt_token_ids), f"ids must be in [0, {vocab})")
        total = len(prompt_token_ids) + params.max_tokens
        check("max_tokens", total <= self.config.max_model_len,
              f"prompt ({len(prompt_token_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
              f"max_model_len ({self.config.max_model_len})")  # fmt: skip

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams, sink: Sink) -> None:
        """Validate and enqueue; ValueError for bad input, QueueFullError when the queue is full."""
        self.validate(prompt_token_ids, params)
        with self._lock:
            check("request_id", request_id not in self._ids_in_flight, f"{request_id!r} is already in flight")
            if self._num_queued >= self.config.max_waiting_requests:
                raise QueueFullError(f"{self._num_queued} requests are waiting (max_waiting_requests)")
            self._num_queued += 1
            self._inbox_tokens += len(prompt_token_ids)
            self._ids_in_flight.add(request_id)
        request = Request(request_id, list(prompt_token_ids), params, time.monotonic())
        self._inbox.put((request, sink))
        self.wakeup.set()

    def abort(self, request_id: str) -> None:
        self._inbox.put(request_id)
        self.wakeup.set()

    @property
    def num_queued(self) -> int:
        return self._num_queued

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or not self._inbox.empty()

    def _drain_inbox(self) -> None:
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if isinstance(item, tuple):
                self._admit(*item)
                with self._lock:  # after the scheduler has it: the queued work is never missed
                    self._inbox_tokens -= item[0].num_prompt_tokens
            elif item in self.live:
                self._finish(self.live[item], FinishReason.ABORT)

    def _admit(self, request: Request, sink: Sink) -> None:
        p = request.params
        generator = None
        if p.seed is not None and not p.is_greedy:
            generator = torch.Generator(device=self.runner.device)
            generator.manual_seed(p.seed)
        detok = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, p.skip_special_tokens, p.stop)
        self.live[request.request_id] = _Live(request, sink, detok, generator)
        self.scheduler.add(request)

    # the step
    def step(self) -> bool:
        """One engine step; False when there was nothing to run."""
        self._drain_inbox()
        out = self.scheduler.schedule(time.monotonic())
        self._count_admitted()
        if out.is_empty:
            return False
        self.num_steps += 1
        started_s, prompt_tokens_before = time.monotonic(), self.num_prompt_tokens_total
        work, sampling = self._work(out)
        logits = self._forward(work, sampling)
        sampling = [rid for rid in sampling if rid in self.live]
        sampled = self._sample(logits[: len(sampling)] if logits is not None else None, sampling)
        self.scheduler.update(out, {rid: t for rid, (t, _) in sampled.items()})
        elapsed_s = time.monotonic() - started_s
        self.throughput.record(out.total_tokens, elapsed_s)
        num_prompt_tokens = self.num_prompt_tokens_total - prompt_tokens_before
        if num_prompt_tokens >= self.config.max_num_batched_tokens // 4:
            self.prefill_throughput.record(num_prompt_tokens, elapsed_s)
        self.num_preemptions_total += len(out.preempted)
        self.num_generation_tokens_total += len(sampled)
        for rid, (token_id, logprob) in sampled.items():
            self._postprocess(self.live[rid], token_id, logprob)
        return True

    def stats(self) -> EngineStats:
        """A snapshot for metrics; safe to read from another thread (values may be one step old)."""
        sched = self.scheduler
        queued = sum(r.num_tokens - r.num_computed_tokens for r in (*sched.waiting, *sched.running))
        queued += self._inbox_tokens
        return EngineStats(
            num_waiting=len(sched.waiting) + self._inbox.qsize(),
            num_running=len(sched.running),
            num_blocks_used=self.block_manager.num_used_blocks,
            num_blocks_free=self.block_manager.num_free_blocks,
            num_preemptions_total=self.num_preemptions_total,
            num_prompt_tokens_total=self.num_prompt_tokens_total,
            num_generation_tokens_total=self.num_generation_tokens_total,
            num_cached_tokens_total=self.num_cached_tokens_total,
            tokens_per_s=self.throughput.tokens_per_s,
            queued_tokens=queued,
        )

    def predict_ttft_s(self, num_prompt_tokens: int) -> float:
        """Time until a new request's first token, from the work queued ahead of it.

        The queued work is mostly prompt tokens, computed at the prefill rate (the rate of all tokens
        is that of decode steps, one token per request per step, and far lower).
        """
        meter = self.prefill_throughput if self.prefill_throughput.tokens_per_s > 0 else self.throughput
        return meter.predict_s(self.stats().queued_tokens + num_prompt_tokens)

    def _count_admitted(self) -> None:
        with self._lock:
            self._num_queued = sum(1 for r in self.scheduler.waiting if r.first_scheduled_s is None)
            self._num_queued += self._inbox.qsize()

    def _work(self, out: SchedulerOutput) -> tuple[list[tuple[str, SeqWork]], list[str]]:
        work: list[tuple[str, SeqWork]] = []
        sampling: list[str] = []
        for rid, n in out.num_scheduled_tokens.items():
            r = self.scheduler.requests[rid]
            start = r.num_computed_tokens
            needs_logits = start + n == r.num_tokens
            tokens = r.token_slice(start, start + n)
            self.num_prompt_tokens_total += max(0, min(start + n, r.num_prompt_tokens) - start)
            work.append((rid, SeqWork(tokens, start, self.block_manager.block_table(rid), needs_logits)))
            if needs_logits:
                sampling.append(rid)
        return work, sampling

    def _forward(self, work: list[tuple[str, SeqWork]], sampling: list[str]) -> torch.Tensor | None:
        try:
            return self.runner.execute([w for _, w in work])
        except Exception:
            logger.exception("forward pass failed; retrying its requests one by one")
        # isolate: the requests that fail alone fail; the others go on
        rows: list[torch.Tensor] = []
        for rid, w in work:
            try:
                logits = self.runner.execute([w])
            except Exception as e:
                self._fail(rid, e)
                continue
            if w.needs_logits:
                rows.append(logits)
        return torch.cat(rows) if rows else None

    def _sample(self, logits: torch.Tensor | None, rids: list[str]) -> dict[str, tuple[int, TokenLogprob | None]]:
        if logits is None or not rids:
            return {}
        rows = [self._sampling_row(self.live[rid]) for rid in rids]
        try:
            out: SamplerOutput = self.sampler(logits, rows)
            return {rid: (out.token_ids[i], out.logprobs[i]) for i, rid in enumerate(rids)}
        except Exception:
            logger.exception("sampling failed; retrying its requests one by one")
        result: dict[str, tuple[int, TokenLogprob | None]] = {}
        for i, rid in enumerate(rids):
            try:
                one = self.sampler(logits[i : i + 1], rows[i : i + 1])
                result[rid] = (one.token_ids[0], one.logprobs[0])
            except Exception as e:
                self._fail(rid, e)
        return result

    def _sampling_row(self, live: _Live) -> SamplingRow:
        r, p = live.request, live.request.params
        banned: tuple[int, ...] = ()
        if r.num_output_tokens < p.min_tokens:
            banned = tuple(self.eos_token_ids | set(p.stop_token_ids))
        return SamplingRow(p, r.prompt_token_ids, r.output_token_ids, live.generator, banned)

    def _postprocess(self, live: _Live, token_id: int, logprob: TokenLogprob | None) -> None:
        try:
            self._emit_token(live, token_id, logprob)
        except Exception as e:
            self._fail(live.request.request_id, e)

    def _emit_token(self, live: _Live, token_id: int, logprob: TokenLogprob | None) -> None:
        r, p = live.request, live.request.params
        if r.first_token_s is None:
            r.first_token_s = time.monotonic()
        logprobs = [logprob] if logprob is not None else None
        reason: FinishReason | None = None
        text = ""
        if token_id in p.stop_token_ids or (token_id in self.eos_token_ids and not p.ignore_eos):
            reason = FinishReason.STOP
        else:
            text = live.detokenizer.push([token_id])
            if live.detokenizer.stopped_on is not None:
                reason = FinishReason.STOP
        if reason is None and (r.num_output_tokens >= p.max_tokens or r.num_tokens >= self.config.max_model_len):
            reason = FinishReason.LENGTH
        if reason is None:
            live.sink(RequestOutput(r.request_id, [token_id], text, logprobs))
            return
        self._finish(live, reason, [token_id], text, logprobs)

    def _finish(
        self,
        live: _Live,
        reason: FinishReason,
        token_ids: Sequence[int] = (),
        text: str = "",
        logprobs: list[TokenLogprob] | None = None,
        error: str | None = None,
    ) -> None:
        r = live.request
        self.scheduler.finish(r.request_id)
        del self.live[r.request_id]
        with self._lock:
            self._ids_in_flight.discard(r.request_id)
        if reason in (FinishReason.LENGTH, FinishReason.STOP) and live.detokenizer.stopped_on is None:
            text += live.detokenizer.flush()
        now = time.monotonic()
        usage = Usage(r.num_prompt_tokens, r.num_output_tokens, r.num_cached_tokens)
        self.num_cached_tokens_total += r.num_cached_tokens
        timings = Timings(
            queue_s=(r.first_scheduled_s or now) - r.arrival_time_s,
            ttft_s=(r.first_token_s or now) - r.arrival_time_s,
            total_s=now - r.arrival_time_s,
            num_preemptions=r.num_preemptions,
        )
        out = RequestOutput(r.request_id, list(token_ids), text, logprobs, reason, usage, timings, error)
        live.sink(out)

    def _fail(self, request_id: str, error: BaseException) -> None:
        logger.error("request %s failed: %r", request_id, error)
        live = self.live.get(request_id)
        if live is not None:
            self._finish(live, FinishReason.ERROR, error=f"{type(error).__name__}: {error}")
