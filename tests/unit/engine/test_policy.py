"""The priority and fair policies alone: standing and aging, the tenants' counters, who yields to whom."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from infer.engine.config import EngineConfig
from infer.engine.policy import MIN_PRIORITY, Policy
from infer.engine.request import DEFAULT_TENANT, Request
from infer.engine.sampling_params import SamplingParams
from infer.engine.validation import InvalidInput


def policy(name: str = "fair", **settings: Any) -> Policy:
    return Policy(EngineConfig(scheduling_policy=name, max_model_len=64, **settings))


def req(rid: str, tenant: str = DEFAULT_TENANT, priority: int = 0, arrival_s: float = 0.0) -> Request:
    r = Request(rid, [1, 2, 3], SamplingParams(priority=priority), arrival_s)
    r.tenant = tenant
    return r


def test_standing_is_arrival_plus_priority_levels_of_aging() -> None:
    p = policy("priority", priority_aging_s=10.0)
    early_low, late_high = req("a", priority=2, arrival_s=0.0), req("b", priority=0, arrival_s=15.0)
    assert p.standing(early_low) == 20.0 and p.standing(late_high) == 15.0
    assert [r.request_id for r in p.admission_order([early_low, late_high])] == ["b", "a"]
    # the aging bound: nothing arriving more than (2 - MIN_PRIORITY) * 10 s after `a` outranks it
    newcomer = req("c", priority=MIN_PRIORITY, arrival_s=(2 - MIN_PRIORITY) * 10.0 + 0.001)
    assert p.standing(newcomer) > p.standing(early_low)
    assert not p.may_preempt(newcomer, early_low, Counter()) and p.may_preempt(late_high, early_low, Counter())


def test_fair_serves_the_tenant_with_the_least_weighted_service() -> None:
    p = policy(tenant_weights=(("a", 2.0),))
    a1, a2, b1 = req("a1", "a"), req("a2", "a", arrival_s=1.0), req("b1", "b", arrival_s=2.0)
    for r in (a1, a2, b1):
        p.enter(r)
    assert p.counters == {"a": 0.0, "b": -64.0}  # b became active owed at most max_model_len (64) tokens
    p.charge(a1, 10)  # a: 10 tokens at weight 2 -> 5
    p.charge(b1, 70)  # b: 70 at weight 1 -> 6
    assert p.counters == {"a": 5.0, "b": 6.0}
    order = p.admission_order([b1, a2])
    assert next(order) is a2
    p.charge(a2, 4)  # a: 7 now: b next
    assert next(order) is b1
    assert p.victim([a1, b1]) is a1  # the tenant most ahead (a: 7 > 6) yields


def test_a_newcomer_is_owed_at_most_max_model_len_and_an_idle_engine_forgets() -> None:
    p = policy(tenant_weights=(("b", 2.0),))  # max_model_len 64: the credit, weighted
    a = req("a", "a")
    p.enter(a)
    p.charge(a, 500)
    b = req("b", "b")
    p.enter(b)
    assert p.counters["b"] == 500.0 - 64 / 2  # owed 32 weighted tokens of back-service, not 500
    p.charge(b, 100)  # b: 518 (100 at weight 2), a: 500
    p.leave(a)
    assert p.counters["a"] == 500.0  # within the credit below the active minimum: kept, not lifted to it
    p.charge(b, 100)  # b: 568
    d = req("d", "d")
    p.enter(d)  # at b's 568 less 64
    p.leave(d)
    assert "d" not in p.counters and "a" not in p.counters  # a credit or more below the minimum: forgotten
    a2 = req("a2", "a")
    p.enter(a2)
    assert p.counters["a"] == 568.0 - 64  # back from its absence owed one credit, not all it missed
    p.leave(a2)
    p.leave(b)
    assert p.counters == {} and p.idle_level == 568.0
    c = req("c", "c")
    p.enter(c)
    assert p.counters == {"c": 568.0}  # alone: no one to be owed anything by


def test_cross_tenant_preemption_needs_a_lead_of_the_waiting_requests_worth_and_seats_below_a_share() -> None:
    p = policy(max_num_seqs=4)  # max_model_len 64: a newcomer's credit; two tenants: 2 sequences each by weight
    running, same = req("r", "a", arrival_s=0.0), req("s", "a", priority=-1)
    waiting = Request("w", [1, 2, 3], SamplingParams(max_tokens=5), 5.0)  # worth 3 + 5 = 8 tokens
    waiting.tenant = "b"
    for r in (running, waiting, same):
        p.enter(r)
    p.counters["b"] = p.counters["a"]  # even (past the credit)
    seats = Counter({"a": 4})  # a holds every sequence
    p.charge(running, 7)
    assert not p.may_preempt(waiting, running, seats)  # a is ahead by 7: less than all w can be served
    p.charge(running, 1)
    assert p.may_preempt(waiting, running, seats)  # ahead by 8: w served in full leaves b no further ahead than a
    assert not p.may_preempt(waiting, running, Counter({"a": 2, "b": 2}))  # b holds its share: no churn
    assert not p.may_preempt(waiting, running, Counter({"a": 2, "b": 1}))  # a is not above its share
    assert p.may_preempt(same, running, seats)  # within a tenant, by standing


def test_priority_is_bounded_and_the_scheduling_settings_checked() -> None:
    with pytest.raises(InvalidInput, match="priority"):
        SamplingParams(priority=21)
    with pytest.raises(InvalidInput, match="priority"):
        SamplingParams(priority=1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="scheduling_policy"):
        EngineConfig(scheduling_policy="lottery")
    with pytest.raises(InvalidInput, match="scheduling_policy"):
        EngineConfig(scheduling_policy="fair", batching="static")
    with pytest.raises(InvalidInput, match="tenant_weights"):
        EngineConfig(tenant_weights=(("a", 0.0),))
    with pytest.raises(InvalidInput, match="tenant_weights"):
        EngineConfig(tenant_weights=(("a", 1.0), ("a", 2.0)))
    with pytest.raises(InvalidInput, match="priority_aging_s"):
        EngineConfig(priority_aging_s=0)
    assert EngineConfig(tenant_weights={"a": 2}).tenant_weights == (("a", 2.0),)  # a mapping is taken too
