"""EngineCore: the step loop. Schedule, run one forward pass, sample, then stream deltas.

Requests and aborts arrive through a thread-safe inbox and are taken in at the
start of a step. Outputs leave through each request's sink callback.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from infer.engine.block_manager import BlockManager
from infer.engine.config import EngineConfig
from infer.engine.detokenizer import IncrementalDetokenizer
from infer.engine.inbox import Inbox, QueueFullError, Sink
from infer.engine.interface import ModelInfo
from infer.engine.request import FinishReason, Request, RequestOutput, Timings, TokenLogprob, Usage
from infer.engine.runner import SeqWork
from infer.engine.sampler import Sampler, SamplerOutput, SamplingRow
from infer.engine.sampling_params import SamplingParams
from infer.engine.scheduler import Scheduler, SchedulerOutput
from infer.engine.stats import EngineStats, StepCounters, StepRecord
from infer.engine.stopping import banned_token_ids, finish_reason, is_stop_token
from infer.engine.structured import GrammarCompiler
from infer.engine.structured_state import StructuredOutputs
from infer.engine.tokenizer import Tokenizer
from infer.engine.validation import check

__all__ = ["EngineCore", "QueueFullError", "Runner", "Sink"]

logger = logging.getLogger(__name__)


class Runner(Protocol):
    """Runs one forward pass over a step's work (`ModelRunner`, or a fake in tests)."""

    @property
    def num_blocks(self) -> int: ...  # KV blocks the runner's cache holds

    @property
    def device(self) -> torch.device: ...

    def execute(self, work: Sequence[SeqWork]) -> torch.Tensor:  # [num_sampling, vocab] fp32
        """Logits for the requests whose `needs_logits` is set, in order."""
        ...


@dataclass
class _Live:
    """Engine-side companions of a request: its sink, detokenizer and generator."""

    request: Request
    sink: Sink
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator | None


@dataclass(frozen=True)
class _StepWork:
    work: list[tuple[str, SeqWork]]
    sampling: list[str]  # requests that sample this step, in work order
    num_prompt_tokens: int  # prompt tokens computed this step


def resolve_model_dir(model: str | None) -> Path:
    if model is not None:
        return Path(model).expanduser()
    from infer.engine.default_model import default_model_dir

    return default_model_dir()


class EngineCore:
    def __init__(self, config: EngineConfig, runner: Runner, tokenizer: Tokenizer, model_info: ModelInfo) -> None:
        """An engine over its parts: tests pass a fake runner; `from_config` loads the real ones."""
        check("max_model_len", config.max_model_len > 0, "must be settled for the model (EngineConfig.for_model)")
        check("num_blocks", runner.num_blocks >= config.max_blocks_per_seq,
              f"the KV pool ({runner.num_blocks} blocks) must hold one max_model_len request "
              f"({config.max_blocks_per_seq} blocks)")  # fmt: skip
        self.config, self.runner, self.tokenizer, self.model_info = config, runner, tokenizer, model_info
        self.block_manager = BlockManager(runner.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager)
        self.sampler = Sampler(config.seed, runner.device)
        self.eos_token_ids = frozenset(model_info.eos_token_ids)
        self.live: dict[str, _Live] = {}
        self.counters = StepCounters(config.max_num_batched_tokens)
        self.inbox = Inbox(config.max_waiting_requests)
        self.wakeup = threading.Event()
        compiler = GrammarCompiler(tokenizer, model_info.vocab_size, model_info.eos_token_ids)
        self.structured = StructuredOutputs(compiler, config.max_num_seqs, self.wakeup.set)

    @classmethod
    def from_config(cls, config: EngineConfig) -> EngineCore:
        """Load the model directory `config.model` names (the default model when None)."""
        from infer.engine.loader import load_model
        from infer.engine.runner import ModelRunner, kv_cache_bytes_per_block

        model_dir = resolve_model_dir(config.model)
        model = load_model(model_dir, config)
        model_config = model.cfg
        config = config.for_model(model_config.max_position_embeddings)
        tokenizer = Tokenizer.from_dir(model_dir)
        block_bytes = kv_cache_bytes_per_block(model, config.block_size, config.torch_dtype)
        num_blocks = config.num_blocks or config.kv_cache_memory_bytes // block_bytes
        info = ModelInfo(
            model_id=model_dir.name,
            model_dir=str(model_dir),
            vocab_size=model_config.vocab_size,
            eos_token_ids=tuple(sorted(tokenizer.eos_token_ids | frozenset(model_config.eos_token_ids))),
            has_chat_template=tokenizer.chat_template is not None,
            kernels=model.kernels.name,
        )
        return cls(config, ModelRunner(model, num_blocks, config.block_size), tokenizer, info)

    # intake (thread-safe)
    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        num_prompt, max_model_len, vocab = len(prompt_token_ids), self.config.max_model_len, self.model_info.vocab_size
        check("prompt", num_prompt > 0, "must not be empty")
        check("prompt", num_prompt < max_model_len,
              f"{num_prompt} tokens exceeds max_model_len ({max_model_len}) less one token to generate")  # fmt: skip
        check("prompt_token_ids", all(0 <= t < vocab for t in prompt_token_ids), f"ids must be in [0, {vocab})")
        check("stop_token_ids", all(0 <= t < vocab for t in params.stop_token_ids), f"ids must be in [0, {vocab})")
        check("max_tokens", num_prompt + params.max_tokens <= max_model_len,
              f"prompt ({num_prompt} tokens) + max_tokens ({params.max_tokens}) exceeds "
              f"max_model_len ({max_model_len})")  # fmt: skip

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams, sink: Sink) -> None:
        """Validate and enqueue; ValueError for bad input, QueueFullError when the queue is full."""
        self.validate(prompt_token_ids, params)
        request = Request(request_id, list(prompt_token_ids), params, time.monotonic())
        if params.constraint is not None:
            request.grammar = self.structured.grammar(params.constraint)  # compiles off this thread from now
        self.inbox.add(request, sink)
        self.wakeup.set()

    def abort(self, request_id: str) -> None:
        self.inbox.abort(request_id)
        self.wakeup.set()

    def abort_now(self, request_ids: Sequence[str]) -> None:
        """Abort and end the requests before returning. Only on the thread that steps (the offline API)."""
        for request_id in request_ids:
            self.inbox.abort(request_id)
        self._take_inbox()
        self._count_waiting()

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or self.inbox.has_items or bool(self.structured.held)

    @property
    def num_queued(self) -> int:
        """Requests accepted but not yet scheduled (bounded by max_waiting_requests)."""
        return self.inbox.num_queued

    @property
    def num_steps(self) -> int:
        return self.counters.num_steps

    def _take_inbox(self) -> None:
        for item in self.inbox.take():
            if isinstance(item, str):
                if item in self.live:
                    self._finish(self.live[item], FinishReason.ABORT)
                continue
            self._admit(*item)
            self.inbox.scheduled(item[0])  # after the scheduler has it: the queued work is never missed

    def _admit(self, request: Request, sink: Sink) -> None:
        p = request.params
        generator = None
        if p.seed is not None and not p.is_greedy:
            generator = torch.Generator(device=self.runner.device)
            generator.manual_seed(p.seed)
        detok = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, p.skip_special_tokens, p.stop)
        self.live[request.request_id] = _Live(request, sink, detok, generator)
        if request.grammar is not None:
            self.structured.hold(request)  # scheduled once its grammar has compiled: it holds up no one
        else:
            self.scheduler.add(request)

    def _take_compiled(self) -> bool:
        """Requests whose grammar is done join the scheduler, or fail; True if there were any."""
        ready, failed = self.structured.take_compiled()
        for request in ready:
            self.scheduler.add(request)
        for request, error in failed:
            self.fail(request.request_id, error)
        return bool(ready or failed)

    # the step
    def step(self) -> bool:
        """One engine step; False when there was nothing to run."""
        self._take_inbox()
        has_compiled = self._take_compiled()
        out = self.scheduler.schedule(time.monotonic())
        self._count_waiting()
        if out.is_empty:
            if not has_compiled:
                self.structured.wait(0.01)  # a grammar compiling: not a busy loop (the offline API steps in one)
            return has_compiled
        started_s = time.monotonic()
        step = self._step_work(out)
        logits = self._forward(step.work)
        sampling = [rid for rid in step.sampling if rid in self.live]
        sampled = self._sample(logits[: len(sampling)] if logits is not None else None, sampling)
        self.scheduler.update(out, {rid: t for rid, (t, _) in sampled.items()})
        elapsed_s = time.monotonic() - started_s
        self.counters.record(
            StepRecord(out.total_tokens, step.num_prompt_tokens, len(sampled), len(out.preempted), elapsed_s)
        )
        for rid, (token_id, logprob) in sampled.items():
            self._postprocess(self.live[rid], token_id, logprob)
        return True

    def _count_waiting(self) -> None:
        never_scheduled = sum(1 for r in self.scheduler.waiting if r.first_scheduled_s is None)
        self.inbox.count_waiting(never_scheduled + len(self.structured.held))

    def stats(self) -> EngineStats:
        """A snapshot for metrics; safe to read from another thread (values may be one step old)."""
        sched, c = self.scheduler, self.counters
        held = list(self.structured.held.values())
        queued = sum(r.num_tokens - r.num_computed_tokens for r in (*sched.waiting, *sched.running, *held))
        return EngineStats(
            num_waiting=len(sched.waiting) + len(held) + self.inbox.num_unseen,
            num_running=len(sched.running),
            num_blocks_used=self.block_manager.num_used_blocks,
            num_blocks_free=self.block_manager.num_free_blocks,
            num_preemptions_total=c.num_preemptions_total,
            num_prompt_tokens_total=c.num_prompt_tokens_total,
            num_generation_tokens_total=c.num_generation_tokens_total,
            num_cached_tokens_total=c.num_cached_tokens_total,
            tokens_per_s=c.throughput.tokens_per_s,
            queued_tokens=queued + self.inbox.num_unseen_tokens,
        )

    def predict_ttft_s(self, num_prompt_tokens: int) -> float:
        """Time until a new request's first token, from the work queued ahead of it."""
        return self.counters.predict_ttft_s(self.stats().queued_tokens + num_prompt_tokens)

    def _step_work(self, out: SchedulerOutput) -> _StepWork:
        work: list[tuple[str, SeqWork]] = []
        sampling: list[str] = []
        num_prompt_tokens = 0
        for rid, n in out.num_scheduled_tokens.items():
            r = self.scheduler.requests[rid]
            start = r.num_computed_tokens
            needs_logits = start + n == r.num_tokens
            num_prompt_tokens += max(0, min(start + n, r.num_prompt_tokens) - start)
            table = self.block_manager.block_table(rid)
            work.append((rid, SeqWork(r.token_slice(start, start + n), start, table, needs_logits)))
            if needs_logits:
                sampling.append(rid)
        return _StepWork(work, sampling, num_prompt_tokens)

    def _forward(self, work: list[tuple[str, SeqWork]]) -> torch.Tensor | None:
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
                self.fail(rid, e)
                continue
            if w.needs_logits:
                rows.append(logits)
        return torch.cat(rows) if rows else None

    def _sample(self, logits: torch.Tensor | None, rids: list[str]) -> dict[str, tuple[int, TokenLogprob | None]]:
        if logits is None or not rids:
            return {}
        rows = [self._sampling_row(self.live[rid]) for rid in rids]
        try:
            mask = self.structured.bitmask([self.live[rid].request for rid in rids])
            out: SamplerOutput = self.sampler(logits, rows, mask)
            return {rid: (out.token_ids[i], out.logprobs[i]) for i, rid in enumerate(rids)}
        except Exception:
            logger.exception("sampling failed; retrying its requests one by one")
        result: dict[str, tuple[int, TokenLogprob | None]] = {}
        for i, rid in enumerate(rids):
            try:
                one_mask = self.structured.bitmask([self.live[rid].request])
                one = self.sampler(logits[i : i + 1], rows[i : i + 1], one_mask)
                result[rid] = (one.token_ids[0], one.logprobs[0])
            except Exception as e:
                self.fail(rid, e)
        return result

    def _sampling_row(self, live: _Live) -> SamplingRow:
        r = live.request
        banned = banned_token_ids(r, self.eos_token_ids)
        return SamplingRow(r.params, r.prompt_token_ids, r.output_token_ids, live.generator, banned)

    def _postprocess(self, live: _Live, token_id: int, logprob: TokenLogprob | None) -> None:
        try:
            self._emit_token(live, token_id, logprob)
        except Exception as e:
            self.fail(live.request.request_id, e)

    def _emit_token(self, live: _Live, token_id: int, logprob: TokenLogprob | None) -> None:
        r = live.request
        if r.first_token_s is None:
            r.first_token_s = time.monotonic()
        if r.grammar is not None and not r.grammar.accept(token_id):
            raise RuntimeError(f"token {token_id} is outside the request's {r.grammar.constraint.kind} constraint")
        logprobs = [logprob] if logprob is not None else None
        # a stop token adds no text
        text = "" if is_stop_token(token_id, r.params, self.eos_token_ids) else live.detokenizer.push([token_id])
        hit_stop_string = live.detokenizer.stopped_on is not None
        reason = finish_reason(r, token_id, hit_stop_string, self.eos_token_ids, self.config.max_model_len)
        if reason is None and r.grammar is not None and r.grammar.is_terminated:
            reason = FinishReason.STOP  # the constraint is complete
        if reason is None:
            live.sink(RequestOutput(r.request_id, [token_id], text, logprobs))
        else:
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
        if r.request_id in self.scheduler.requests:
            self.scheduler.finish(r.request_id)
        else:
            self.structured.drop(r.request_id)  # it was waiting for its grammar
        del self.live[r.request_id]
        self.inbox.done(r.request_id)
        if reason in (FinishReason.LENGTH, FinishReason.STOP) and live.detokenizer.stopped_on is None:
            text += live.detokenizer.flush()
        now = time.monotonic()
        usage = Usage(r.num_prompt_tokens, r.num_output_tokens, r.num_cached_tokens)
        self.counters.num_cached_tokens_total += r.num_cached_tokens
        timings = Timings(
            queue_s=(r.first_scheduled_s or now) - r.arrival_time_s,
            ttft_s=(r.first_token_s or now) - r.arrival_time_s,
            total_s=now - r.arrival_time_s,
            num_preemptions=r.num_preemptions,
        )
        out = RequestOutput(r.request_id, list(token_ids), text, logprobs, reason, usage, timings, error)
        live.sink(out)

    def fail(self, request_id: str, error: BaseException) -> None:
        """End one request with finish_reason `error`; the others go on."""
        logger.error("request %s failed: %r", request_id, error)
        live = self.live.get(request_id)
        if live is not None:
            self._finish(live, FinishReason.ERROR, error=f"{type(error).__name__}: {error}")

    def fail_all(self, error: BaseException) -> None:
        """End every live request with finish_reason `error` (the step loop itself failed)."""
        for request_id in list(self.live):
            self.fail(request_id, error)
