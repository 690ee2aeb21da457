"""`infer bench`: load-test a running server over gRPC `Generate` or its OpenAI HTTP endpoints."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from infer.api import DEFAULT_ADDRESS
from infer.clients.bench.load import LoadPlan, run_load
from infer.clients.bench.metrics import BenchRun, Slo
from infer.clients.bench.report import markdown, write_outputs
from infer.clients.bench.targets import PROTOCOLS, Json, make_target
from infer.clients.bench.workloads import WORKLOADS, WorkloadOptions, make_workload
from infer.clients.client import AsyncInferClient
from infer.clients.types import InferError

DEFAULT_HTTP = "http://127.0.0.1:8000/v1"
DEFAULT_VOCAB = 49152  # SmolLM2's; over HTTP the server's vocabulary is not asked


@dataclass(frozen=True)
class BenchArgs:
    protocol: str
    target: str
    workload: str
    options: WorkloadOptions
    plan: LoadPlan
    rates: tuple[float, ...]  # a sweep: one run per rate (empty: one run by `plan`)
    slo: Slo
    model: str | None = None
    http_extra: Json | None = None


def _ms(value: float | None) -> float | None:
    return None if value is None else value / 1000


def _rates(text: str | None) -> tuple[float, ...]:
    if not text:
        return ()
    rates = tuple(float(x) for x in text.split(","))
    if any(r <= 0 for r in rates):
        raise ValueError("--rate: every rate must be > 0")
    return rates


def _target(args: argparse.Namespace) -> str:
    return str(args.target or (DEFAULT_ADDRESS if args.protocol == "grpc" else DEFAULT_HTTP))


async def _vocab_size(args: argparse.Namespace, target: str) -> int:
    if args.vocab_size is not None:
        return int(args.vocab_size)
    if args.protocol != "grpc":
        return DEFAULT_VOCAB
    async with AsyncInferClient(target, timeout_s=30) as client:
        return (await client.model_info()).vocab_size


def bench_args(args: argparse.Namespace, vocab_size: int) -> BenchArgs:
    target = _target(args)
    options = WorkloadOptions(vocab_size, args.seed, args.num_requests, args.max_tokens, args.time_scale)
    rates = _rates(args.rate)
    work = make_workload(args.workload, options)
    if not rates and args.concurrency is None and work.rates:
        rates = work.rates  # `mixed`: its own sweep
    plan = LoadPlan(None, args.concurrency, args.seed, args.warmup, args.duration_s, not args.no_progress)
    slo = Slo(_ms(args.slo_ttft_ms), _ms(args.slo_tpot_ms), _ms(args.slo_e2e_ms))
    extra = json.loads(args.http_extra) if args.http_extra else None
    if extra is not None and not isinstance(extra, dict):
        raise ValueError("--http-extra: must be a JSON object")
    return BenchArgs(args.protocol, target, args.workload, options, plan, rates, slo, args.model, extra)


async def run_bench(b: BenchArgs) -> list[BenchRun]:
    """One run, or one per rate of a sweep, against one target."""
    work = make_workload(b.workload, b.options)
    target = make_target(b.protocol, b.target, b.model, b.http_extra)
    runs = []
    try:
        plans = [LoadPlan(r, None, b.plan.seed, b.plan.warmup, b.plan.duration_s, b.plan.progress) for r in b.rates]
        for plan in plans or [b.plan]:
            label = f"{b.protocol}, {plan.describe(work)}"
            results = await run_load(target, work, plan, label)
            runs.append(BenchRun(label, target.name, work.name, plan.describe(work), plan.rate, b.slo, tuple(results)))
    finally:
        await target.close()
    return runs


async def _main(args: argparse.Namespace) -> int:
    b = bench_args(args, await _vocab_size(args, _target(args)))
    runs = await run_bench(b)
    print(markdown(runs))
    if args.out_dir is not None:
        for path in write_outputs(runs, Path(args.out_dir), args.stem, plots=not args.no_plots):
            print(f"wrote {path}", file=sys.stderr)
    return 0 if all(r.summary.num_ok for r in runs) else 1


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_main(args))
    except InferError as e:
        print(f"error: {e.code.name}: {e.details}", file=sys.stderr)
        return 1
    except json.JSONDecodeError as e:
        print(f"error: --http-extra: {e}", file=sys.stderr)
        return 2


def add_bench_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bench",
        help="load-test a running server (gRPC or OpenAI HTTP): TTFT, ITL, TPOT, E2E, throughput, goodput",
        description="Sends a seeded workload of token-id prompts (ignore_eos, greedy) and times every token.",
    )
    p.add_argument("--protocol", choices=PROTOCOLS, default="grpc", help="grpc Generate, or OpenAI completions/chat")
    p.add_argument("--target", default=os.environ.get("INFER_BENCH_TARGET"),
                   help=f"host:port for grpc (default {DEFAULT_ADDRESS}), a base URL for HTTP "
                   f"(default {DEFAULT_HTTP}) [env INFER_BENCH_TARGET]")  # fmt: skip
    p.add_argument("--workload", choices=tuple(WORKLOADS), default="baseline")
    p.add_argument("--num-requests", type=int, default=None, help="default: the workload's own count")
    p.add_argument("--rate", default=None, help="Poisson arrivals, requests/s; a comma list sweeps (0.5,1,2)")
    p.add_argument("--concurrency", type=int, default=None, help="a fixed number of streams at once instead")
    p.add_argument("--seed", type=int, default=0, help="workload and arrival seed")
    p.add_argument("--warmup", type=int, default=1, help="requests sent before timing (the workload's own if any)")
    p.add_argument("--duration-s", type=float, default=None, help="send no request after this many seconds")
    p.add_argument("--max-tokens", type=int, default=None, help="cap every request's new tokens")
    p.add_argument("--time-scale", type=float, default=1.0, help="stretch a scheduled workload's arrival times")
    p.add_argument("--slo-ttft-ms", type=float, default=None, help="goodput: TTFT bound")
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="goodput: time-per-output-token bound")
    p.add_argument("--slo-e2e-ms", type=float, default=None, help="goodput: end-to-end bound")
    p.add_argument("--model", default=None, help="the model name sent over HTTP (default: the first of GET /models)")
    p.add_argument(
        "--http-extra",
        default=None,
        help="a JSON object merged into each HTTP body, e.g. '{\"skip_special_tokens\": false}'",
    )
    p.add_argument("--vocab-size", type=int, default=None, help="prompt ids below this (grpc: asked of the server)")
    p.add_argument("--out-dir", default=None, help="write STEM.json, STEM.md and PNG plots here")
    p.add_argument("--stem", default="bench", help="file name stem of the outputs")
    p.add_argument("--no-plots", action="store_true", help="JSON and Markdown only")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
