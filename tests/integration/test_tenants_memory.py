"""100,000 tenants, bounded memory, in one process (slow: `make test-slow`; the real server's figures: `make
soak-tenants`): a request from a new tenant at a time through the engine core on the fake runner under the fair
policy, with one heavy-weight tenant's request always in it (an empty engine forgets every tenant; the others stay
ahead of its counter, so the table fills to its bound), and each tenant's token bucket charged as the servicer
does. The tables stay at `max_tenants`, and the memory Python holds stops growing once they are full (measured:
2,793 KiB held at 20,096 tenants, 2,898 KiB at 90,432)."""

from __future__ import annotations

import tracemalloc

import pytest

from infer.engine.input_processor import Prompt
from infer.engine.request import RequestOutput
from infer.engine.sampling_params import SamplingParams
from infer.server.tenants import Tenants, TenantTable
from tests.helpers.fake_engine import TEXT, fake_core

pytestmark = pytest.mark.slow

NUM_TENANTS, MAX_TENANTS, BATCH = 100_000, 10_000, 64


def test_a_hundred_thousand_tenants_hold_memory_within_a_bound() -> None:
    core, runner = fake_core(
        scheduling_policy="fair", max_num_seqs=BATCH + 1, max_tenants=MAX_TENANTS, max_model_len=4096, num_blocks=400,
        tenant_weights=(("anchor", 1000.0),),  # its counter barely moves: the others stay ahead, and the table fills
    )  # fmt: skip
    tenants = Tenants(table=TenantTable({}, default_tokens_per_minute=10**6), max_tenants=MAX_TENANTS)
    policy = core.scheduler.policy
    assert policy is not None
    prompt = core.tokenizer.encode(TEXT)[:4]
    short = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    anchor = SamplingParams(max_tokens=4000, temperature=0.0, ignore_eos=True)  # a token a step: past the last batch
    core.submit("anchor", core.processor.process(Prompt(token_ids=prompt), anchor), lambda out: None, tenant="anchor")

    num_finished = 0

    def sink(out: RequestOutput) -> None:
        nonlocal num_finished
        num_finished += out.finished

    held: list[tuple[int, int, int]] = []  # (tenants so far, bytes Python holds, the policy's table)
    tracemalloc.start()
    try:
        for first in range(0, NUM_TENANTS, BATCH):
            for i in range(first, first + BATCH):
                tenant = f"tenant-{i}"
                tenants.budgets.check(tenant, len(prompt))
                tenants.budgets.charge(tenant, len(prompt))
                core.submit(f"r{i}", core.processor.process(Prompt(token_ids=prompt), short), sink, tenant=tenant)
            while num_finished < first + BATCH:
                core.step()
            runner.calls.clear()  # the fake runner's record of every pass: the test's, not the engine's
            assert "anchor" in core.scheduler.requests  # the engine never emptied
            assert policy.num_tenants <= MAX_TENANTS and tenants.num_tracked <= MAX_TENANTS
            if (first + BATCH) % 10_048 < BATCH:
                held.append((first + BATCH, tracemalloc.get_traced_memory()[0], policy.num_tenants))
    finally:
        tracemalloc.stop()
    full = [h for h in held if h[0] >= 2 * MAX_TENANTS]  # both tables full, and their dicts grown to size
    growth = max(h[1] for h in full) - full[0][1]
    print("tenants, KiB held, policy table:", [(n, b // 1024, t) for n, b, t in held])
    assert growth < 2 * 2**20, growth  # no per-tenant memory past the bound (2 MiB of slack for allocator noise)
