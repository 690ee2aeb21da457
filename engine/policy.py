"""Who goes first when not everyone fits: the `priority` and `fair` scheduling policies (`fcfs` needs none).

Every request has a standing, fixed when it arrives: `arrival_time_s + priority * priority_aging_s` (lower is
sooner). So one priority level is worth `priority_aging_s` seconds of waiting, the order of two requests never
changes while they wait or run (a preempted request keeps its place, and two requests cannot preempt each
other back and forth), and a request is outranked by no request that arrives more than
`(priority - MIN_PRIORITY) * priority_aging_s` after it: the aging bound.

`fair` serves tenants first (weighted fair share: the Virtual Token Counter of Sheng et al., "Fairness in
Serving Large Language Models", OSDI 2024), then by standing within a tenant. Each tenant's counter is the
service it received, divided by its weight: a prompt's tokens when the request is first admitted, each output
token when it is sampled (recomputing after a preemption is not service). The active tenant (one with a
request in the engine) with the lowest counter goes first. A tenant that becomes active is lifted to no lower
than the lowest counter of the active tenants less `max_model_len` weighted tokens (to the highest known when none
is active): it is owed at most one longest request's service for the time it was away (the bound of VTC's
analysis), never all it missed. A running request yields to a waiting one of another tenant when its tenant's
counter is ahead by at least all the service the waiting request can receive (its prompt and max_tokens,
weighted: its worth): so a light tenant behind a heavy one gets a seat at once, and the two cannot preempt each
other back and forth (the admitted request, served in full, leaves its tenant no further ahead).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import TypeVar

from infer.engine.config import EngineConfig
from infer.engine.request import Request
from infer.engine.sampling_params import MAX_PRIORITY, MIN_PRIORITY

__all__ = ["MAX_PRIORITY", "MIN_PRIORITY", "Policy"]

R = TypeVar("R", bound=Request)


class Policy:
    """The `priority` or `fair` policy's choices for the scheduler: the admission order, the running request that
    yields, and whether it yields to a given waiting request. Lives on the stepping thread, like the scheduler."""

    def __init__(self, config: EngineConfig) -> None:
        self.is_fair = config.scheduling_policy == "fair"
        self.aging_s = config.priority_aging_s
        self.max_model_len, self.max_num_seqs = config.max_model_len, config.max_num_seqs
        self.weights = dict(config.tenant_weights)
        self.counters: dict[str, float] = {}  # tenant -> weighted tokens served (active tenants, and some past)
        self.num_active: dict[str, int] = {}  # tenant -> its requests in the engine
        self.idle_level = 0.0  # the highest counter when the engine last went idle: where a newcomer starts then

    # standing
    def standing(self, request: Request) -> float:
        """Lower is sooner; fixed for the request's life."""
        return request.arrival_time_s + request.params.priority * self.aging_s

    def rank(self, request: Request) -> tuple[float, float]:
        """Lower is more deserving: the tenant's counter (fair), then the standing."""
        counter = self.counters[request.tenant] if self.is_fair else 0.0
        return counter, self.standing(request)

    # the scheduler's questions
    def admission_order(self, waiting: Sequence[R]) -> Iterator[R]:
        """Waiting requests, most deserving first. Under fair, lazily: each admission charges its tenant, so the
        next one is chosen with the counters as they are then."""
        ordered = sorted(waiting, key=self.standing)[::-1]  # best last, popped first; ties in queue order
        if not self.is_fair:
            while ordered:
                yield ordered.pop()
            return
        by_tenant: dict[str, list[R]] = {}
        for request in ordered:
            by_tenant.setdefault(request.tenant, []).append(request)
        while by_tenant:
            tenant = min(by_tenant, key=lambda t: self.rank(by_tenant[t][-1]))
            queue = by_tenant[tenant]
            yield queue.pop()
            if not queue:
                del by_tenant[tenant]

    def victim(self, running: Sequence[R]) -> R:
        """The least deserving running request (of equals, the last admitted): the one to preempt."""
        return max(reversed(running), key=self.rank)

    def victim_for(self, waiting: Request, running: Sequence[R]) -> R | None:
        """The least deserving running request that yields to `waiting`, if any does."""
        seats = Counter(r.tenant for r in running) if self.is_fair else Counter[str]()
        yielding = [r for r in running if self.may_preempt(waiting, r, seats)]
        return self.victim(yielding) if yielding else None

    def may_preempt(self, waiting: Request, running: Request, seats: Counter[str]) -> bool:
        """Whether `running` yields its place to `waiting`; `seats`: the running requests of each tenant (fair)."""
        if self.is_fair and waiting.tenant != running.tenant:
            below = seats[waiting.tenant] < self.seat_share(waiting.tenant)  # (its running sequences)
            above = seats[running.tenant] > self.seat_share(running.tenant)
            behind = self.counters[running.tenant] - self.counters[waiting.tenant] >= self.worth(waiting)
            return below and above and behind
        return self.standing(waiting) < self.standing(running)

    # tenants' service (fair)
    def credit(self, tenant: str) -> float:
        """The most service a tenant can be owed when it becomes active: `max_model_len` tokens, weighted."""
        return self.max_model_len / self.weights.get(tenant, 1.0)

    def seat_share(self, tenant: str) -> float:
        """The tenant's share of the engine's sequences by weight, among the active tenants."""
        total = sum(self.weights.get(t, 1.0) for t in self.num_active)
        return self.max_num_seqs * self.weights.get(tenant, 1.0) / total

    def worth(self, request: Request) -> float:
        """The most service `request` can receive in its life, weighted: its prompt and every token it may
        generate."""
        max_tokens = request.params.max_tokens or self.max_model_len - request.num_prompt_tokens
        return (request.num_prompt_tokens + max_tokens) / self.weights.get(request.tenant, 1.0)

    def enter(self, request: Request) -> None:
        """A request joins the engine: a tenant that was not active is lifted to the active minimum less its
        credit (if it was lower)."""
        if not self.is_fair:
            return
        tenant = request.tenant
        if self.num_active.get(tenant, 0) == 0:
            active = [self.counters[t] for t in self.num_active]
            floor = min(active) - self.credit(tenant) if active else self.idle_level
            self.counters[tenant] = max(self.counters.get(tenant, floor), floor)
        self.num_active[tenant] = self.num_active.get(tenant, 0) + 1

    def leave(self, request: Request) -> None:
        """A request left the engine (finished, aborted or failed)."""
        if not self.is_fair:
            return
        tenant = request.tenant
        self.num_active[tenant] -= 1
        if self.num_active[tenant] == 0:
            del self.num_active[tenant]
            self._forget()

    def charge(self, request: Request, num_tokens: int) -> None:
        """The request's tenant was served `num_tokens` (prompt or output tokens)."""
        if self.is_fair:
            self.counters[request.tenant] += num_tokens / self.weights.get(request.tenant, 1.0)

    def _forget(self) -> None:
        # NOTE: an inactive tenant at or below the active minimum would be lifted to it on return anyway: drop it,
        # so the table holds the active tenants and the few ahead of them, not every tenant ever seen
        if not self.num_active:
            self.idle_level = max(self.counters.values(), default=self.idle_level)
            self.counters = {}
            return
        floor = min(self.counters[t] for t in self.num_active)
        self.counters = {t: c for t, c in self.counters.items() if t in self.num_active or c > floor - self.credit(t)}
