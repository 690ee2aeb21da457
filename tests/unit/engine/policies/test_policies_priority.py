"""The priority policy alone: standing and aging, and who yields to whom."""

from __future__ import annotations

from infer.engine.config import EngineConfig
from infer.engine.policies import Priority
from infer.engine.request import Request
from infer.engine.sampling_params import MIN_PRIORITY, SamplingParams


def req(rid: str, priority: int = 0, arrival_s: float = 0.0) -> Request:
    return Request(rid, [1, 2, 3], SamplingParams(priority=priority), arrival_s)


def test_standing_is_arrival_plus_priority_levels_of_aging() -> None:
    p = Priority(EngineConfig(scheduling_policy="priority", priority_aging_s=10.0))
    early_low, late_high = req("a", priority=2, arrival_s=0.0), req("b", priority=0, arrival_s=15.0)
    assert p.standing(early_low) == 20.0 and p.standing(late_high) == 15.0
    assert [r.request_id for r in p.admission_order([early_low, late_high])] == ["b", "a"]
    # the aging bound: nothing arriving more than (2 - MIN_PRIORITY) * 10 s after `a` outranks it
    newcomer = req("c", priority=MIN_PRIORITY, arrival_s=(2 - MIN_PRIORITY) * 10.0 + 0.001)
    assert p.standing(newcomer) > p.standing(early_low)
    assert not p.outranks(newcomer, early_low) and p.outranks(late_high, early_low)


def test_the_least_deserving_running_request_yields_and_only_to_one_that_outranks_it() -> None:
    p = Priority(EngineConfig(scheduling_policy="priority", priority_aging_s=10.0))
    running = [req("r0", arrival_s=0.0), req("r1", priority=1, arrival_s=1.0), req("r2", arrival_s=2.0)]
    assert p.victim(running).request_id == "r1"  # standing 11: the worst
    tie = [req("x", arrival_s=5.0), req("y", arrival_s=5.0)]
    assert p.victim(tie).request_id == "y"  # of equals, the last admitted
    assert p.victim_for(req("w", arrival_s=1.5), running) is running[1]  # outranks r1 (and r2): r1 yields
    assert p.victim_for(req("w", arrival_s=12.0), running) is None  # outranks none
    assert [r.request_id for r in p.admission_order(tie)] == ["x", "y"]  # of equals, in queue order
