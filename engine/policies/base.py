"""The one interface the scheduler calls for every choice a scheduling policy makes.

The scheduler asks three questions: in what order the waiting requests are admitted (`admission_order`), which
running request is preempted when a running one needs KV blocks there are none of (`victim`), and which running
request, if any, yields its place to a waiting one that finds no room (`victim_for`). It tells the policy what
happens: a request enters and leaves the engine (`enter`, `leave`), a request is served tokens (`charge`: its
prompt once, when first admitted, and each output token when it is sampled). Everything else in a step is the
same for every policy. A policy lives on the stepping thread, like the scheduler.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import ClassVar, Protocol, TypeVar

from infer.engine.request import Request

R = TypeVar("R", bound=Request)


class PolicySettings(Protocol):
    """The settings a policy reads (`EngineConfig` has them; engine/config.py checks their values)."""

    @property
    def scheduling_policy(self) -> str: ...
    @property
    def priority_aging_s(self) -> float: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def max_tenants(self) -> int: ...
    @property
    def tenant_weights(self) -> tuple[tuple[str, float], ...]: ...


class SchedulingPolicy(ABC):
    """Who goes first when not everyone fits. A new policy is a subclass in a module of its own, named in
    `POLICIES` (engine/policies/__init__.py)."""

    # whether it works under static batching, which admits a whole batch and preempts for no one
    allows_static_batching: ClassVar[bool] = False

    def __init__(self, settings: PolicySettings) -> None:
        self.settings = settings

    # the scheduler's questions
    @abstractmethod
    def admission_order(self, waiting: Iterable[R]) -> Iterator[R]:
        """The waiting requests that are ready (given in queue order: a preempted request back at the head), most
        deserving first. Taken lazily: the scheduler stops at the first it cannot admit, and charges each one it
        admits before it asks for the next."""

    @abstractmethod
    def victim(self, running: Sequence[R]) -> R:
        """The running request (given in admission order) to preempt when a running one needs KV blocks."""

    @abstractmethod
    def victim_for(self, waiting: Request, running: Sequence[R]) -> R | None:
        """The running request that yields its place (a sequence, its blocks) to `waiting`, if any does; asked
        again after each preemption until `waiting` fits or none yields."""

    # what the scheduler tells it
    def enter(self, request: Request) -> None:  # noqa: B027 (a hook: most policies keep no state)
        """A request joined the engine."""

    def leave(self, request: Request) -> None:  # noqa: B027
        """A request left the engine (finished, aborted or failed)."""

    def charge(self, request: Request, num_tokens: int) -> None:  # noqa: B027
        """The request was served `num_tokens`: its prompt when first admitted (recomputing after a preemption
        is not service), each output token when sampled."""

    # for the metrics
    @property
    def num_tenants(self) -> int:
        """Tenants whose state the policy keeps (0 for one that keeps none)."""
        return 0
