"""The fair policy alone: the tenants' counters, the virtual time, the bounded table, who yields to whom."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from infer.engine.config import EngineConfig
from infer.engine.policies import Fair
from infer.engine.request import DEFAULT_TENANT, Request
from infer.engine.sampling_params import SamplingParams


def policy(**settings: Any) -> Fair:
    return Fair(EngineConfig(scheduling_policy="fair", max_model_len=64, **settings))


def req(rid: str, tenant: str = DEFAULT_TENANT, priority: int = 0, arrival_s: float = 0.0) -> Request:
    r = Request(rid, [1, 2, 3], SamplingParams(priority=priority), arrival_s)
    r.tenant = tenant
    return r


def test_fair_serves_the_tenant_with_the_least_weighted_service() -> None:
    p = policy(tenant_weights=(("a", 2.0),))
    a1, a2, b1 = req("a1", "a"), req("a2", "a", arrival_s=1.0), req("b1", "b", arrival_s=2.0)
    for r in (a1, a2, b1):
        p.enter(r)
    assert p.counters == {"a": 0.0, "b": 0.0}  # b became active at the virtual time (a's counter): owed nothing
    p.charge(a1, 10)  # a: 10 tokens at weight 2 -> 5
    p.charge(b1, 6)  # b: 6 at weight 1 -> 6
    assert p.counters == {"a": 5.0, "b": 6.0}
    order = p.admission_order([b1, a2])
    assert next(order) is a2
    p.charge(a2, 4)  # a: 7 now: b next
    assert next(order) is b1
    assert p.victim([a1, b1]) is a1  # the tenant most ahead (a: 7 > 6) yields


def test_a_tenant_starts_at_the_virtual_time_keeps_its_lead_and_an_idle_engine_forgets() -> None:
    p = policy(tenant_weights=(("b", 2.0),))
    a = req("a", "a")
    p.enter(a)
    p.charge(a, 500)
    b = req("b", "b")
    p.enter(b)
    assert p.counters["b"] == 500.0 == p.virtual_time()  # at a's counter: owed nothing for the 500 it missed
    p.charge(b, 100)  # b: 550 (100 at weight 2), a: 500
    p.leave(b)
    assert p.counters["b"] == 550.0  # ahead of the virtual time: kept, so that leaving and coming back is no reset
    b2 = req("b2", "b")
    p.enter(b2)
    assert p.counters["b"] == 550.0  # back with its lead
    p.leave(b2)
    p.charge(a, 100)  # a: 600, past b's 550
    d = req("d", "d")
    p.enter(d)
    assert p.counters["d"] == 600.0
    p.leave(d)
    assert "d" not in p.counters and "b" not in p.counters  # at or below the virtual time: they would start there
    p.leave(a)
    assert p.counters == {} and p.virtual_time() == 0.0  # the engine is empty: nobody is owed anything
    c = req("c", "c")
    p.enter(c)
    assert p.counters == {"c": 0.0}


def test_a_fresh_tenant_does_not_get_ahead_of_a_named_tenant_that_has_been_waiting() -> None:
    p = policy(max_num_seqs=2)
    heavy, light = req("h", "heavy", arrival_s=0.0), req("l", "light", arrival_s=1.0)
    waiting = req("l2", "light", arrival_s=2.0)  # light's next request, waiting for a seat
    for r in (heavy, light, waiting):
        p.enter(r)
    p.charge(heavy, 50)
    p.charge(light, 20)  # light is the active tenant served least: the virtual time, 20
    fresh = req("f", "fresh", arrival_s=3.0)
    p.enter(fresh)
    assert p.counters["fresh"] == p.counters["light"] == p.virtual_time() == 20.0  # not below everyone
    assert [r.request_id for r in p.admission_order([fresh, waiting])] == ["l2", "f"]  # of equals, the earlier
    seats = Counter({"heavy": 1, "light": 1})
    assert not p.may_preempt(fresh, light, seats)  # and it takes no seat from the tenant at the virtual time


def test_the_table_of_tenants_is_bounded_by_max_tenants_after_they_leave() -> None:
    p = policy(max_tenants=100)
    anchor = req("anchor", "anchor")  # keeps the engine busy (an empty engine forgets everyone) at virtual time 0
    p.enter(anchor)
    for i in range(1_000):  # a new tenant per request, each served a little: ahead of the virtual time when idle
        r = req(f"r{i}", f"t{i}")
        p.enter(r)
        p.charge(r, 1 + i % 7)
        p.leave(r)
        assert len(p.counters) <= 100
    assert len(p.counters) == 100 and "anchor" in p.counters
    kept = sorted(c for t, c in p.counters.items() if t != "anchor")
    assert kept[0] >= 6.0  # the idle tenants nearest the virtual time were the ones forgotten
    many = [req(f"m{i}", f"m{i}") for i in range(300)]  # tenants with requests in the engine are all kept
    for r in many:
        p.enter(r)
    assert all(r.tenant in p.counters for r in many)
    for r in many:
        p.leave(r)
    assert len(p.counters) <= 100


def test_twenty_thousand_tenants_pass_through_the_policy_in_well_under_a_second() -> None:
    # a replay: a request per new tenant, all in the engine at once, admitted, served, and finished one by one
    p = policy(max_num_seqs=256)
    requests = [req(f"r{i}", f"t{i}", arrival_s=i * 1e-3) for i in range(20_000)]
    started = time.process_time()  # CPU time: the engine thread's, whatever else the machine runs
    for r in requests:
        p.enter(r)
    order = p.admission_order(requests)  # eight steps' admissions from the whole queue
    for _, r in zip(range(8 * 256), order, strict=False):
        p.charge(r, 3)
    for r in requests:
        p.charge(r, 1)
        p.leave(r)
    elapsed_s = time.process_time() - started
    assert p.counters == {} and elapsed_s < 1.0, elapsed_s


def test_cross_tenant_preemption_needs_a_lead_of_the_waiting_requests_worth_and_seats_below_a_share() -> None:
    p = policy(max_num_seqs=4)  # two tenants: 2 sequences each by weight
    running, same = req("r", "a", arrival_s=0.0), req("s", "a", priority=-1)
    waiting = Request("w", [1, 2, 3], SamplingParams(max_tokens=5), 5.0)  # worth 3 + 5 = 8 tokens
    waiting.tenant = "b"
    for r in (running, waiting, same):
        p.enter(r)
    assert p.counters["b"] == p.counters["a"]  # even: b started at the virtual time
    seats = Counter({"a": 4})  # a holds every sequence
    p.charge(running, 7)
    assert not p.may_preempt(waiting, running, seats)  # a is ahead by 7: less than all w can be served
    p.charge(running, 1)
    assert p.may_preempt(waiting, running, seats)  # ahead by 8: w served in full leaves b no further ahead than a
    assert not p.may_preempt(waiting, running, Counter({"a": 2, "b": 2}))  # b holds its share: no churn
    assert not p.may_preempt(waiting, running, Counter({"a": 2, "b": 1}))  # a is not above its share
    assert p.may_preempt(same, running, seats)  # within a tenant, by standing
