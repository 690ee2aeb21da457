"""The token-budget scheduler, and the request table: every request in the engine, by id, with its status.

There is no prefill phase and no decode phase: each request has computed
`num_computed_tokens` of its `num_tokens` and wants to catch up. A step hands
out tokens under one budget: running decodes first, then prefill chunks in
progress, then waiting requests. When a running request cannot get a
block, a running request is preempted and later recomputed. The output is
plain data; the scheduler never touches tensors.

Who goes first is the policy's choice (`SchedulingPolicy`, engine/policies/,
the one the config names): it orders the admissions, picks the running
request preempted when blocks run out, and names the running request, if
any, that yields to a waiting one with no room (sequences or KV blocks). The
scheduler tells it what it served. It holds no policy of its own.

The scheduler is the one owner of request state: `requests` is the table,
and the waiting and running queues are ordered ids into it. A request enters
with `add`, leaves with `finish` (which frees its blocks), and changes status
only here. It lives on the stepping thread: other threads read the core's
published snapshot, never these.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from infer.engine.block_manager import BlockManager
from infer.engine.config import EngineConfig
from infer.engine.policies import SchedulingPolicy, make_policy
from infer.engine.request import Request, RequestStatus

R = TypeVar("R", bound=Request)  # what the table holds: the core hangs its own companions on a request


@dataclass(frozen=True)
class SchedulerOutput:
    num_scheduled_tokens: dict[str, int]  # request id -> tokens this step, decodes first
    preempted: tuple[str, ...] = ()
    draft_token_ids: dict[str, tuple[int, ...]] = field(default_factory=dict)  # drafts among those tokens

    @property
    def total_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


@dataclass
class _Step:
    budget_tokens: int
    proposed: Mapping[str, Sequence[int]]  # the speculator's drafts, by request id
    scheduled: dict[str, int] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)
    drafts: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Admission:
    """What admitting a waiting request takes: its cached prefix, the tokens it computes now, the KV it reserves."""

    cached_blocks: list[int]
    num_cached_tokens: int
    num_tokens: int
    num_reserved_tokens: int


class Scheduler(Generic[R]):
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.config, self.blocks = config, block_manager
        self.requests: dict[str, R] = {}  # the request table
        self._waiting: deque[str] = deque()  # FCFS; a preempted request goes back first
        self._running: dict[str, None] = {}  # admission order: the last is preempted first (fcfs)
        self._unready: dict[str, None] = {}  # waiting ids whose grammar had not compiled when last looked at
        self.policy: SchedulingPolicy = make_policy(config)

    # views of the table
    @property
    def has_work(self) -> bool:
        return bool(self.requests)

    @property
    def waiting(self) -> list[R]:
        return [self.requests[rid] for rid in self._waiting]

    @property
    def running(self) -> list[R]:
        return [self.requests[rid] for rid in self._running]

    def unready(self) -> list[R]:
        """The waiting requests whose grammar is still compiling: O(those), not O(waiting), per step."""
        ready = [rid for rid in self._unready if self.requests[rid].is_ready]
        for rid in ready:
            del self._unready[rid]
        return [self.requests[rid] for rid in self._unready]

    def holds(self, request_id: str) -> bool:
        """Whether any of the scheduler's tables or queues still names the request (none does once it finished)."""
        return any(request_id in ids for ids in (self.requests, self._waiting, self._running, self._unready))

    @property
    def num_never_scheduled(self) -> int:
        """Waiting requests that never ran (a preempted one has): what the queue bound counts."""
        return sum(1 for rid in self._waiting if self.requests[rid].first_scheduled_s is None)

    @property
    def num_tokens_to_compute(self) -> int:
        """Tokens every request still has to compute: waiting prompts, prefills in progress, the next decodes."""
        return sum(r.num_tokens_to_compute for r in self.requests.values())

    # enter and leave
    def add(self, request: R) -> None:
        assert request.request_id not in self.requests, f"request {request.request_id!r} is already in the table"
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self._waiting.append(request.request_id)
        if not request.is_ready:
            self._unready[request.request_id] = None
        self.policy.enter(request)

    def finish(self, request_id: str) -> R:
        """Remove a request (finished or aborted) from the table and free its blocks."""
        request = self.requests.pop(request_id)
        # NOTE: whatever its status: a constrained request is admitted once its grammar is ready, before `unready`
        # next looks, so it may still be listed there while it runs (and finish on its first token)
        self._unready.pop(request_id, None)
        if request.status is RequestStatus.RUNNING:
            del self._running[request_id]
            self.blocks.free(request_id)
        elif request.status is RequestStatus.WAITING:
            self._waiting.remove(request_id)
        request.status = RequestStatus.FINISHED
        self.policy.leave(request)
        return request

    # the step
    def schedule(self, now_s: float, drafts: Mapping[str, Sequence[int]] | None = None) -> SchedulerOutput:
        """The step's work. `drafts`: tokens proposed to follow running decodes (the speculator's), scheduled
        with their request as far as the budget and free blocks allow (they never preempt anyone)."""
        step = _Step(self.config.max_num_batched_tokens, drafts or {})
        self._schedule_running(step)
        if not step.preempted and self._may_admit(now_s):
            self._schedule_waiting(step, now_s)
        out = SchedulerOutput(step.scheduled, tuple(step.preempted), step.drafts)
        assert out.total_tokens <= self.config.max_num_batched_tokens
        assert len(out.num_scheduled_tokens) <= self.config.max_num_seqs
        assert all(n > 0 for n in out.num_scheduled_tokens.values())
        return out

    def update(self, output: SchedulerOutput, sampled: dict[str, list[int]]) -> None:
        """Advance computed tokens after a step and append the sampled tokens. A request that verified drafts
        sampled its accepted drafts and one token more: the KV of the rejected ones is rolled back (its blocks
        past the computed tokens freed)."""
        bs = self.blocks.block_size
        for request_id, token_ids in sampled.items():
            if request_id in self.requests:
                self.requests[request_id].output_token_ids.extend(token_ids)
                self.policy.charge(self.requests[request_id], len(token_ids))  # output tokens served
        for request_id, num_tokens in output.num_scheduled_tokens.items():
            request = self.requests.get(request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue
            num_drafts = len(output.draft_token_ids.get(request_id, ()))
            num_rejected = num_drafts - max(0, len(sampled.get(request_id, ())) - 1)
            before = request.num_computed_tokens
            request.num_computed_tokens += num_tokens - num_rejected
            if num_rejected and self.config.kv_reserve == "paged":  # full: the reservation stays whole
                self.blocks.truncate(request_id, request.num_computed_tokens)
            if request.num_computed_tokens // bs > before // bs:  # a block became full
                self.blocks.cache_blocks(request_id, request.all_token_ids, request.num_computed_tokens)

    # running requests
    def _schedule_running(self, step: _Step) -> None:
        # decodes first (users are waiting), then prefill chunks in progress
        running = self.running
        decodes = [r for r in running if r.num_tokens_to_compute == 1]
        prefills = [r for r in running if r.num_tokens_to_compute > 1]
        for request in decodes + prefills:
            if step.budget_tokens == 0:
                break
            if request.status is RequestStatus.RUNNING:  # not preempted earlier in this step
                self._schedule_one(request, step)

    def _schedule_one(self, request: R, step: _Step) -> None:
        # a decode with drafts: its newest token and the drafts, as far as budget and free blocks allow
        drafts = step.proposed.get(request.request_id, ()) if request.num_tokens_to_compute == 1 else ()
        num_tokens = min(request.num_tokens_to_compute + len(drafts), step.budget_tokens)
        num_drafts = num_tokens - request.num_tokens_to_compute if drafts else 0
        if num_drafts and not self.blocks.can_append(request.request_id, request.num_computed_tokens + num_tokens):
            num_tokens, num_drafts = num_tokens - num_drafts, 0  # drafts never preempt anyone
        while not self.blocks.can_append(request.request_id, request.num_computed_tokens + num_tokens):
            victim = self.policy.victim(self.running)
            self._preempt(victim, step)
            if victim is request:
                return
        self.blocks.append(request.request_id, request.num_computed_tokens + num_tokens)
        step.scheduled[request.request_id] = num_tokens
        step.budget_tokens -= num_tokens
        if num_drafts:
            step.drafts[request.request_id] = tuple(drafts[:num_drafts])

    def _preempt(self, request: R, step: _Step) -> None:
        # free everything; the request recomputes prompt + output later, first in line
        rid = request.request_id
        step.budget_tokens += step.scheduled.pop(rid, 0)
        step.drafts.pop(rid, None)
        del self._running[rid]
        self.blocks.free(rid)
        request.status, request.num_computed_tokens = RequestStatus.WAITING, 0
        request.num_preemptions += 1
        self._waiting.appendleft(rid)
        step.preempted.append(rid)

    # waiting requests
    def _may_admit(self, now_s: float) -> bool:
        if self.config.batching == "continuous":
            return True
        # static: gather a batch (bounded wait), then admit nothing until it is done
        if self._running or not self._waiting:
            return False
        full = len(self._waiting) >= self.config.max_num_seqs
        first = self.requests[self._waiting[0]]
        return full or now_s - first.arrival_time_s >= self.config.static_batch_wait_s

    def _schedule_waiting(self, step: _Step, now_s: float) -> None:
        # in the policy's order; with no room (sequences, blocks) the running request the policy names yields,
        # until the request fits; one that cannot be admitted ends the admissions (nobody overtakes it), and one
        # that waits for budget only waits for the next step
        is_static = self.config.batching == "static"  # the whole batch at once, past the step's budget
        for request in self.policy.admission_order(self._ready_waiting()):
            admission = self._plan(request, step.budget_tokens) if step.budget_tokens or is_static else None
            while admission is not None and not self._has_room(admission):
                victim = self.policy.victim_for(request, self.running)
                if victim is None:
                    return
                self._preempt(victim, step)
                admission = self._plan(request, step.budget_tokens)
            if admission is None:
                return
            is_new = request.first_scheduled_s is None
            self._admit(request, admission, step, now_s)
            if is_new:
                self.policy.charge(request, request.num_prompt_tokens)  # prompt tokens served, once

    def _ready_waiting(self) -> Iterator[R]:
        """The waiting requests whose grammar (if any) is ready, in queue order, looked up as they are taken."""
        # NOTE: over a copy of the ids: admissions and preemptions change the queue while the policy takes them
        return (self.requests[rid] for rid in list(self._waiting) if self.requests[rid].is_ready)

    def _has_room(self, admission: _Admission) -> bool:
        return len(self._running) < self.config.max_num_seqs and self.blocks.can_allocate(
            admission.cached_blocks, admission.num_reserved_tokens
        )

    def _plan(self, request: R, budget_tokens: int) -> _Admission | None:
        """What admitting `request` would take, or None when the budget does not allow it (blocks unchecked)."""
        cfg = self.config
        cached = self.blocks.find_cached_prefix(request.all_token_ids)
        num_cached = len(cached) * self.blocks.block_size
        num_tokens = min(request.num_tokens - num_cached, budget_tokens)
        if num_tokens < request.num_tokens - num_cached and not cfg.enable_chunked_prefill:
            return None
        reserve = cfg.max_model_len if cfg.kv_reserve == "full" else num_cached + num_tokens
        return _Admission(cached, num_cached, num_tokens, reserve)

    def _admit(self, request: R, admission: _Admission, step: _Step, now_s: float) -> None:
        rid = request.request_id
        self.blocks.allocate(rid, admission.cached_blocks, admission.num_reserved_tokens)
        self._waiting.remove(rid)  # the head, unless requests ahead of it wait for their grammar
        self._running[rid] = None
        request.status, request.num_computed_tokens = RequestStatus.RUNNING, admission.num_cached_tokens
        if request.first_scheduled_s is None:
            request.first_scheduled_s, request.num_cached_tokens = now_s, admission.num_cached_tokens
        if admission.num_tokens > 0:
            step.scheduled[rid] = admission.num_tokens
            step.budget_tokens -= admission.num_tokens
