"""EngineCore: the step loop. Schedule, run one forward pass and sample it, verify drafts, then postprocess.

Each of those is one owner's call: the `Scheduler` (the request table), the `Runner` (the forward pass and
its sampling on the model's device: the core gets token ids, never logits), the `Verifier` (speculation/verifier.py:
the step's sampling rows with the grammar bitmask, then draft acceptance), the
`OutputProcessor` (grammar accept, detokenizing, stops, the deltas). The core holds the glue: requests and
aborts arrive through a thread-safe inbox and are taken in at the start of a step, outputs leave through
each request's sink, and after each step it publishes a snapshot (`EngineStats`) that other threads read
instead of the scheduler's state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import torch

from infer.engine.block_manager import BlockManager
from infer.engine.config import EngineConfig
from infer.engine.inbox import Inbox, QueueFullError
from infer.engine.input_processor import InputProcessor, ProcessedInput, Prompt
from infer.engine.interface import ModelInfo
from infer.engine.output_processor import Delta, OutputProcessor, Tokens
from infer.engine.request import FinishReason, LiveRequest, Sink
from infer.engine.runner import SeqWork
from infer.engine.sampler import SamplerOutput, SamplingBatch
from infer.engine.sampling_params import SamplingParams
from infer.engine.scheduler import Scheduler, SchedulerOutput
from infer.engine.speculation.ngram import NgramProposer
from infer.engine.speculation.speculator import Speculator
from infer.engine.speculation.verifier import Sampled, Verifier
from infer.engine.stats import EngineStats, StepCounters, StepRecord
from infer.engine.structured import Constraint, GrammarCompiler
from infer.engine.structured.manager import StructuredOutputs
from infer.engine.threads import ThreadGovernor, set_fixed_threads
from infer.engine.tokenizer import Tokenizer
from infer.engine.validation import check

if TYPE_CHECKING:
    from infer.engine.kv_events import KVEventPublisher

__all__ = ["EngineCore", "QueueFullError", "Runner", "Sink"]

logger = logging.getLogger(__name__)


class Runner(Protocol):
    """Runs one forward pass over a step's work and samples it (`ModelRunner`, or a fake in tests)."""

    @property
    def num_blocks(self) -> int: ...  # KV blocks the runner's cache holds

    @property
    def device(self) -> torch.device: ...

    def step(self, work: Sequence[SeqWork], batch: SamplingBatch) -> SamplerOutput:
        """The tokens sampled for the requests whose `needs_logits` is set, in order (`batch`: a row each)."""
        ...


@dataclass(frozen=True)
class _StepWork:
    work: list[tuple[str, SeqWork]]
    sampling: list[str]  # requests that sample this step, in work order
    num_prompt_tokens: int  # prompt tokens computed this step


class EngineCore:
    def __init__(self, config: EngineConfig, runner: Runner, tokenizer: Tokenizer, model_info: ModelInfo) -> None:
        """An engine over its parts: tests pass a fake runner; `from_config` loads the real ones."""
        check("max_model_len", config.max_model_len > 0, "must be settled for the model (EngineConfig.for_model)")
        check("num_blocks", runner.num_blocks >= config.max_blocks_per_seq,
              f"the KV pool ({runner.num_blocks} blocks) must hold one max_model_len request "
              f"({config.max_blocks_per_seq} blocks)")  # fmt: skip
        self.config, self.runner, self.tokenizer, self.model_info = config, runner, tokenizer, model_info
        self.processor = InputProcessor(tokenizer, config.max_model_len, model_info.vocab_size)
        self.kv_events = _kv_event_publisher(config, model_info.model_id)  # None: events off, no thread or socket
        self.block_manager = BlockManager(runner.num_blocks, config.block_size, config.enable_prefix_caching,
                                          self.kv_events)  # fmt: skip
        self.scheduler: Scheduler[LiveRequest] = Scheduler(config, self.block_manager)
        self.eos_token_ids = frozenset(model_info.eos_token_ids)
        self.counters = StepCounters(config.max_num_batched_tokens)
        self.inbox: Inbox[LiveRequest] = Inbox(config.max_waiting_requests, self._snapshot())
        compiler = GrammarCompiler(tokenizer, model_info.vocab_size, model_info.eos_token_ids,
                                   config.grammar_compile_budget_s, config.max_pending_grammars)  # fmt: skip
        self.structured = StructuredOutputs(compiler, config.max_num_seqs, self.inbox.wake)
        self.verifier = Verifier(self.structured, self.eos_token_ids, model_info.vocab_size)
        self.output = OutputProcessor(tokenizer, self.eos_token_ids, config.max_model_len)
        self.speculator = Speculator(
            NgramProposer(), config.speculative_tokens, config.speculative_max_num_seqs, config.max_model_len
        )
        set_fixed_threads(config, runner.device)
        self.threads: ThreadGovernor | None = None  # a server's engine follows the free cores (AsyncEngine)

    @classmethod
    def from_config(cls, config: EngineConfig) -> EngineCore:
        """Load the model directory `config.model` names (the default model when None)."""
        from infer.engine.loader import load_engine

        return cls(*load_engine(config))

    # intake (any thread)
    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams, sink: Sink) -> None:
        """Check (the input processor) and enqueue; ValueError for bad input, QueueFullError when the queue is
        full."""
        self.submit(request_id, self.processor.process(Prompt(token_ids=prompt_token_ids), params), sink)

    def submit(self, request_id: str, processed: ProcessedInput, sink: Sink, tenant: str | None = None) -> None:
        """Enqueue a request the input processor checked (nothing is checked again); QueueFullError when the
        queue is full. `tenant`: who asks, as the caller named it (None: the default tenant)."""
        ids, params = processed.prompt_token_ids, processed.params
        detokenizer = self.output.detokenizer(ids, params)
        request = LiveRequest(request_id, list(ids), params, time.monotonic(), sink=sink, detokenizer=detokenizer)
        if tenant is not None:
            request.tenant = tenant
        if params.constraint is not None:
            request.grammar = self.structured.grammar(params.constraint)  # compiles off this thread from now
        try:
            self.inbox.add(request)
        except BaseException:
            self.structured.release(request)
            raise

    def compile_constraint(self, constraint: Constraint) -> Future[Any]:
        """Compile (thread-safe, cached, off the step thread); `release_constraint` the future when no longer
        waiting for it. QueueFullError when the compile queue is full."""
        return self.structured.compiler.submit(constraint)

    def release_constraint(self, future: Future[Any]) -> None:
        """The caller of `compile_constraint` no longer waits: a compile no one waits for is dropped."""
        self.structured.compiler.release(future)

    def abort(self, request_id: str) -> None:
        """End the request at the next step (finish_reason abort); an id not in flight is ignored."""
        self.inbox.abort(request_id)

    def stats(self) -> EngineStats:
        """The snapshot published after the last step, with the requests not yet taken in counted as waiting,
        and the grammar compiles as they are now. Safe on any thread: it never reads the scheduler."""
        c = self.structured.compiler.stats
        return replace(self.inbox.stats(), num_grammars_pending=c.num_pending,
                       num_grammars_compiled_total=c.num_compiled_total, num_grammars_refused_total=c.num_refused_total,
                       grammar_compile_s_total=c.compile_s_total)  # fmt: skip

    def predict_ttft_s(self, num_prompt_tokens: int) -> float:
        """Time until a new request's first token, from the work queued ahead of it."""
        return self.stats().predict_ttft_s(num_prompt_tokens)

    @property
    def num_queued(self) -> int:
        """Requests accepted but not yet scheduled (bounded by max_waiting_requests)."""
        return self.inbox.num_queued

    @property
    def num_steps(self) -> int:
        return self.stats().num_steps

    def is_in_flight(self, request_id: str) -> bool:
        """Whether the request was accepted and has not ended (its final output is sent when it ends)."""
        return self.inbox.is_in_flight(request_id)

    def wake(self) -> None:
        """Make `wait_for_work` return now (to stop the thread that steps)."""
        self.inbox.wake()

    # the thread that steps
    def wait_for_work(self, timeout_s: float | None = None) -> None:
        """After a step that ran nothing: block until a request or an abort arrives, or `wake`, or timeout_s.
        Requests that wait (a static batch still gathering) are polled every half static_batch_wait_s."""
        poll_s = self.config.static_batch_wait_s / 2 if self.scheduler.waiting else None
        timeouts = [t for t in (poll_s, timeout_s) if t is not None]
        self.inbox.wait(min(timeouts) if timeouts else None)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or self.inbox.has_items

    def step(self) -> bool:
        """One engine step; False when there was nothing to run."""
        self._take_inbox()
        has_compiled = self._take_compiled()
        started_s = time.monotonic()  # a step's busy time counts its drafting and scheduling too
        running = self.scheduler.running
        drafts = self.speculator.drafts(running, [r.spec for r in running])
        out = self.scheduler.schedule(started_s, drafts)
        if not out.is_empty:
            if self.threads is not None:
                self.threads.tick()
            self._run(out, started_s)
        elif not has_compiled:  # a grammar compiling: not a busy loop (the offline API steps in one)
            self.structured.wait(self._compiling(), 0.01)
        self._publish()
        return not out.is_empty or has_compiled

    def abort_now(self, request_ids: Sequence[str]) -> None:
        """Abort and end the requests before returning. Only on the thread that steps (the offline API)."""
        for request_id in request_ids:
            self.inbox.abort(request_id)
        self._take_inbox()
        self._publish()

    def _take_inbox(self) -> None:
        new, aborts = self.inbox.take()
        for request in new:
            request.generator = self._generator(request.params)
            request.spec = self.speculator.new_state(request)
            self.scheduler.add(request)  # a constrained one is scheduled once its grammar has compiled
        for request_id in aborts:  # after the new requests: an abort may name one of them
            aborted = self.scheduler.requests.get(request_id)
            if aborted is not None:
                self._finish(aborted, FinishReason.ABORT)

    def _take_compiled(self) -> bool:
        """Requests whose grammar is done get their matcher (the scheduler may now admit them), or fail;
        True if there were any."""
        ready, failed = self.structured.take_compiled(self._compiling())
        for request, error in failed:
            self.fail(request.request_id, error)
        return bool(ready or failed)

    def _compiling(self) -> list[LiveRequest]:
        """The requests whose grammar is compiling: the scheduler's waiting ones that are not ready."""
        return self.scheduler.unready()

    def _generator(self, params: SamplingParams) -> torch.Generator | None:
        if params.seed is None or params.is_greedy:
            return None
        generator = torch.Generator(device=self.runner.device)
        generator.manual_seed(params.seed)
        return generator

    def _publish(self) -> None:
        if self.kv_events is not None:
            self.kv_events.end_step()  # this step's KV-cache events, as one batch
        self.inbox.publish(self._snapshot())

    def _snapshot(self) -> EngineStats:
        sched, blocks, c, graphs = self.scheduler, self.block_manager, self.counters, self.model_info.cuda_graphs
        return EngineStats(
            num_waiting=len(sched.waiting),
            num_running=len(sched.running),
            num_blocks_used=blocks.num_used_blocks,
            num_blocks_free=blocks.num_free_blocks,
            num_preemptions_total=c.num_preemptions_total,
            num_prompt_tokens_total=c.num_prompt_tokens_total,
            num_generation_tokens_total=c.num_generation_tokens_total,
            num_draft_tokens_total=c.num_draft_tokens_total,
            num_accepted_tokens_total=c.num_accepted_tokens_total,
            num_cached_tokens_total=c.num_cached_tokens_total,
            tokens_per_s=c.throughput.tokens_per_s,
            queued_tokens=sched.num_tokens_to_compute,
            cpu_threads=torch.get_num_threads() if self.runner.device.type == "cpu" else 0,
            num_queued=sched.num_never_scheduled,
            prefill_tokens_per_s=c.prefill_throughput.tokens_per_s,
            num_steps=c.num_steps,
            step_s_total=c.step_s_total,
            num_kv_events_dropped_total=self.kv_events.num_dropped if self.kv_events is not None else 0,
            num_kv_replays_refused_total=self.kv_events.num_replays_refused if self.kv_events is not None else 0,
            num_tenants_tracked=sched.policy.num_tenants,
            cuda_graphs=len(graphs.sizes),
            cuda_graph_capture_s=graphs.capture_s,
            cuda_graph_memory_bytes=graphs.memory_bytes,
        )

    def _run(self, out: SchedulerOutput, started_s: float) -> None:
        """Run the scheduled work: forward, sample, advance the scheduler, then stream each request's delta.
        `started_s`: when the step began (before drafting and scheduling)."""
        step = self._step_work(out)
        sampled = self._execute(step, out.draft_token_ids)
        self.scheduler.update(out, {rid: [t for t, _ in tokens] for rid, tokens in sampled.items()})
        self._record(out, step, sampled, time.monotonic() - started_s)
        for rid, tokens in sampled.items():
            self._postprocess(self.scheduler.requests[rid], tokens)

    def _record(self, out: SchedulerOutput, step: _StepWork, sampled: Sampled, elapsed_s: float) -> None:
        num_drafts = sum(len(out.draft_token_ids.get(rid, ())) for rid in sampled)
        num_tokens = sum(len(tokens) for tokens in sampled.values())
        num_accepted_drafts = num_tokens - len(sampled)  # one token a request is not a draft
        record = StepRecord(out.total_tokens, step.num_prompt_tokens, num_tokens, len(out.preempted), elapsed_s)
        self.counters.record(replace(record, num_draft_tokens=num_drafts, num_accepted_tokens=num_accepted_drafts))

    def _step_work(self, out: SchedulerOutput) -> _StepWork:
        work: list[tuple[str, SeqWork]] = []
        sampling: list[str] = []
        num_prompt_tokens = 0
        for rid, n in out.num_scheduled_tokens.items():
            r = self.scheduler.requests[rid]
            start, drafts = r.num_computed_tokens, out.draft_token_ids.get(rid, ())
            needs_logits = start + n - len(drafts) == r.num_tokens
            num_prompt_tokens += max(0, min(start + n, r.num_prompt_tokens) - start)
            table = self.block_manager.block_table(rid)
            token_ids = r.token_slice(start, start + n - len(drafts)) + list(drafts)
            work.append((rid, SeqWork(token_ids, start, table, needs_logits, 1 + len(drafts))))
            if needs_logits:
                sampling.append(rid)
        return _StepWork(work, sampling, num_prompt_tokens)

    def _execute(self, step: _StepWork, drafts: dict[str, tuple[int, ...]]) -> Sampled:
        """Run the step and verify its drafts: each sampling request's new tokens. When the step fails, each
        request is run alone: the ones that fail alone fail, the others go on."""
        requests = self.scheduler.requests
        plan = self.verifier.plan([requests[rid] for rid in step.sampling], drafts)
        try:
            return self.verifier.accept(plan, self.runner.step([w for _, w in step.work], plan.batch))
        except Exception:
            logger.exception("a step failed; retrying its requests one by one")
        sampled: Sampled = {}
        for rid, w in step.work:
            r = requests.get(rid)
            if r is None:
                continue
            try:
                if not w.needs_logits:
                    self.runner.step([w], SamplingBatch([]))
                    continue
                alone = self.verifier.alone(plan, r)
                sampled |= self.verifier.accept(alone, self.runner.step([w], alone.batch))
            except Exception as e:
                self.fail(rid, e)
        return sampled

    def _postprocess(self, r: LiveRequest, tokens: Tokens) -> None:
        """Stream the step's delta of one request, or end it (the output processor decides)."""
        try:
            delta = self.output.process(r, tokens)
            if delta.finish_reason is None:
                r.sink(self.output.delta(r, delta))
            else:
                self._finish(r, delta.finish_reason, delta)
        except Exception as e:
            self.fail(r.request_id, e)

    def _finish(
        self, r: LiveRequest, reason: FinishReason, delta: Delta | None = None, error: str | None = None
    ) -> None:
        self.scheduler.finish(r.request_id)  # out of the table, its blocks freed
        self._end(r, reason, delta, error)

    def _end(self, r: LiveRequest, reason: FinishReason, delta: Delta | None = None, error: str | None = None) -> None:
        """Send the final output of a request the scheduler no longer holds."""
        self.structured.release(r)  # if its grammar was still compiling
        self.inbox.release(r.request_id)  # its id may be used again
        self.counters.num_cached_tokens_total += r.num_cached_tokens
        r.sink(self.output.final(r, reason, delta, error))

    def fail(self, request_id: str, error: BaseException) -> None:
        """End one request with finish_reason `error`; the others go on."""
        logger.error("request %s failed: %r", request_id, error)
        request = self.scheduler.requests.get(request_id)
        if request is not None:
            self._finish(request, FinishReason.ERROR, error=f"{type(error).__name__}: {error}")

    def close(self) -> None:
        """Close what the core opened beside the model (the KV-cache events publisher), once its thread stops."""
        if self.kv_events is not None:
            self.kv_events.close()

    def fail_all(self, error: BaseException) -> None:
        """End every request with finish_reason `error` (the step loop itself failed: the caller logs that once,
        not once a request)."""
        message = f"{type(error).__name__}: {error}"
        for request in list(self.scheduler.requests.values()):
            self._finish(request, FinishReason.ERROR, error=message)
        new, _ = self.inbox.take()  # NOTE: a step that raises before it takes them in would strand them
        for request in new:
            self._end(request, FinishReason.ERROR, error=message)
        self._publish()


def _kv_event_publisher(config: EngineConfig, model_id: str) -> KVEventPublisher | None:
    if not config.kv_events:
        return None
    from infer.engine.kv_events import KVEventPublisher, topic  # NOTE: zmq is imported only when events are on

    name = topic(config.kv_events_pod_id, model_id)
    return KVEventPublisher(config.kv_events_endpoint, config.kv_events_replay_endpoint, name, config.block_size)
