"""The policies' table: each `scheduling_policy` name builds its own class, the settings are checked against the
table, and fcfs is a policy like the others (arrival order, the last admitted yields, nobody overtakes)."""

from __future__ import annotations

import pytest

from infer.engine.config import SCHEDULING_POLICIES, EngineConfig
from infer.engine.policies import POLICIES, Fair, Fcfs, Priority, make_policy
from infer.engine.request import Request
from infer.engine.sampling_params import SamplingParams
from infer.engine.validation import InvalidInput


def req(rid: str, priority: int = 0, arrival_s: float = 0.0) -> Request:
    return Request(rid, [1, 2, 3], SamplingParams(priority=priority), arrival_s)


def test_each_name_builds_its_own_class_and_the_config_checks_the_one_table() -> None:
    built = {name: type(make_policy(EngineConfig(scheduling_policy=name))) for name in POLICIES}
    assert built == {"fcfs": Fcfs, "priority": Priority, "fair": Fair}
    assert SCHEDULING_POLICIES is POLICIES


def test_fcfs_admits_in_queue_order_preempts_the_last_admitted_and_lets_nobody_overtake() -> None:
    p = make_policy(EngineConfig())
    assert isinstance(p, Fcfs)
    queue = [req("late-urgent", priority=-20, arrival_s=9.0), req("early", priority=20, arrival_s=0.0)]
    assert [r.request_id for r in p.admission_order(queue)] == ["late-urgent", "early"]  # the queue's order
    running = [req("a", priority=20), req("b", priority=-20)]
    assert p.victim(running).request_id == "b"  # the last admitted, whatever its priority
    assert p.victim_for(req("urgent", priority=-20), running) is None
    p.enter(queue[0])
    p.charge(queue[0], 5)
    assert p.num_tenants == 0


def test_priority_is_bounded_and_the_scheduling_settings_checked() -> None:
    with pytest.raises(InvalidInput, match="priority"):
        SamplingParams(priority=21)
    with pytest.raises(InvalidInput, match="priority"):
        SamplingParams(priority=1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="scheduling_policy: must be one of fcfs, priority, fair"):
        EngineConfig(scheduling_policy="lottery")
    for name in ("priority", "fair"):  # they preempt for a waiting request: static batching never does
        with pytest.raises(InvalidInput, match="scheduling_policy"):
            EngineConfig(scheduling_policy=name, batching="static")
    assert EngineConfig(batching="static").scheduling_policy == "fcfs"
    with pytest.raises(InvalidInput, match="tenant_weights"):
        EngineConfig(tenant_weights=(("a", 0.0),))
    with pytest.raises(InvalidInput, match="tenant_weights"):
        EngineConfig(tenant_weights=(("a", 1.0), ("a", 2.0)))
    with pytest.raises(InvalidInput, match="priority_aging_s"):
        EngineConfig(priority_aging_s=0)
    assert EngineConfig(tenant_weights={"a": 2}).tenant_weights == (("a", 2.0),)  # a mapping is taken too
