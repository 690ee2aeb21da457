"""A run's summary: throughput, latency percentiles, goodput under SLOs, errors by status."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from infer.clients.bench.targets import RequestResult

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Slo:
    """A request meets the SLOs when every set bound holds (None = no bound)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def met(self, r: RequestResult) -> bool:
        if not r.ok or r.ttft_s is None:
            return False
        tpot = r.tpot_s or 0.0
        return (
            (self.ttft_s is None or r.ttft_s <= self.ttft_s)
            and (self.tpot_s is None or tpot <= self.tpot_s)
            and (self.e2e_s is None or r.e2e_s <= self.e2e_s)
        )


def percentile(values: Sequence[float], p: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default); nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Stats:
    mean: float
    p50: float
    p90: float
    p99: float
    count: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        mean = sum(values) / len(values) if values else math.nan
        p50, p90, p99 = (percentile(values, p) for p in PERCENTILES)
        return cls(mean, p50, p90, p99, len(values))


def max_overlap(intervals: Sequence[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end at t closes before a start at t opens)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    best = current = 0
    for _, step in events:
        current += step
        best = max(best, current)
    return best


@dataclass(frozen=True)
class Summary:
    num_requests: int
    num_ok: int
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float
    input_tokens_per_s: float
    ttft_s: Stats
    itl_s: Stats
    tpot_s: Stats
    e2e_s: Stats
    goodput_requests_per_s: float
    slo_attainment: float  # share of all requests that met the SLOs
    max_concurrent_decoding: int  # most requests streaming output at once, as the client saw them
    errors: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(results: Sequence[RequestResult], slo: Slo | None = None, tag: str | None = None) -> Summary:
    """Summary of the results (those with `tag` when given). Duration: first send to last end of those."""
    slo = slo or Slo()
    chosen = [r for r in results if tag is None or r.tag == tag]
    ok = [r for r in chosen if r.ok]
    duration = max((r.sent_s + r.e2e_s for r in chosen), default=0.0) - min((r.sent_s for r in chosen), default=0.0)
    per_s = 1.0 / duration if duration > 0 else math.nan
    decoding = [(r.sent_s + r.ttft_s, r.sent_s + r.e2e_s) for r in ok if r.ttft_s is not None]
    met = sum(slo.met(r) for r in chosen)
    return Summary(
        num_requests=len(chosen),
        num_ok=len(ok),
        duration_s=duration,
        requests_per_s=len(ok) * per_s,
        output_tokens_per_s=sum(r.output_tokens for r in ok) * per_s,
        input_tokens_per_s=sum(r.prompt_tokens for r in ok) * per_s,
        ttft_s=Stats.of([r.ttft_s for r in ok if r.ttft_s is not None]),
        itl_s=Stats.of([g for r in ok for g in r.gaps_s]),
        tpot_s=Stats.of([t for r in ok if (t := r.tpot_s) is not None]),
        e2e_s=Stats.of([r.e2e_s for r in ok]),
        goodput_requests_per_s=met * per_s,
        slo_attainment=met / len(chosen) if chosen else math.nan,
        max_concurrent_decoding=max_overlap(decoding),
        errors=dict(Counter(r.status for r in chosen if not r.ok)),
    )


@dataclass(frozen=True)
class BenchRun:
    label: str  # e.g. "grpc, Poisson 1 req/s"
    target: str
    workload: str
    load: str
    rate: float | None
    slo: Slo
    results: tuple[RequestResult, ...]

    @property
    def summary(self) -> Summary:
        return summarize(self.results, self.slo)

    def by_tag(self) -> dict[str, Summary]:
        tags = sorted({r.tag for r in self.results if r.tag})
        return {tag: summarize(self.results, self.slo, tag) for tag in tags} if len(tags) > 1 else {}

    def to_json(self, with_requests: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "label": self.label, "target": self.target, "workload": self.workload, "load": self.load,
            "rate": self.rate, "slo": asdict(self.slo), "summary": self.summary.to_json(),
            "by_tag": {tag: s.to_json() for tag, s in self.by_tag().items()},
        }  # fmt: skip
        if with_requests:
            out["requests"] = [asdict(r) for r in self.results]
        return out
