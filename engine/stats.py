"""Engine counters and gauges for metrics, and the time-to-first-token estimate for admission."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    """The engine after a step, as metrics, health and admission see it: a plain snapshot, safe on any thread."""

    num_waiting: int  # requests accepted and not yet running (pending aborts are not requests)
    num_running: int
    num_blocks_used: int
    num_blocks_free: int
    num_preemptions_total: int
    num_prompt_tokens_total: int  # computed prompt tokens (prefix-cache hits excluded)
    num_generation_tokens_total: int
    num_cached_tokens_total: int  # prompt tokens served from the prefix cache
    tokens_per_s: float  # recent forward-pass throughput (0 before the first step)
    queued_tokens: int  # tokens still to compute: requests not yet scheduled, waiting and prefilling
    num_queued: int = 0  # of the waiting requests, those never scheduled (what max_waiting_requests bounds)
    prefill_tokens_per_s: float = 0.0  # recent prompt throughput of steps busy with prefill (0 until one ran)
    num_steps: int = 0  # forward passes so far
    step_s_total: float = 0.0  # the steps' time: drafting, scheduling, forward, sampling, the update (busy, not idle)
    num_draft_tokens_total: int = 0  # speculative drafts verified
    num_accepted_tokens_total: int = 0  # of which accepted
    num_grammars_pending: int = 0  # grammar compiles queued or running (what max_pending_grammars bounds)
    num_grammars_compiled_total: int = 0  # grammar compiles run, whatever their outcome
    num_grammars_refused_total: int = 0  # constraints refused for what compiling them costs
    grammar_compile_s_total: float = 0.0  # the compiles' time (their trial in the worker process included)
    cpu_threads: int = 0  # CPU threads the steps run on now (engine/threads.py; 0 on a GPU)
    num_kv_events_dropped_total: int = 0  # KV-cache events dropped unsent (the publisher thread fell behind)
    num_kv_replays_refused_total: int = 0  # KV-event replay requests refused past the bounds, or cut (kv_replay.py)
    num_tenants_tracked: int = 0  # tenants in the fair policy's table (bounded: max_tenants and the queue)
    cuda_graphs: int = 0  # decode batch sizes replayed from CUDA graphs captured at start (cuda_graphs.py)
    cuda_graph_capture_s: float = 0.0  # the capture's time at start
    cuda_graph_memory_bytes: int = 0  # the graphs' memory pool on the device

    @property
    def draft_acceptance_rate(self) -> float:
        """Accepted / verified drafts so far; 0 before any."""
        return self.num_accepted_tokens_total / self.num_draft_tokens_total if self.num_draft_tokens_total else 0.0

    def predict_ttft_s(self, num_prompt_tokens: int) -> float:
        """Seconds until a new request's first token: the queued tokens and its own, at the prefill rate once
        measured (the rate of all tokens is that of decode steps, one token per request per step, and far
        lower); 0 before anything was measured."""
        rate = self.prefill_tokens_per_s or self.tokens_per_s
        return (self.queued_tokens + num_prompt_tokens) / rate if rate > 0 else 0.0


class ThroughputMeter:
    """Exponential moving average of tokens per second over engine steps."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha, self.tokens_per_s = alpha, 0.0

    def record(self, num_tokens: int, elapsed_s: float) -> None:
        if elapsed_s <= 0:
            return
        rate = num_tokens / elapsed_s
        self.tokens_per_s = rate if self.tokens_per_s == 0 else (1 - self.alpha) * self.tokens_per_s + self.alpha * rate


@dataclass(frozen=True)
class StepRecord:
    """What one engine step did, for the counters."""

    num_tokens: int  # every token of the forward pass
    num_prompt_tokens: int  # of which prompt tokens
    num_sampled: int
    num_preempted: int
    elapsed_s: float
    num_draft_tokens: int = 0  # speculative drafts verified
    num_accepted_tokens: int = 0  # of which accepted


class StepCounters:
    """Totals and rates over the engine's steps."""

    def __init__(self, max_num_batched_tokens: int) -> None:
        self.throughput = ThroughputMeter()  # all tokens of every step
        self.prefill_throughput = ThroughputMeter()  # prompt tokens, over steps busy with prefill
        self.min_prefill_tokens = max_num_batched_tokens // 4  # a step "busy with prefill" computes this many
        self.num_steps = self.num_preemptions_total = 0
        self.step_s_total = 0.0
        self.num_prompt_tokens_total = self.num_generation_tokens_total = self.num_cached_tokens_total = 0
        self.num_draft_tokens_total = self.num_accepted_tokens_total = 0

    def record(self, step: StepRecord) -> None:
        self.num_steps += 1
        self.step_s_total += step.elapsed_s
        self.throughput.record(step.num_tokens, step.elapsed_s)
        if step.num_prompt_tokens >= self.min_prefill_tokens:
            self.prefill_throughput.record(step.num_prompt_tokens, step.elapsed_s)
        self.num_prompt_tokens_total += step.num_prompt_tokens
        self.num_generation_tokens_total += step.num_sampled
        self.num_preemptions_total += step.num_preempted
        self.num_draft_tokens_total += step.num_draft_tokens
        self.num_accepted_tokens_total += step.num_accepted_tokens
