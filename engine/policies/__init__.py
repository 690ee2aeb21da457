"""Scheduling policies: who goes first when not everyone fits. One class per policy, each in a module of its own,
behind `SchedulingPolicy` (base.py), the one interface the scheduler calls; `POLICIES` names them, the names the
`scheduling_policy` setting takes (engine/config.py checks it against this table), and `make_policy` builds the
configured one. Adding a policy: a `SchedulingPolicy` subclass in a new module here, and its name below."""

from __future__ import annotations

from infer.engine.policies.base import PolicySettings, SchedulingPolicy
from infer.engine.policies.fair import Fair
from infer.engine.policies.fcfs import Fcfs
from infer.engine.policies.priority import Priority

__all__ = ["POLICIES", "Fair", "Fcfs", "PolicySettings", "Priority", "SchedulingPolicy", "make_policy"]

POLICIES: dict[str, type[SchedulingPolicy]] = {"fcfs": Fcfs, "priority": Priority, "fair": Fair}


def make_policy(settings: PolicySettings) -> SchedulingPolicy:
    """The policy `settings.scheduling_policy` names."""
    return POLICIES[settings.scheduling_policy](settings)
