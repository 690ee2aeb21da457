"""The priority and fair policies in the scheduler and the engine core (fake runner): preemption for a more
deserving request, its place and its tokens kept, the aging bound, and the tenants' shares under load."""

from __future__ import annotations

import ast
import inspect
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from infer.engine import scheduler
from infer.engine.block_manager import BlockManager
from infer.engine.config import EngineConfig
from infer.engine.core import EngineCore
from infer.engine.input_processor import Prompt
from infer.engine.policies import POLICIES, Fair, Fcfs, SchedulingPolicy
from infer.engine.policies.base import R
from infer.engine.request import FinishReason, Request, RequestOutput, RequestStatus
from infer.engine.sampling_params import SamplingParams
from infer.engine.scheduler import Scheduler, SchedulerOutput
from infer.engine.validation import InvalidInput
from tests.helpers.fake_engine import TEXT, FakeRunner, fake_core


def make(num_blocks: int = 64, **settings: Any) -> Scheduler:
    cfg = EngineConfig(**{"block_size": 4, "max_model_len": 64, "num_blocks": num_blocks, **settings})
    return Scheduler(cfg, BlockManager(num_blocks, cfg.block_size, cfg.enable_prefix_caching))


def add(s: Scheduler, rid: str, prompt_len: int, now: float = 0.0, priority: int = 0, tenant: str = "t") -> Request:
    req = Request(rid, [100 + i for i in range(prompt_len)], SamplingParams(max_tokens=8, priority=priority), now)
    req.tenant = tenant
    s.add(req)
    return req


def step(s: Scheduler, now: float = 0.0) -> SchedulerOutput:
    """Schedule, then pretend the forward pass ran and each caught-up request sampled token 7."""
    out = s.schedule(now)
    caught_up = [rid for rid, n in out.num_scheduled_tokens.items() if s.requests[rid].num_computed_tokens + n
                 == s.requests[rid].num_tokens]  # fmt: skip
    s.update(out, {rid: [7] for rid in caught_up})
    return out


def test_fcfs_is_the_default_policy_and_ignores_priority() -> None:
    s = make(max_num_seqs=1)
    assert isinstance(s.policy, Fcfs)
    add(s, "first", 4, priority=5)
    add(s, "urgent", 4, now=1.0, priority=-5)
    assert list(step(s, 1.0).num_scheduled_tokens) == ["first"]


@pytest.mark.parametrize("full", ["seqs", "blocks"])
def test_a_high_priority_request_at_saturation_preempts_the_least_deserving(full: str) -> None:
    # saturated by sequences (4 running of 4) or by KV blocks (4 x 2 blocks of 8)
    settings = {"num_blocks": 8, "max_num_seqs": 8} if full == "blocks" else {"max_num_seqs": 4}
    s = make(**settings, scheduling_policy="priority")
    for i in range(4):
        add(s, f"r{i}", 7, now=float(i))
    step(s, 3.0)  # all four prefilled: 7 tokens + 1 sampled, two blocks of 4 each
    assert len(s.running) == 4 and (full == "seqs" or s.blocks.num_free_blocks == 0)
    urgent = add(s, "urgent", 4, now=4.0, priority=-1)
    out = step(s, 4.0)  # the first step after it arrived
    assert "urgent" in out.num_scheduled_tokens and urgent.status is RequestStatus.RUNNING
    assert out.preempted == ("r3",)  # the latest arrival of the lowest priority: standing 3 (urgent's: -6)
    r3 = s.requests["r3"]
    assert r3.status is RequestStatus.WAITING and r3.num_preemptions == 1 and r3.num_output_tokens == 1
    # it keeps its place: ahead of a later arrival of its priority when room comes back
    add(s, "later", 4, now=5.0)
    for rid in ("urgent", "r0", "r1", "r2"):
        s.finish(rid)
    assert list(step(s, 6.0).num_scheduled_tokens) == ["r3", "later"]
    assert s.requests["r3"].num_computed_tokens == 8  # recomputed: its prompt and the token it had
    for rid in list(s.requests):
        s.finish(rid)
    s.blocks.assert_no_leaks()


def test_a_request_waiting_longer_than_the_aging_bound_is_outranked_by_no_newcomer() -> None:
    s = make(max_num_seqs=1, scheduling_policy="priority", priority_aging_s=10.0)
    add(s, "running", 4, now=0.0)
    step(s, 0.0)
    add(s, "low", 4, now=0.0, priority=2)  # standing 20
    add(s, "early", 4, now=5.0)  # standing 5: ahead of low, not ahead of running (standing 0): no preemption
    add(s, "late", 4, now=25.0)  # standing 25: arrived more than 2 levels x 10 s after low
    assert not step(s, 25.0).preempted
    s.finish("running")
    assert list(step(s, 26.0).num_scheduled_tokens) == ["early"]
    s.finish("early")
    assert list(step(s, 27.0).num_scheduled_tokens) == ["low"]


def test_fair_preempts_the_tenant_most_ahead_for_one_behind() -> None:
    s = make(max_num_seqs=2, scheduling_policy="fair")
    for rid in ("a1", "a2"):
        add(s, rid, 40, tenant="a")
    step(s)
    step(s)  # a: 80 prompt tokens charged, 4 output
    policy = s.policy
    assert isinstance(policy, Fair)
    add(s, "b1", 4, now=1.0, tenant="b")  # b starts at a's counter (the virtual time): owed nothing, behind by 0
    for _ in range(6):
        assert not step(s, 1.0).preempted  # a's two decodes put it 2 tokens a step ahead: less than b1's worth
    out = step(s, 1.0)  # a is ahead by b1's worth (4 + 8): b1 served in full leaves b no further ahead than a
    assert out.preempted == ("a2",) and "b1" in out.num_scheduled_tokens
    s.finish("b1")
    step(s, 1.0)  # a2 back
    add(s, "b2", 4, now=2.0, tenant="b")  # b, behind a when it left, was forgotten: back at a's counter
    policy.counters["b"] = policy.counters["a"] - 11  # as if b had been served up to 11 tokens short of a
    assert not step(s, 2.0).preempted  # b2 may be served 12: it would end ahead of a
    policy.counters["b"] -= 1  # 12 short: b2 served in full leaves b no further ahead than a
    out = step(s, 2.0)
    assert out.preempted == ("a2",) and "b2" in out.num_scheduled_tokens


class ShortestFirst(SchedulingPolicy):
    """A policy made up for the test: the shortest prompt first, and a longer running request yields to it."""

    def admission_order(self, waiting: Iterable[R]) -> Iterator[R]:
        return iter(sorted(waiting, key=lambda r: r.num_prompt_tokens))

    def victim(self, running: Sequence[R]) -> R:
        return max(reversed(running), key=lambda r: r.num_prompt_tokens)

    def victim_for(self, waiting: Request, running: Sequence[R]) -> R | None:
        longest = self.victim(running)
        return longest if longest.num_prompt_tokens > waiting.num_prompt_tokens else None


def test_a_new_policy_is_a_class_named_in_the_table_and_it_drives_the_scheduler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(InvalidInput, match="scheduling_policy"):
        make(scheduling_policy="shortest")  # not in the table: refused
    monkeypatch.setitem(POLICIES, "shortest", ShortestFirst)
    s = make(max_num_seqs=2, scheduling_policy="shortest")
    for rid, n in (("long", 12), ("mid", 8), ("short", 4)):
        add(s, rid, n)
    assert list(step(s).num_scheduled_tokens) == ["short", "mid"]  # its order, not the queue's
    add(s, "tiny", 2, now=1.0)
    out = step(s, 1.0)
    assert out.preempted == ("mid",) and "tiny" in out.num_scheduled_tokens  # its choice of who yields
    s.finish("tiny")
    s.finish("short")
    assert set(step(s, 2.0).num_scheduled_tokens) == {"mid", "long"}
    assert s.requests["mid"].num_computed_tokens == 9  # back with its prompt and its token (from the prefix cache)
    for rid in list(s.requests):
        s.finish(rid)
    s.blocks.assert_no_leaks()


def test_the_scheduler_names_no_policy() -> None:
    # no policy's name (a string), class, or the setting that picks one: it asks `self.policy` and nothing else
    policy_words = set(POLICIES) | {cls.__name__ for cls in POLICIES.values()} | {"scheduling_policy", "is_fair"}
    tree = ast.parse(inspect.getsource(scheduler))
    words = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    words |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    words |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert words & policy_words == set(), "a policy's choice belongs in its class (engine/policies/)"


# the engine core on the fake runner


@dataclass
class Load:
    """Keeps each tenant backlogged (`depth` requests waiting or running) and counts its output tokens."""

    core: EngineCore
    runner: FakeRunner
    tenants: tuple[str, ...]
    depth: int = 6
    max_tokens: int = 16
    in_flight: Counter[str] = field(default_factory=Counter)
    tokens: Counter[str] = field(default_factory=Counter)
    num_submitted: int = 0

    def fill(self, tenants: tuple[str, ...] | None = None) -> None:
        prompt = self.core.tokenizer.encode(TEXT)[:8]
        params = SamplingParams(max_tokens=self.max_tokens, temperature=0.0, ignore_eos=True)
        for tenant in tenants or self.tenants:
            while self.in_flight[tenant] < self.depth:
                self.num_submitted += 1
                processed = self.core.processor.process(Prompt(token_ids=prompt), params)
                self.core.submit(f"{tenant}-{self.num_submitted}", processed, self._sink(tenant), tenant=tenant)
                self.in_flight[tenant] += 1

    def _sink(self, tenant: str) -> Any:
        def sink(out: RequestOutput) -> None:
            self.tokens[tenant] += len(out.token_ids)
            if out.finished:
                self.in_flight[tenant] -= 1

        return sink

    def run(self, num_steps: int, tenants: tuple[str, ...] | None = None) -> Counter[str]:
        """Output tokens per tenant over `num_steps` steps, the tenants kept backlogged."""
        before = Counter(self.tokens)
        for _ in range(num_steps):
            self.fill(tenants)
            self.core.step()
        return self.tokens - before

    def drain(self) -> None:
        while self.core.has_work:
            self.core.step()
        self.core.block_manager.assert_no_leaks()


def _share(tokens: Counter[str], tenant: str) -> float:
    return tokens[tenant] / sum(tokens.values())


def test_the_output_share_of_two_backlogged_tenants_converges_to_their_weights() -> None:
    core, runner = fake_core(scheduling_policy="fair", max_num_seqs=4, tenant_weights=(("gold", 2.0),))
    load = Load(core, runner, ("gold", "free"))
    load.run(40)  # warm-up
    tokens = load.run(300)
    assert _share(tokens, "gold") == pytest.approx(2 / 3, rel=0.1), tokens
    load.drain()


def test_a_tenant_that_arrives_late_is_not_owed_the_service_it_missed() -> None:
    core, runner = fake_core(scheduling_policy="fair", max_num_seqs=4)
    load = Load(core, runner, ("early", "late"))
    load.run(200, ("early",))  # early alone: about 800 tokens of service
    head_start = load.run(80)
    # late starts at early's counter: owed none of early's 800 (the bound: a longest request, 256 tokens of
    # prompt and output, 24 a request)
    assert head_start["late"] - head_start["early"] <= 256 * 16 / 24, head_start
    tokens = load.run(200)
    assert _share(tokens, "early") == pytest.approx(0.5, abs=0.1), tokens  # then shared
    load.drain()


@pytest.mark.parametrize("policy", ["priority", "fair"])
def test_preemption_never_loses_or_repeats_a_token(policy: str) -> None:
    # a KV pool too small for all at once, and urgent requests that arrive when it is full
    core, runner = fake_core(scheduling_policy=policy, num_blocks=16, max_model_len=128)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 300, (1 + (i * 29) % 70,), generator=g).tolist() for i in range(12)]
    outputs: dict[str, list[int]] = {}
    finish: dict[str, FinishReason | None] = {}

    def submit(i: int, priority: int) -> None:
        rid = f"r{i}"
        outputs[rid] = []
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, priority=priority)

        def sink(out: RequestOutput) -> None:
            outputs[rid].extend(out.token_ids)
            finish[rid] = out.finish_reason

        processed = core.processor.process(Prompt(token_ids=prompts[i]), params)
        core.submit(rid, processed, sink, tenant="b" if i in (6, 7) else "a")  # fair: the urgent ones are a's

    for i in range(8):
        submit(i, priority=3)
    for _ in range(6):
        core.step()
    for i in range(8, 12):
        submit(i, priority=-3)
    while core.has_work:
        core.step()
    expected = {f"r{i}": [runner.token_at(len(p) + j) for j in range(12)] for i, p in enumerate(prompts)}
    assert outputs == expected
    assert all(reason is FinishReason.LENGTH for reason in finish.values())
    assert core.stats().num_preemptions_total > 0
    core.block_manager.assert_no_leaks()
