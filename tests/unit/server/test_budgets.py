"""Token budgets (server/budgets.py) on a fake clock: a prompt is paid at admission, output as produced (a request in
flight may overdraw), and a refusal says when the bucket will have refilled enough."""

from __future__ import annotations

import pytest

from infer.server.budgets import BudgetExceededError, TokenBudgets


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def _budgets(per_minute: dict[str, int]) -> tuple[TokenBudgets, FakeClock]:
    clock = FakeClock()
    return TokenBudgets(per_minute.get, clock), clock


def test_a_full_bucket_pays_prompts_until_it_is_spent_then_says_when_to_retry() -> None:
    b, clock = _budgets({"t": 600})  # 10 tokens a second
    for _ in range(3):
        b.check("t", 200)
        b.charge("t", 200)
    with pytest.raises(BudgetExceededError) as e:
        b.check("t", 50)
    assert (e.value.tenant, e.value.tokens_per_minute, e.value.retry_after_s) == ("t", 600, 5)
    assert "'t'" in str(e.value) and "600 tokens per minute" in str(e.value)
    clock.now_s += 4.9
    with pytest.raises(BudgetExceededError) as e:
        b.check("t", 50)
    assert e.value.retry_after_s == 1  # rounded up, never 0
    clock.now_s += 0.1
    b.check("t", 50)  # refilled as promised


def test_output_tokens_may_overdraw_and_the_next_request_waits_for_the_refill() -> None:
    b, clock = _budgets({"t": 60})  # 1 token a second
    b.check("t", 10)
    b.charge("t", 10)
    b.charge("t", 100)  # the output of the request in flight: never cut
    assert b.level("t") == -50
    with pytest.raises(BudgetExceededError) as e:
        b.check("t", 1)
    assert e.value.retry_after_s == 51
    clock.now_s += 51
    b.check("t", 1)


def test_the_bucket_holds_one_minute_and_a_prompt_over_it_needs_a_full_one() -> None:
    b, clock = _budgets({"t": 60})
    clock.now_s += 3600  # idle for an hour: still one minute's worth, no more
    assert b.level("t") == 60
    b.check("t", 500)  # larger than the whole budget: admitted on a full bucket, then it overdraws
    b.charge("t", 500)
    with pytest.raises(BudgetExceededError) as e:
        b.check("t", 500)
    assert e.value.retry_after_s == 500  # -440 back up to a full 60, at 1 a second


def test_tenants_have_their_own_buckets_and_a_tenant_without_a_budget_none() -> None:
    b, _ = _budgets({"a": 60, "b": 60})
    b.charge("a", 60)
    with pytest.raises(BudgetExceededError):
        b.check("a", 1)
    b.check("b", 60)
    for _ in range(100):
        b.check("free", 10**9)  # no budget: never refused, nothing kept
        b.charge("free", 10**9)
    assert b.level("free") is None and len(b) == 2


def test_full_buckets_are_forgotten_when_many_tenants_were_seen() -> None:
    b = TokenBudgets(lambda tenant: 60, FakeClock(), max_buckets=10)
    b.charge("spent", 30)
    for i in range(20):
        b.check(f"t{i}", 1)  # a bucket each, full
    spent = b.level("spent")
    assert len(b) <= 10 and spent is not None and spent < 60  # kept: not full


def test_the_buckets_stay_at_their_bound_when_every_tenant_has_spent() -> None:
    b = TokenBudgets(lambda tenant: 60, FakeClock(), max_buckets=100)
    for i in range(5_000):  # a new tenant per request, each leaving its bucket spent: none is full
        b.check(f"t{i}", 1)
        b.charge(f"t{i}", 50)
        assert len(b) <= 100
    assert len(b) > 50  # forgotten down to half at most, not emptied
    assert b.level("t4999") == 10  # the most recent are kept, what they owe with them
    b.charge("t3", 0)  # forgotten, the least recently used: back with a full bucket
    assert b.level("t3") == 60
