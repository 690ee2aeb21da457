"""`fair`: weighted fair share across tenants, then by standing within a tenant (the `priority` policy's).

The Virtual Token Counter of Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024. Each
tenant's counter is the service it received, divided by its weight: a prompt's tokens when the request is first
admitted, each output token when it is sampled (recomputing after a preemption is not service). The active
tenant (one with a request in the engine) with the lowest counter goes first. A tenant that becomes active starts
no lower than the lowest counter of the active tenants (the virtual time, as in start-time fair queuing): where a
tenant that has been waiting all along stands, so a new name, or one back from an absence, is owed nothing for
the time it was away and outranks no one (of equal counters, the earlier request goes first). A running request
yields to a waiting one of another tenant when its tenant's counter is ahead by at least all the service the
waiting request can receive (its prompt and max_tokens, weighted: its worth): so a light tenant behind a heavy one
gets a seat as soon as the heavy one has been served that much more, and the two cannot preempt each other back
and forth (the admitted request, served in full, leaves its tenant no further ahead).

The tenants' table is bounded and kept incrementally: O(log n) a request entering, leaving or being served. An
idle tenant at or below the virtual time is forgotten (it would start there anyway); past `max_tenants` tenants,
the idle ones with the lowest counters are forgotten first (each forgiven only its lead on the virtual time);
when the engine empties, every tenant is. Only tenants with requests in the engine (bounded by the queue) can
hold the table above `max_tenants`.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence

from infer.engine.policies.base import PolicySettings, R
from infer.engine.policies.priority import Priority
from infer.engine.request import Request


class _TenantHeap:
    """Tenants by counter, lowest first. A tenant is filed at its counter then; an entry filed lower than the
    tenant's counter is now (it was served since) is refiled when it surfaces, and a dropped one is skipped, so
    filing, dropping and finding the lowest are O(log n), amortized over the counters' updates."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []  # (counter when filed, filing number, tenant)
        self._live: dict[str, int] = {}  # tenant -> the filing number of its live entry
        self._num_filed = 0

    def __len__(self) -> int:
        return len(self._live)

    def file(self, tenant: str, counter: float) -> None:
        self._num_filed += 1
        self._live[tenant] = self._num_filed
        heapq.heappush(self._heap, (counter, self._num_filed, tenant))
        self._compact()

    def drop(self, tenant: str) -> None:
        if self._live.pop(tenant, None) is not None:
            self._compact()

    def lowest(self, counters: Mapping[str, float]) -> tuple[str, float] | None:
        """The tenant with the lowest counter in `counters` (each filed at or below its counter), and that counter."""
        heap = self._heap
        while heap:
            filed, number, tenant = heap[0]
            if self._live.get(tenant) != number:
                heapq.heappop(heap)  # dropped or refiled
            elif counters[tenant] != filed:
                heapq.heapreplace(heap, (counters[tenant], number, tenant))  # served since it was filed
            else:
                return tenant, filed
        return None

    def clear(self) -> None:
        self._heap, self._live = [], {}

    def _compact(self) -> None:
        # NOTE: dead entries at most as many as live ones (plus a few): the heap stays O(tenants filed)
        if len(self._heap) > 2 * len(self._live) + 64:
            self._heap = [e for e in self._heap if self._live.get(e[2]) == e[1]]
            heapq.heapify(self._heap)


class Fair(Priority):
    """Tenants by weighted service, then requests by standing; a tenant ahead yields seats to one behind."""

    def __init__(self, settings: PolicySettings) -> None:
        super().__init__(settings)
        self.max_model_len, self.max_num_seqs = settings.max_model_len, settings.max_num_seqs
        self.max_tenants = settings.max_tenants
        self.weights = dict(settings.tenant_weights)
        self.counters: dict[str, float] = {}  # tenant -> weighted tokens served (the active, and idle ones ahead)
        self.num_active: dict[str, int] = {}  # tenant -> its requests in the engine
        self._active, self._idle = _TenantHeap(), _TenantHeap()  # the counters' tenants, by counter
        self._num_plain_active = 0  # active tenants that weigh 1 (not in `weights`)
        self._num_weighted_active, self._weighted_active = 0, 0.0  # the other active tenants, and their weights

    def rank(self, request: Request) -> tuple[float, ...]:
        """Lower is more deserving: the tenant's counter, then the standing."""
        return self.counters[request.tenant], self.standing(request)

    # the scheduler's questions
    def admission_order(self, waiting: Iterable[R]) -> Iterator[R]:
        """Most deserving first (of equals, in queue order). Lazily: each admission charges its tenant, so the
        next one is chosen with the counters as they are then. O(waiting) to start, O(log waiting) a request
        taken."""
        counters, aging_s = self.counters, self.aging_s
        # NOTE: the rank inlined: this runs over every waiting request every step
        queue = [(counters[r.tenant], r.arrival_time_s + r.params.priority * aging_s, i, r)
                 for i, r in enumerate(waiting)]  # fmt: skip
        heapq.heapify(queue)  # ties in queue order
        while queue:
            counter, standing, i, request = queue[0]
            if counters[request.tenant] != counter:  # its tenant was admitted and charged since
                heapq.heapreplace(queue, (counters[request.tenant], standing, i, request))
                continue
            heapq.heappop(queue)
            yield request

    def victim_for(self, waiting: Request, running: Sequence[R]) -> R | None:
        seats = Counter(r.tenant for r in running)
        yielding = [r for r in running if self.may_preempt(waiting, r, seats)]
        return self.victim(yielding) if yielding else None

    def may_preempt(self, waiting: Request, running: Request, seats: Counter[str]) -> bool:
        """Whether `running` yields its place to `waiting`; `seats`: the running requests of each tenant."""
        if waiting.tenant == running.tenant:
            return self.outranks(waiting, running)
        below = seats[waiting.tenant] < self.seat_share(waiting.tenant)  # (its running sequences)
        above = seats[running.tenant] > self.seat_share(running.tenant)
        behind = self.counters[running.tenant] - self.counters[waiting.tenant] >= self.worth(waiting)
        return below and above and behind

    # what the scheduler tells it
    def enter(self, request: Request) -> None:
        """A tenant that was not active starts at the virtual time, or above it where its counter still is (the
        lead it had when it left)."""
        tenant = request.tenant
        if tenant not in self.num_active:
            start = self.virtual_time()
            self._idle.drop(tenant)
            self.counters[tenant] = max(self.counters.get(tenant, start), start)
            self._active.file(tenant, self.counters[tenant])
            self._count_weight(tenant, 1)
        self.num_active[tenant] = self.num_active.get(tenant, 0) + 1

    def leave(self, request: Request) -> None:
        tenant = request.tenant
        self.num_active[tenant] -= 1
        if self.num_active[tenant] > 0:
            return
        del self.num_active[tenant]
        self._active.drop(tenant)
        self._count_weight(tenant, -1)
        if not self.num_active:  # the engine is empty: nobody is owed anything by anyone
            self.counters = {}
            self._active.clear()
            self._idle.clear()
            return
        self._idle.file(tenant, self.counters[tenant])
        self._forget()

    def charge(self, request: Request, num_tokens: int) -> None:
        self.counters[request.tenant] += num_tokens / self.weight(request.tenant)

    # the tenants' service
    @property
    def num_tenants(self) -> int:
        """Tenants in the table: the active ones and the idle ones still ahead of the virtual time."""
        return len(self.counters)

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def seat_share(self, tenant: str) -> float:
        """The tenant's share of the engine's sequences by weight, among the active tenants."""
        return self.max_num_seqs * self.weight(tenant) / (self._num_plain_active + self._weighted_active)

    def worth(self, request: Request) -> float:
        """The most service `request` can receive in its life, weighted: its prompt and every token it may
        generate."""
        max_tokens = request.params.max_tokens or self.max_model_len - request.num_prompt_tokens
        return (request.num_prompt_tokens + max_tokens) / self.weight(request.tenant)

    def virtual_time(self) -> float:
        """The lowest counter of the active tenants (0 when none is): where a tenant that becomes active starts."""
        lowest = self._active.lowest(self.counters)
        return 0.0 if lowest is None else lowest[1]

    def _count_weight(self, tenant: str, sign: int) -> None:
        if tenant not in self.weights:
            self._num_plain_active += sign
            return
        self._num_weighted_active += sign
        self._weighted_active += sign * self.weights[tenant]
        if self._num_weighted_active == 0:
            self._weighted_active = 0.0  # NOTE: exact again, not what the additions left

    def _forget(self) -> None:
        # an idle tenant at or below the virtual time would start there on return anyway: forgotten for nothing;
        # past max_tenants, the idle ones nearest the virtual time go first (forgiven the least)
        start = self.virtual_time()
        while (lowest := self._idle.lowest(self.counters)) is not None:
            tenant, counter = lowest
            if counter > start and len(self.counters) <= self.max_tenants:
                return
            self._idle.drop(tenant)
            del self.counters[tenant]
