"""`make bench-serving`'s comparison with llama.cpp: every precision (and speculation on/off) of `infer serve` and
`llama-server`, both over the OpenAI `/v1/completions` endpoint with the same token-id prompts, in rounds.

Each round starts every server in turn (the order reversed every other round, so a drift of the shared machine's
speed falls on both sides), runs the input-grounded and the random-token workload at batch 1 and at 16 concurrent,
and stops it. Caches are cold: infer runs with `--no-enable-prefix-caching`, llama-server gets `cache_prompt: false`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_matrix import (
    LLAMA,
    NO_SPECULATION,
    Figures,
    MatrixWork,
    Round,
    Speculation,
    Variant,
    grounded_ids,
    matrix_workloads,
    precisions,
    variants,
)
from serving_servers import LLAMA_SERVER, Running, infer_server, llama_server, repack_probe

from infer.clients.bench.load import LoadPlan, run_load
from infer.clients.bench.metrics import Summary, summarize
from infer.clients.bench.targets import make_target
from infer.clients.bench.workloads import Workload
from infer.engine.default_model import default_model_dir
from infer.engine.tokenizer import Tokenizer

PEER_SLOTS = 16


@dataclass(frozen=True)
class PeerOptions:
    rounds: int
    work: MatrixWork
    precisions: tuple[str, ...]  # names from bench_matrix.precisions()
    speculation: Speculation | None
    base_flags: tuple[str, ...]  # every infer server's flags (the max model length)
    progress: bool = False
    with_llama: bool = True

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError("rounds must be >= 1")
        unknown = set(self.precisions) - set(precisions())
        if unknown:
            raise ValueError(f"unknown precision(s) {sorted(unknown)}: one of {', '.join(precisions())}")


def figures(s: Summary) -> Figures:
    """What the tables show of one run: output tok/s, decode tok/s (1 / mean TPOT), median TTFT."""
    return {"output_tok_s": s.output_tokens_per_s, "decode_tok_s": 1 / s.tpot_s.mean if s.tpot_s.mean else 0.0,
            "ttft_p50_s": s.ttft_s.p50}  # fmt: skip


async def drive(server: Running, workloads: dict[str, Workload], extra: dict[str, Any] | None,
                progress: bool) -> dict[str, Figures]:  # fmt: skip
    """Every workload on one server over HTTP, one after the other; each first sends one request untimed."""
    target = make_target("completions", server.http, None, extra)
    out = {}
    try:
        for key, work in workloads.items():
            plan = LoadPlan(concurrency=work.concurrency, warmup=1, progress=progress)
            results = await run_load(target, work, plan, f"{server.name} {key}")
            failed = [f"{r.status} {r.error}" for r in results if not r.ok]
            if failed:
                raise RuntimeError(f"{key}: {len(failed)} request(s) failed, first: {failed[0]}")
            out[key] = figures(summarize(results))
            print(f"  {server.name} {key}: " + ", ".join(f"{k} {v:.3g}" for k, v in out[key].items()), flush=True)
    finally:
        await target.close()
    return out


def infer_flags(variant: Variant, opts: PeerOptions, context_tokens: int) -> tuple[str, ...]:
    """`infer serve`'s flags: the KV cache holds what llama-server's context does (16 slots' worth of the longest
    request, a block of slack each), no prefix caching, the precision, speculation on or off."""
    blocks = -(-context_tokens // 16) + PEER_SLOTS
    flags = [*opts.base_flags, "--num-blocks", str(blocks), "--no-enable-prefix-caching"]
    for name, value in precisions()[variant.precision].items():
        flags += [f"--{name}", value]
    if opts.speculation is not None:  # NOTE: "off" is explicit: the server's default may be on
        flags += opts.speculation.flags(variant.speculative)
    return tuple(flags)


@contextlib.contextmanager
def _server(name: str, opts: PeerOptions, context_tokens: int, log_dir: Path) -> Iterator[Running]:
    if name == LLAMA:
        with llama_server(PEER_SLOTS, context_tokens, 2, log_dir, flags=repack_probe(log_dir).flags) as running:
            yield running
        return
    variant = next(v for v in variants(opts.precisions, opts.speculation) if v.name == name)
    with infer_server(name.replace("+", "-"), infer_flags(variant, opts, context_tokens), log_dir) as running:
        yield running


def run_peers(opts: PeerOptions, log_dir: Path) -> dict[str, Any]:
    """{"rounds": [{system: {"grounded/batch1": figures, ...}}], "systems", "precisions", "notes", "intro"}."""
    workloads = matrix_workloads(grounded_ids(Tokenizer.from_dir(default_model_dir())), opts.work)
    longest = max(len(r.prompt) + r.max_tokens for w in workloads.values() for r in w.requests)
    systems = [v.name for v in variants(opts.precisions, opts.speculation)]
    notes = []
    if opts.with_llama and LLAMA_SERVER.exists():
        systems.append(LLAMA)
        notes += repack_probe(log_dir).notes()
    elif opts.with_llama:
        notes.append(f"llama-server skipped: {LLAMA_SERVER} not found (`make peers` builds it)")
    rounds: list[Round] = []
    for i in range(opts.rounds):
        figures_of: Round = {}
        for name in systems if i % 2 == 0 else systems[::-1]:
            print(f"round {i + 1}/{opts.rounds}: {name}", flush=True)
            extra = {"cache_prompt": False} if name == LLAMA else None
            try:
                with _server(name, opts, PEER_SLOTS * (longest + 8), log_dir) as server:
                    figures_of[name] = asyncio.run(drive(server, workloads, extra, opts.progress))
            except Exception as e:  # NOTE: one server failing must not lose the others' figures
                notes.append(f"round {i + 1}, {name} failed: {type(e).__name__}: {str(e)[:300]}")
                print(notes[-1], flush=True)
        rounds.append(figures_of)
    return {"rounds": rounds, "systems": systems, "precisions": list(opts.precisions), "notes": notes,
            "intro": intro(opts, workloads)}  # fmt: skip


def intro(opts: PeerOptions, workloads: dict[str, Workload]) -> list[str]:
    spec = opts.speculation.describe() if opts.speculation else NO_SPECULATION
    grounded, random_ = workloads["grounded/c16"].requests, workloads["random/c16"].requests
    return [
        f"{opts.rounds} round(s); each starts every server in turn (the order reversed every other round), runs the "
        "four loads below over the OpenAI `/v1/completions` endpoint with the same token-id prompts, and stops it. "
        "Cold caches: infer runs with `--no-enable-prefix-caching`, llama-server (`-np 16`, Q4_1) gets "
        "`cache_prompt: false`; both hold the same KV tokens (16 × the longest request). Greedy, `ignore_eos`: "
        "every system generates the same number of tokens. A cell is "
        "the median over rounds, (×) the median of the per-round ratios to llama-server.",
        "",
        f"- grounded: benchmarks/grounded.json (summarize, extract, rewrite a passage; edit code given in the prompt), "
        f"chat-formatted, {min(len(r.prompt) for r in grounded)}–{max(len(r.prompt) for r in grounded)} prompt "
        f"tokens, {opts.work.grounded_tokens} new; random: token ids, {min(len(r.prompt) for r in random_)}–"
        f"{max(len(r.prompt) for r in random_)} prompt tokens, {opts.work.random_tokens} new",
        f"- batch 1: {opts.work.batch1_requests} request(s) one at a time; 16 concurrent: "
        f"{opts.work.concurrent_requests} requests, 16 streams at once",
        f"- speculation: {spec}",
    ]
