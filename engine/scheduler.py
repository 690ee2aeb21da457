"""The token-budget scheduler.

There is no prefill phase and no decode phase: each request has computed
`num_computed_tokens` of its `num_tokens` and wants to catch up. A step hands
out tokens under one budget: running decodes first, then prefill chunks in
progress, then waiting requests FCFS. When a running request cannot get a
block, the most recently admitted running request is preempted and later
recomputed. The output is plain data; the scheduler never touches tensors.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from infer.engine.block_manager import BlockManager
from infer.engine.config import EngineConfig
from infer.engine.request import Request, RequestStatus


@dataclass(frozen=True)
class SchedulerOutput:
    num_scheduled_tokens: dict[str, int]  # request id -> tokens this step, decodes first
    preempted: tuple[str, ...] = ()

    @property
    def total_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


@dataclass
class _Step:
    budget_tokens: int
    scheduled: dict[str, int] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.config, self.blocks = config, block_manager
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish(self, request_id: str) -> Request:
        """Remove a request (finished or aborted) and free its blocks."""
        request = self.requests.pop(request_id)
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
            self.blocks.free(request_id)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
        return request

    def schedule(self, now_s: float) -> SchedulerOutput:
        step = _Step(self.config.max_num_batched_tokens)
        # decodes first (users are waiting), then prefill chunks in progress
        decodes = [r for r in self.running if r.num_tokens - r.num_computed_tokens == 1]
        prefills = [r for r in self.running if r.num_tokens - r.num_computed_tokens > 1]
        for request in decodes + prefills:
            if step.budget_tokens == 0:
                break
            if request.status is RequestStatus.RUNNING:
                self._schedule_running(request, step)
        if not step.preempted and self._may_admit(now_s):
            self._admit(step, now_s)
        out = SchedulerOutput(step.scheduled, tuple(step.preempted))
        assert out.total_tokens <= self.config.max_num_batched_tokens
        assert len(out.num_scheduled_tokens) <= self.config.max_num_seqs
        assert all(n > 0 for n in out.num_scheduled_tokens.values())
        return out

    def update(self, output: SchedulerOutput, sampled: dict[str, int]) -> None:
        """Advance computed tokens after a step, and append the sampled tokens."""
        for request_id, num_tokens in output.num_scheduled_tokens.items():
            request = self.requests.get(request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue
            before = request.num_computed_tokens
            request.num_computed_tokens += num_tokens
            bs = self.blocks.block_size
            if request.num_computed_tokens // bs > before // bs:  # a block became full
                self.blocks.cache_blocks(request_id, request.all_token_ids, request.num_computed_tokens)
        for request_id, token_id in sampled.items():
            if request_id in self.requests:
                self.requests[request_id].output_token_ids.append(token_id)

    def _schedule_running(self, request: Request, step: _Step) -> None:
        num_tokens = min(request.num_tokens - request.num_computed_tokens, step.budget_tokens)
        while not self.blocks.can_append(request.request_id, request.num_computed_tokens + num_tokens):
            victim = self.running[-1]
            self._preempt(victim, step)
            if victim is request:
                return
        self.blocks.append(request.request_id, request.num_computed_tokens + num_tokens)
        step.scheduled[request.request_id] = num_tokens
        step.budget_tokens -= num_tokens

    def _preempt(self, request: Request, step: _Step) -> None:
        # free everything; the request recomputes prompt + output later, first in line
        step.budget_tokens += step.scheduled.pop(request.request_id, 0)
        self.running.remove(request)
        self.blocks.free(request.request_id)
        request.status, request.num_computed_tokens = RequestStatus.WAITING, 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)
        step.preempted.append(request.request_id)

    def _may_admit(self, now_s: float) -> bool:
        if self.config.batching == "continuous":
            return True
        # static: gather a batch (bounded wait), then admit nothing until it is done
        if self.running or not self.waiting:
            return False
        full = len(self.waiting) >= self.config.max_num_seqs
        return full or now_s - self.waiting[0].arrival_time_s >= self.config.static_batch_wait_s

    def _admit(self, step: _Step, now_s: float) -> None:
        cfg, is_static = self.config, self.config.batching == "static"
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            if step.budget_tokens == 0 and not is_static:
                break
            request = self.waiting[0]
            cached = self.blocks.find_cached_prefix(request.all_token_ids)
            num_cached = len(cached) * self.blocks.block_size
            num_tokens = min(request.num_tokens - num_cached, step.budget_tokens)
            if num_tokens < request.num_tokens - num_cached and not cfg.enable_chunked_prefill:
                break
            reserve = cfg.max_model_len if cfg.kv_reserve == "full" else num_cached + num_tokens
            if not self.blocks.can_allocate(cached, reserve):
                break
            self.blocks.allocate(request.request_id, cached, reserve)
            self.waiting.popleft()
            self.running.append(request)
            request.status, request.num_computed_tokens = RequestStatus.RUNNING, num_cached
            if request.first_scheduled_s is None:
                request.first_scheduled_s, request.num_cached_tokens = now_s, num_cached
            if num_tokens > 0:
                step.scheduled[request.request_id] = num_tokens
                step.budget_tokens -= num_tokens
