"""infer bench's parts without a server: workloads, arrivals, the load loop over a fake target, statistics, SSE."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import AsyncIterator

import pytest

from infer.clients.bench.load import LoadPlan, arrival_offsets, run_load
from infer.clients.bench.metrics import BenchRun, Slo, Stats, max_overlap, percentile, summarize
from infer.clients.bench.report import markdown_table
from infer.clients.bench.targets import Clock, GrpcTarget, OpenAITarget, RequestResult
from infer.clients.bench.workloads import (
    FIRST_ID,
    SYSTEM_PROMPT_TOKENS,
    RequestSpec,
    Workload,
    WorkloadOptions,
    make_workload,
)
from infer.clients.types import Sampling


def test_percentiles_interpolate_between_ranks() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert (percentile(values, 50), percentile(values, 90)) == (3.0, pytest.approx(4.6))
    assert percentile(values, 99) == pytest.approx(4.96) and percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50)) and math.isnan(Stats.of([]).mean)
    assert Stats.of(values) == Stats(3.0, 3.0, pytest.approx(4.6), pytest.approx(4.96), 5)


def test_max_overlap_closes_before_it_opens() -> None:
    assert max_overlap([(0, 2), (1, 3), (2, 4)]) == 2
    assert max_overlap([(0, 1), (0, 1), (0, 1)]) == 3
    assert max_overlap([]) == 0


def _result(
    index: int, sent: float, ttft: float, e2e: float, tokens: int, status: str = "OK", tag: str = ""
) -> RequestResult:
    gaps = [(e2e - ttft) / (tokens - 1)] * (tokens - 1) if tokens > 1 else []
    return RequestResult(index, tag, 10, tokens, sent, status, "", ttft, e2e, tokens, gaps)


def test_summary_counts_throughput_latency_goodput_and_errors() -> None:
    results = [
        _result(0, 0.0, 0.5, 2.5, 5, tag="a"),  # tpot 0.5
        _result(1, 1.0, 1.5, 4.0, 6, tag="b"),  # tpot 0.5, ttft over the SLO
        RequestResult(2, "a", 10, 5, 2.0, "RESOURCE_EXHAUSTED", "queue full", None, 0.1),
    ]
    s = summarize(results, Slo(ttft_s=1.0, tpot_s=0.6))
    assert (s.num_requests, s.num_ok, s.duration_s) == (3, 2, 5.0)
    assert s.requests_per_s == pytest.approx(0.4) and s.output_tokens_per_s == pytest.approx(11 / 5)
    assert s.ttft_s.mean == pytest.approx(1.0) and s.tpot_s.mean == pytest.approx(0.5)
    assert s.itl_s.count == 9 and s.e2e_s.p50 == pytest.approx(3.25)
    assert s.goodput_requests_per_s == pytest.approx(0.2) and s.slo_attainment == pytest.approx(1 / 3)
    assert s.errors == {"RESOURCE_EXHAUSTED": 1} and s.max_concurrent_decoding == 1  # [0.5, 2.5], [2.5, 5]
    tagged = summarize(results, tag="a")
    assert (tagged.num_requests, tagged.num_ok, tagged.errors) == (2, 1, {"RESOURCE_EXHAUSTED": 1})


def test_slo_needs_a_successful_request_within_every_bound() -> None:
    r = _result(0, 0.0, 0.5, 2.5, 5)
    assert Slo().met(r) and Slo(ttft_s=0.5, tpot_s=0.5, e2e_s=2.5).met(r)
    assert not Slo(ttft_s=0.4).met(r) and not Slo(tpot_s=0.4).met(r) and not Slo(e2e_s=2.0).met(r)
    assert not Slo().met(RequestResult(1, "", 1, 1, 0.0, "UNAVAILABLE"))


def test_workloads_come_from_the_seed_with_exact_lengths() -> None:
    opts = WorkloadOptions(vocab_size=1000, seed=3)
    assert make_workload("continuous_batching", opts) == make_workload("continuous_batching", opts)
    assert make_workload("baseline", opts) != make_workload("baseline", WorkloadOptions(vocab_size=1000, seed=4))
    for name in ("baseline", "continuous_batching", "paged_attention", "chunked_prefill", "prefix_caching", "mixed"):
        work = make_workload(name, opts)
        assert work.requests and all(FIRST_ID <= t < 1000 for r in work.requests for t in r.prompt)
    assert {len(r.prompt) for r in make_workload("baseline", opts).requests} == {128}
    burst = make_workload("paged_attention", opts).requests
    assert len(burst) == 48 and {r.at_s for r in burst} == {0.0}
    with pytest.raises(ValueError, match="unknown workload"):
        make_workload("nope")


def test_prefix_caching_shares_one_system_prompt_and_warms_it() -> None:
    work = make_workload("prefix_caching", WorkloadOptions(vocab_size=5000))
    prefixes = {r.prompt[:SYSTEM_PROMPT_TOKENS] for r in (*work.requests, *work.warmup)}
    assert len(prefixes) == 1 and len(work.warmup) == 1 and work.concurrency == 1
    assert all(len(r.prompt) > SYSTEM_PROMPT_TOKENS for r in work.requests)


def test_options_cap_tokens_count_requests_and_stretch_the_schedule() -> None:
    plain = make_workload("chunked_prefill")
    work = make_workload("chunked_prefill", WorkloadOptions(num_requests=2, max_tokens=10, time_scale=2.0))
    longs = [r for r in work.requests if r.tag == "long_prompt"]
    assert len(longs) == 2 and all(r.max_tokens <= 10 for r in work.requests)
    assert [r.at_s for r in longs] == [2 * r.at_s for r in plain.requests if r.tag == "long_prompt"][:2]  # type: ignore[operator]


def test_poisson_arrivals_are_seeded_with_mean_gap_one_over_rate() -> None:
    offsets = arrival_offsets(4000, rate=2.0, seed=1)
    assert offsets == arrival_offsets(4000, rate=2.0, seed=1) and offsets[0] == 0.0
    assert all(b > a for a, b in itertools.pairwise(offsets))
    assert offsets[-1] / (len(offsets) - 1) == pytest.approx(0.5, rel=0.05)


class FakeTarget:
    """Answers each request with its max_tokens tokens; records how many were in flight at once."""

    name = "fake"

    def __init__(self) -> None:
        self.in_flight = self.most_in_flight = 0
        self.sent: list[int] = []

    async def send(self, spec: RequestSpec, result: RequestResult) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.sent.append(len(spec.prompt))
        clock = Clock(result)
        for _ in range(spec.max_tokens):
            await asyncio.sleep(0)
            clock.tokens(1)
        clock.done()
        self.in_flight -= 1

    async def close(self) -> None:
        pass


def _work(n: int) -> Workload:
    return Workload("w", "", tuple(RequestSpec(tuple(range(i + 1)), 3) for i in range(n)))


def test_fixed_concurrency_bounds_the_streams_and_warmup_is_not_recorded() -> None:
    target = FakeTarget()
    results = asyncio.run(run_load(target, _work(9), LoadPlan(concurrency=3, warmup=1, progress=False)))
    assert target.most_in_flight == 3 and target.sent[0] == 1 and len(target.sent) == 10
    assert [r.index for r in results] == list(range(9)) and all(r.ok and r.output_tokens == 3 for r in results)
    assert all(len(r.gaps_s) == 2 and r.ttft_s is not None for r in results)


def test_rate_sends_every_request_and_a_spent_duration_sends_none() -> None:
    target = FakeTarget()
    results = asyncio.run(run_load(target, _work(5), LoadPlan(rate=1000.0, progress=False)))
    assert len(results) == 5 and all(r.ok for r in results)
    assert asyncio.run(run_load(FakeTarget(), _work(5), LoadPlan(concurrency=2, duration_s=0, progress=False))) == []


async def _lines(lines: list[str]) -> AsyncIterator[str]:
    for line in lines:
        yield line


@pytest.mark.parametrize(("protocol", "key"), [("completions", "text"), ("chat", "delta")])
def test_sse_content_chunks_are_marked_and_usage_wins(protocol: str, key: str) -> None:
    def choice(text: str) -> str:
        body = {"text": text} if key == "text" else {"delta": {"content": text}}
        return '{"choices": [' + str(body).replace("'", '"') + "]}"

    usage = 'data: {"choices": [], "usage": {"completion_tokens": 3}}'
    lines = ["data: " + choice("Hi"), "", "data: " + choice(""), ": comment", "data: " + choice(" there"), usage,
             "data: [DONE]", "data: " + choice("late")]  # fmt: skip
    target = OpenAITarget("http://127.0.0.1:1/v1", protocol, model="m")
    result = RequestResult(0, "", 1, 3, 0.0)
    reported = asyncio.run(target._read_events(_lines(lines), Clock(result)))
    asyncio.run(target.close())
    assert reported == 3 and result.output_tokens == 2 and len(result.gaps_s) == 1 and result.ttft_s is not None


def test_markdown_rows_name_the_run_its_tags_and_errors() -> None:
    results = (_result(0, 0.0, 0.5, 2.5, 5, tag="decode"), _result(1, 0.0, 0.2, 1.0, 3, "CANCELLED", tag="long"))
    lines = markdown_table([BenchRun("my run", "t", "w", "1 concurrent", None, Slo(), results)])
    assert len(lines) == 5 and lines[2].startswith("| my run | 1/2 |") and "CANCELLED ×1" in lines[2]
    assert lines[3].startswith("| my run — `decode` requests | 1/1 |")


def test_the_grpc_target_sends_its_metadata_and_priority_with_every_request() -> None:
    """bench-tenants names a tenant (x-tenant metadata) and a priority per target."""
    calls: list[tuple[Sampling, object]] = []

    class Client:
        async def generate(
            self, prompt: list[int], sampling: Sampling, *, metadata: object = ()
        ) -> AsyncIterator[object]:
            calls.append((sampling, metadata))
            yield type("Chunk", (), {"token_ids": [1, 2]})()

    target = GrpcTarget("127.0.0.1:1", (("x-tenant", "light"),), priority=-10)
    target.client = Client()  # type: ignore[assignment]
    result = RequestResult(0, "", 3, 2, 0.0)
    asyncio.run(target.send(RequestSpec((1, 2, 3), 2), result))
    ((sampling, metadata),) = calls
    assert metadata == (("x-tenant", "light"),) and sampling.priority == -10
    assert result.ok and result.output_tokens == 2
    assert GrpcTarget("127.0.0.1:1").metadata == () and GrpcTarget("127.0.0.1:1").priority is None
