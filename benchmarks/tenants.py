"""`make bench-tenants`: many tenants on one server, the scheduling policies side by side (issue 30).

One `infer serve` per setup, on the default model (int4 weights, `--max-num-seqs 16`), the tenant named by the
gRPC metadata `x-tenant` (`--tenant-header x-tenant`, weights from `--tenants FILE`). Setups: `fcfs`,
`priority`, `fair 1:1` (heavy and light weigh 1) and `fair 1:2` (light weighs 2). Every request: 128 random
prompt tokens, 16-48 new tokens, greedy, `ignore_eos`, over gRPC `Generate`; the load generator is `infer bench`'s.

- alone (fcfs, priority, fair 1:1): before the load, the light tenant's requests one at a time on the idle server:
  its TTFT alone, against which that server's loaded figures are read.
- contention (fcfs, priority, fair 1:1): the heavy tenant keeps 32 streams open (twice the engine's sequences:
  it is never idle and always queued); once it has filled the engine, the light tenant sends its requests at a
  Poisson rate (0.5 req/s: about a tenth of the heavy tenant's requests), and a few priority -10 requests (the
  probes, tenant light) arrive at fixed times. The heavy load stops when the light tenant's requests are done.
  Figures: the light tenant's TTFT P50/P99, the probes' TTFT (under priority against their prefill time, the
  solo TTFT of the same shape on the same server, plus two steps, the heavy requests' mean inter-token gap),
  total output tok/s while the light tenant's load ran, against fcfs in the same round.
- shares (fcfs, fair 1:1, fair 1:2): both tenants backlogged (32 heavy streams, 16 light), each tenant's share
  of the output tokens produced in the window (from 4 s in, or from when both tenants have had a first token,
  to the stop), against its weight share; total output tok/s against fcfs.
- contention over HTTP (fcfs, priority, fair 1:1): the contention phase again through the server's OpenAI gateway
  (streamed /v1/completions, the tenant in the `x-tenant` header, the probes' `priority` in the body). The server
  runs with `--max-streams-per-connection 24`, fewer than the heavy tenant's 32 streams: a cap that once queued the
  flood in the gateway's one gRPC connection ahead of the scheduler (issue 38; 200 streams over the default 100).
  The load generator's gRPC client opens a connection per 24 streams too. Its alone and probe-prefill TTFTs are over
  HTTP too.
Every phase also reads the server's own counters (COUNTERS, /metrics) before and after: preemptions, prompt and
output tokens, steps and their busy time. The throughput goal is output tokens per busy second of the engine against
fcfs's in the same round (the engine's idle time and the load generator's do not count); the client's output tok/s
is shown beside it. The light tenant's goal: its TTFT P99 under contention within its TTFT alone (P50) plus two mean
steps (the heavy requests' mean inter-token gap in the phase), the bound the priority probes have.
A round runs the setups in order, the next round in reverse order. Writes docs/benchmarks/tenants.json, .md, .png.

    python benchmarks/tenants.py [--rounds N] [--quick] [--light-rate R] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from serving_servers import Running, infer_server
from tenants_report import HEAVY, HTTP_PHASE, LIGHT, PROBE, goals, phase_figures, summarize, write_report

from infer.clients.bench.load import LoadPlan, LoadRun
from infer.clients.bench.targets import GrpcTarget, OpenAITarget, RequestResult, Target
from infer.clients.bench.workloads import FIRST_ID, RequestSpec, Workload

OUT_DIR = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
TENANT_HEADER = "x-tenant"
MAX_SEQS, NUM_BLOCKS, PROMPT_TOKENS, NEW_TOKENS, VOCAB_LIMIT = 16, 512, 128, 32, 32_000
STREAMS_PER_CONNECTION = 24  # the server's cap on one gRPC connection's streams: below the heavy tenant's 32
PROBE_PRIORITY, PROBE_TOKENS = -10, 4
COUNTERS = {  # the phase's figure: the server's Prometheus counter
    "preemptions": "infer_preemptions_total",
    "prompt_tokens": "infer_prompt_tokens_total",
    "cached_tokens": "infer_prefix_cache_hit_tokens_total",
    "generation_tokens": "infer_generation_tokens_total",
    "steps": "infer_steps_total",
    "step_s": "infer_step_time_seconds_total",  # the steps' time: the engine busy, not idle
}
SETUPS: dict[str, dict[str, Any]] = {
    "fcfs": {"policy": "fcfs", "weights": {}, "phases": ("contention", HTTP_PHASE, "shares")},
    "priority": {"policy": "priority", "weights": {}, "phases": ("contention", HTTP_PHASE)},
    "fair 1:1": {"policy": "fair", "weights": {HEAVY: 1.0, LIGHT: 1.0}, "phases": ("contention", HTTP_PHASE, "shares")},
    "fair 1:2": {"policy": "fair", "weights": {HEAVY: 1.0, LIGHT: 2.0}, "phases": ("shares",)},
}


@dataclass(frozen=True)
class Config:
    heavy_streams: int = 32
    light_streams: int = 16  # shares: the light tenant backlogged too
    light_rate: float = 0.5  # contention: the light tenant's requests/s (Poisson)
    light_requests: int = 20
    alone_requests: int = 10
    num_probes: int = 5
    probe_gap_s: float = 7.0  # between probes, the first at one gap after the light load starts
    settle_s: float = 4.0  # the heavy load alone before the light one starts; the shares' window starts here
    shares_s: float = 30.0

    @classmethod
    def quick(cls) -> Config:
        return cls(light_requests=6, alone_requests=4, num_probes=2, probe_gap_s=3.0, shares_s=12.0)


def requests(seed: str, count: int, max_tokens: int | None = None) -> tuple[RequestSpec, ...]:
    """Fresh random prompts (no prefix-cache hits across phases: every phase has its own seed); `max_tokens`, else
    NEW_TOKENS / 2 to 3/2 x NEW_TOKENS, so that requests started together do not all end in the same step."""
    rng = random.Random(seed)
    return tuple(
        RequestSpec(tuple(rng.randrange(FIRST_ID, VOCAB_LIMIT) for _ in range(PROMPT_TOKENS)),
                    max_tokens or rng.randint(NEW_TOKENS // 2, NEW_TOKENS * 3 // 2))
        for _ in range(count)
    )  # fmt: skip


class Stoppable:
    """A target whose requests end when `stop` is set: those in flight are cancelled (the engine aborts them; the
    tokens they got are kept, status 'stopped'), later ones are not sent."""

    def __init__(self, target: Target, stop: asyncio.Event) -> None:
        self.target, self.stop, self.name = target, stop, target.name

    async def send(self, spec: RequestSpec, result: RequestResult) -> None:
        if self.stop.is_set():
            result.status = "stopped"
            return
        inner = asyncio.ensure_future(self.target.send(spec, result))
        halt = asyncio.ensure_future(self.stop.wait())
        await asyncio.wait({inner, halt}, return_when=asyncio.FIRST_COMPLETED)
        halt.cancel()
        if not inner.done():
            inner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await inner
            result.status = "stopped"

    async def close(self) -> None:
        await self.target.close()


def grpc(server: Running, tenant: str, priority: int | None = None) -> GrpcTarget:
    assert server.grpc is not None
    return GrpcTarget(server.grpc, ((TENANT_HEADER, tenant),), priority, STREAMS_PER_CONNECTION)


_MODELS: dict[str, str] = {}  # a server's model name, by its base URL (asked once, not by every stream)


def http(server: Running, tenant: str, priority: int | None = None) -> OpenAITarget:
    """Streamed /v1/completions through the server's gateway, the tenant in its header."""
    if server.http not in _MODELS:
        _MODELS[server.http] = str(httpx.get(f"{server.http}/models", timeout=10).json()["data"][0]["id"])
    extra = {} if priority is None else {"priority": priority}
    return OpenAITarget(server.http, "completions", _MODELS[server.http], extra, {TENANT_HEADER: tenant})


def target(server: Running, tenant: str, priority: int | None = None, door: str = "grpc") -> Target:
    return grpc(server, tenant, priority) if door == "grpc" else http(server, tenant, priority)


def loaded(runs: dict[str, tuple[LoadRun, list[RequestResult]]], t0: float) -> dict[str, Any]:
    return {tenant: (run.start - t0, [r for r in results if r.status != "stopped" or r.output_tokens])
            for tenant, (run, results) in runs.items()}  # fmt: skip


async def solo(
    server: Running, specs: tuple[RequestSpec, ...], tenant: str, priority: int | None = None, door: str = "grpc"
) -> list[float]:
    """TTFTs of these requests one at a time on an idle server (over gRPC, or HTTP through its gateway)."""
    solo_target = target(server, tenant, priority, door)
    try:
        run = LoadRun(solo_target, LoadPlan(concurrency=1, progress=False), tenant)
        results = await run.run(Workload(tenant, "solo", specs))
    finally:
        await solo_target.close()
    return [r.ttft_s for r in results if r.ok and r.ttft_s is not None]


async def contention(server: Running, cfg: Config, seed: str, door: str = "grpc") -> dict[str, Any]:
    """`door`: grpc, or http (through the server's gateway)."""
    stop, t0 = asyncio.Event(), time.perf_counter()
    heavy_target = Stoppable(target(server, HEAVY, door=door), stop)
    light_target, probe_target = target(server, LIGHT, door=door), target(server, LIGHT, PROBE_PRIORITY, door)
    heavy = LoadRun(heavy_target, LoadPlan(concurrency=cfg.heavy_streams, progress=False), HEAVY)
    heavy_task = asyncio.ensure_future(heavy.run(Workload(HEAVY, "", requests(f"{seed}h", 4000))))
    await asyncio.sleep(cfg.settle_s)
    light = LoadRun(light_target, LoadPlan(rate=cfg.light_rate, progress=False), LIGHT)
    probes = LoadRun(probe_target, LoadPlan(progress=False), PROBE)
    at = [cfg.probe_gap_s * (i + 1) for i in range(cfg.num_probes)]
    probe_specs = tuple(RequestSpec(s.prompt, s.max_tokens, a) for s, a in
                        zip(requests(f"{seed}p", cfg.num_probes, PROBE_TOKENS), at, strict=True))  # fmt: skip
    try:
        light_results, probe_results = await asyncio.gather(
            light.run(Workload(LIGHT, "", requests(f"{seed}l", cfg.light_requests))),
            probes.run(Workload(PROBE, "", probe_specs)),
        )
    finally:
        stop.set()
        end = time.perf_counter() - t0
        heavy_results = await heavy_task
        for each in (heavy_target, light_target, probe_target):
            await each.close()
    runs = {HEAVY: (heavy, heavy_results), LIGHT: (light, light_results), PROBE: (probes, probe_results)}
    return phase_figures(loaded(runs, t0), (light.start - t0, end), end)


async def shares(server: Running, cfg: Config, seed: str) -> dict[str, Any]:
    stop, t0 = asyncio.Event(), time.perf_counter()
    targets = {t: Stoppable(grpc(server, t), stop) for t in (HEAVY, LIGHT)}
    streams = {HEAVY: cfg.heavy_streams, LIGHT: cfg.light_streams}
    runs = {t: LoadRun(targets[t], LoadPlan(concurrency=streams[t], progress=False), t) for t in targets}
    tasks = {t: asyncio.ensure_future(runs[t].run(Workload(t, "", requests(f"{seed}{t}", 4000)))) for t in runs}
    await asyncio.sleep(cfg.shares_s)
    stop.set()
    end = time.perf_counter() - t0
    results = {t: (runs[t], await task) for t, task in tasks.items()}
    for target in targets.values():
        await target.close()
    tenants = loaded(results, t0)
    first = [min((offset + r.sent_s + r.ttft_s for r in rs if r.ttft_s is not None), default=end)
             for offset, rs in tenants.values()]  # fmt: skip
    return phase_figures(tenants, (max(cfg.settle_s, *first), end), end)  # from when every tenant is served


@contextlib.contextmanager
def serve(name: str, log_dir: Path, tag: str) -> Iterator[Running]:
    setup = SETUPS[name]
    tenants = log_dir / f"tenants-{setup['policy']}-{tag}.txt"
    tenants.write_text("".join(f"{t} {w:g}\n" for t, w in (setup["weights"] or {HEAVY: 1, LIGHT: 1}).items()))
    flags = ("--quantization", "int4", "--max-num-seqs", str(MAX_SEQS), "--num-blocks", str(NUM_BLOCKS),
             "--scheduling-policy", setup["policy"], "--tenant-header", TENANT_HEADER,
             "--tenants", str(tenants), "--http-metrics",
             "--max-streams-per-connection", str(STREAMS_PER_CONNECTION))  # fmt: skip
    with infer_server(f"{name.replace(' ', '-').replace(':', '-')}-{tag}", flags, log_dir) as server:
        yield server


def run_setup(name: str, cfg: Config, log_dir: Path, tag: str) -> dict[str, Any]:
    """One server: the light tenant's TTFTs alone (before a contention phase), its phases' figures."""
    out: dict[str, Any] = {}
    with serve(name, log_dir, tag) as server:
        asyncio.run(solo(server, requests(f"{tag}{name}w", 2), HEAVY))  # warm-up
        for door, suffix in (("grpc", ""), ("http", "_http")):
            if "contention" in SETUPS[name]["phases"]:
                alone = requests(f"{tag}{name}a{suffix}", cfg.alone_requests)
                out[f"alone{suffix}_ttft_s"] = asyncio.run(solo(server, alone, LIGHT, door=door))
            if name == "priority":
                probe = requests(f"{tag}s{suffix}", 3, PROBE_TOKENS)
                out[f"probe_solo{suffix}_ttft_s"] = asyncio.run(solo(server, probe, LIGHT, PROBE_PRIORITY, door))
        for phase in SETUPS[name]["phases"]:
            seed = f"{tag}{name}{phase}"
            run = shares(server, cfg, seed) if phase == "shares" else contention(server, cfg, seed, door_of(phase))
            out[phase] = counted(server, run)
            print(f"  {name} {phase}: {summary_line(out[phase])}", flush=True)
    log = server.log.read_text(errors="replace")
    out["cpu_threads"] = re.findall(r"CPU threads (\d+ -> \d+)", log)
    out["kernels"] = "".join(re.findall(r"kernels: (.*?) \(INFER_KERNELS", log)[:1])
    return out


def door_of(phase: str) -> str:
    return "http" if phase == HTTP_PHASE else "grpc"


def counted(server: Running, phase: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """Runs a phase; its figures gain `engine`: how much each of the server's COUNTERS grew meanwhile."""
    before = engine_counters(server)
    out = asyncio.run(phase)
    after = engine_counters(server)
    out["engine"] = {key: after[key] - before[key] for key in COUNTERS}
    return out


def engine_counters(server: Running) -> dict[str, float]:
    text = httpx.get(server.http.removesuffix("/v1") + "/metrics", timeout=10).text
    return {key: metric_value(text, name) for key, name in COUNTERS.items()}


def metric_value(text: str, name: str) -> float:
    """An unlabelled sample's value in Prometheus' text format."""
    found = re.search(rf"^{re.escape(name)}(?:{{}})? (\S+)$", text, re.MULTILINE)
    if found is None:
        raise ValueError(f"{name} is not in the server's /metrics")
    return float(found.group(1))


def summary_line(p: dict[str, Any]) -> str:
    cells = [f"{t} {v['tok_s']:.1f} tok/s" for t, v in p["tenants"].items() if t != PROBE]
    return ", ".join(cells) + f", total {p['total_tok_s']:.1f}"


def run_round(index: int, cfg: Config, log_dir: Path) -> dict[str, Any]:
    order = list(SETUPS) if index % 2 == 0 else list(reversed(SETUPS))
    out: dict[str, Any] = {"order": order, "setups": {}}
    for name in order:
        print(f"round {index + 1}: {name}", flush=True)
        out["setups"][name] = run_setup(name, cfg, log_dir, f"r{index + 1}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="shorter phases (checks the script)")
    rate_help = "the light tenant's requests/s under contention (default 0.5: about a tenth of the heavy tenant's"
    ap.add_argument("--light-rate", type=float, help=rate_help + " on 2 quiet cores; the report gives the ratio)")
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = ap.parse_args(argv)
    from models import machine  # NOTE: here: it imports torch, which the report's tests do not need

    cfg = Config.quick() if args.quick else Config()
    if args.light_rate:
        cfg = replace(cfg, light_rate=args.light_rate)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-tenants-"))
    load_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    start = time.monotonic()
    rounds = [run_round(i, cfg, log_dir) for i in range(args.rounds)]
    table = summarize(rounds, SETUPS)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": machine()["cpu"],
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "wall_s": time.monotonic() - start,
        "config": vars(cfg)
        | {
            "max_num_seqs": MAX_SEQS,
            "prompt_tokens": PROMPT_TOKENS,
            "new_tokens": NEW_TOKENS,
            "streams_per_connection": STREAMS_PER_CONNECTION,
        },
        "workload": workload_text(cfg),
        "rounds": rounds,
        "table": table,
        "goals": goals(table),
        "notes": notes(rounds, table, log_dir),
    }
    for path in write_report(result, args.out_dir):
        print(f"wrote {path}")
    print((args.out_dir / "tenants.md").read_text())
    return 0


def workload_text(cfg: Config) -> str:
    return (f"The default model, int4 weights, `--max-num-seqs {MAX_SEQS}`; every request {PROMPT_TOKENS} random "
            f"prompt tokens and {NEW_TOKENS // 2}-{NEW_TOKENS * 3 // 2} new tokens (greedy, `ignore_eos`) over gRPC "
            "(and, in the contention phase over HTTP, the gateway's streamed /v1/completions), "
            f"`--max-streams-per-connection {STREAMS_PER_CONNECTION}`; the tenant in the `{TENANT_HEADER}` metadata "
            "or header. "
            "The phases: benchmarks/tenants.py's docstring.")  # fmt: skip


def notes(rounds: list[dict[str, Any]], table: dict[str, Any], log_dir: Path) -> list[str]:
    out = [f"P99 of {table['alone']['count']} (alone, all servers) or about 20 samples (each server) is near the "
           "maximum: read it as the worst light request.",
           "The priority goal's prefill is the solo TTFT of the probe's shape (128 prompt tokens) on the same server, "
           "idle, before its load; a step is the heavy requests' median inter-token gap in the same phase (a step "
           "of 16 decodes; the mean gap counts the steps that also carry a heavy request's prefill). The probes are "
           "tenant light, priority -10; under fcfs the priority is ignored, under fair it orders the light tenant's "
           "own requests only. The light tenant's goal uses the same mean step over its own alone TTFT: a request "
           "that arrives waits for the step in flight, then shares the next one with the running decodes.",
           "heavy : light requests: heavy requests completed / light requests sent in the contention phase (the "
           "issue's 10x; `--light-rate` changes the light tenant's rate).",
           f"server logs: {log_dir}"]  # fmt: skip
    moves = [
        f"{name}: {', '.join(setup['cpu_threads']) or 'none'}" for r in rounds for name, setup in r["setups"].items()
    ]
    out.append("The servers' CPU threads follow the free cores (engine/threads.py; the load generator shares the "
               f"cores); their moves: {'; '.join(moves)}.")  # fmt: skip
    kernels = {name: setup["kernels"] for r in rounds for name, setup in r["setups"].items()}
    if len(set(kernels.values())) > 1:
        out.append(f"NOT COMPARABLE: the servers ran different kernels (a source change mid-run?): {kernels}.")
    else:
        out.append(f"Every server ran the {next(iter(kernels.values()), '?')}.")
    failed = {
        f"{n} ({phase})": row["failed"]
        for phase in ("contention", HTTP_PHASE, "shares")
        for n, row in table[phase].items()
        if row["failed"]
    }
    if failed:
        out.append(f"failed requests (not counted): {failed}")
    return out


if __name__ == "__main__":
    sys.exit(main())
