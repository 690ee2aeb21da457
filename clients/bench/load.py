"""The load generator: sends a workload's requests to a target by a schedule, a Poisson rate or a fixed
number of concurrent streams, and times each one.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from infer.clients.bench.targets import RequestResult, Target
from infer.clients.bench.workloads import RequestSpec, Workload


@dataclass(frozen=True)
class LoadPlan:
    """How requests arrive. One of: `rate` (Poisson, requests/s), `concurrency` (streams at once), or the
    workload's own schedule or concurrency when neither is set."""

    rate: float | None = None
    concurrency: int | None = None
    seed: int = 0
    warmup: int = 0  # requests sent (one at a time) before timing starts: the workload's own warm-up, else its first
    duration_s: float | None = None  # no request is sent after this; those in flight finish
    progress: bool = True

    def describe(self, work: Workload) -> str:
        if self.rate is not None:
            return f"Poisson {self.rate:g} req/s"
        concurrency = self.concurrency or work.concurrency
        if concurrency is not None:
            return f"{concurrency} concurrent"
        if work.has_schedule:
            return "the workload's schedule"
        return "all at once"


def arrival_offsets(num: int, rate: float, seed: int) -> list[float]:
    """Poisson arrivals: exponential gaps of mean 1/rate, the first at 0."""
    rng, at, offsets = random.Random(seed), 0.0, []
    for _ in range(num):
        offsets.append(at)
        at += rng.expovariate(rate)
    return offsets


class _Progress:
    def __init__(self, total: int, enabled: bool, label: str) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit="req", leave=False)

    def step(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class LoadRun:
    def __init__(self, target: Target, plan: LoadPlan, label: str) -> None:
        self.target, self.plan, self.label = target, plan, label
        self.results: list[RequestResult] = []
        self.start = 0.0
        self.progress: _Progress | None = None

    def _expired(self) -> bool:
        return self.plan.duration_s is not None and time.perf_counter() - self.start >= self.plan.duration_s

    async def _one(self, index: int, spec: RequestSpec) -> None:
        result = RequestResult(index, spec.tag, len(spec.prompt), spec.max_tokens, time.perf_counter() - self.start)
        try:
            await self.target.send(spec, result)
        except Exception as e:  # a client-side failure counts against this request, not the run
            result.status, result.error = type(e).__name__, str(e)[:300]
        self.results.append(result)
        if self.progress is not None:
            self.progress.step()

    async def _at(self, index: int, spec: RequestSpec, at_s: float) -> None:
        await asyncio.sleep(max(0.0, self.start + at_s - time.perf_counter()))
        if not self._expired():
            await self._one(index, spec)

    async def _worker(self, queue: asyncio.Queue[tuple[int, RequestSpec]]) -> None:
        while not queue.empty() and not self._expired():
            index, spec = queue.get_nowait()
            await self._one(index, spec)

    async def run(self, work: Workload) -> list[RequestResult]:
        specs = list(work.requests)
        warm = list(work.warmup) or specs[: self.plan.warmup]
        for spec in warm:  # one at a time, not recorded
            await self.target.send(spec, RequestResult(-1, "warmup", len(spec.prompt), spec.max_tokens, 0.0))
        self.progress = _Progress(len(specs), self.plan.progress, self.label)
        self.start = time.perf_counter()
        try:
            await self._dispatch(work, specs)
        finally:
            self.progress.close()
        return sorted(self.results, key=lambda r: r.index)

    async def _dispatch(self, work: Workload, specs: Sequence[RequestSpec]) -> None:
        plan = self.plan
        concurrency = plan.concurrency or (None if plan.rate is not None else work.concurrency)
        if plan.rate is not None:
            offsets: list[float] = arrival_offsets(len(specs), plan.rate, plan.seed)
        elif concurrency is None:
            offsets = [s.at_s or 0.0 for s in specs]
        if concurrency is None:
            await asyncio.gather(*(self._at(i, s, at) for i, (s, at) in enumerate(zip(specs, offsets, strict=True))))
            return
        queue: asyncio.Queue[tuple[int, RequestSpec]] = asyncio.Queue()
        for item in enumerate(specs):
            queue.put_nowait(item)
        await asyncio.gather(*(self._worker(queue) for _ in range(concurrency)))


async def run_load(target: Target, work: Workload, plan: LoadPlan, label: str = "") -> list[RequestResult]:
    """Every request's result, in workload order (those never sent, past the duration cap, are absent)."""
    return await LoadRun(target, plan, label or work.name).run(work)
