"""`make bench-offline`'s comparison with llama.cpp: `LLM.generate` in every precision, speculation on and off, and
`llama-server` over HTTP, on the same token-id prompts (input-grounded and random), at batch 1 and 16 concurrent.

Each round builds one LLM per variant in turn and measures it, and measures llama-server (started once, its
prompt cache off) in the same sequence, the order reversed every other round. Caches are cold on both sides:
the LLMs run without prefix caching, llama-server gets `cache_prompt: false`.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
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
from serving_peers import PEER_SLOTS, drive
from serving_servers import LLAMA_SERVER, Running, llama_server, repack_probe

from infer import LLM, SamplingParams
from infer.clients.bench.workloads import RequestSpec, Workload


def _params(spec: RequestSpec) -> SamplingParams:
    return SamplingParams(max_tokens=spec.max_tokens, temperature=0, ignore_eos=True)


def one_at_a_time(llm: LLM, requests: Sequence[RequestSpec]) -> Figures:
    """Batch 1: each request streamed alone. Decode tok/s counts from each first token to its last."""
    made = decoded = 0
    total_s = decode_s = 0.0
    ttfts = []
    for spec in requests:
        start, first, last, n = time.perf_counter(), 0.0, 0.0, 0
        for delta in llm.stream(list(spec.prompt), _params(spec)):
            if delta.token_ids:
                last = time.perf_counter()
                first, n = first or last, n + len(delta.token_ids)
        assert n == spec.max_tokens, (n, spec.max_tokens)
        made, decoded, total_s, decode_s = made + n, decoded + n - 1, total_s + last - start, decode_s + last - first
        ttfts.append(first - start)
    return {"output_tok_s": made / total_s, "decode_tok_s": decoded / decode_s if decode_s else 0.0,
            "ttft_p50_s": statistics.median(ttfts)}  # fmt: skip


def all_at_once(llm: LLM, requests: Sequence[RequestSpec]) -> Figures:
    """16 concurrent: `generate` over every request, 16 running at most (the LLM's max_num_seqs)."""
    start = time.perf_counter()
    outs = llm.generate([list(r.prompt) for r in requests], [_params(r) for r in requests])
    elapsed = time.perf_counter() - start
    made = sum(len(o.token_ids) for o in outs)
    assert made == sum(r.max_tokens for r in requests)
    return {"output_tok_s": made / elapsed}


def measure_llm(llm: LLM, workloads: dict[str, Workload]) -> dict[str, Figures]:
    llm.generate([list(r.prompt) for r in workloads["random/batch1"].requests[:2]],
                 SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))  # fmt: skip  # warm-up
    return {key: (one_at_a_time if work.concurrency == 1 else all_at_once)(llm, work.requests)
            for key, work in workloads.items()}  # fmt: skip


def build_llm(model_dir: Path, variant: Variant, speculation: Speculation | None, context_tokens: int) -> LLM:
    """A fresh LLM: 16 running at most, the KV cache of llama-server's context (plus a block a slot), no prefix
    caching, the variant's precision and speculation."""
    settings: dict[str, Any] = {"max_model_len": 2048, "max_num_seqs": PEER_SLOTS, "enable_prefix_caching": False,
                                "num_blocks": -(-context_tokens // 16) + PEER_SLOTS}  # fmt: skip
    settings |= precisions()[variant.precision]
    if speculation is not None:  # NOTE: "off" is explicit: the engine's default may be on
        settings |= speculation.engine_settings(variant.speculative)
    return LLM(str(model_dir), **settings)


@contextlib.contextmanager
def _maybe_llama(enabled: bool, context_tokens: int) -> Iterator[Running | None]:
    if not enabled:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="infer-offline-") as tmp:
        log_dir = Path(tmp)
        with llama_server(PEER_SLOTS, context_tokens, 2, log_dir, flags=repack_probe(log_dir).flags) as server:
            yield server


def run_matrix(model_dir: Path, tokenizer: Any, names: Sequence[str], rounds: int, work: MatrixWork,
               speculation: Speculation | None, with_llama: bool = True) -> dict[str, Any]:  # fmt: skip
    """{"rounds": [{system: {"grounded/batch1": figures, ...}}], "systems", "precisions", "notes", "intro"}."""
    workloads = matrix_workloads(grounded_ids(tokenizer), work)
    longest = max(len(r.prompt) + r.max_tokens for w in workloads.values() for r in w.requests)
    notes = []
    if speculation is not None and not speculation.setting.is_engine:
        notes.append(f"speculation: `{speculation.setting.name}` is a server setting; LLM cannot take it")
        speculation = None
    vs = variants(names, speculation)
    llama = with_llama and LLAMA_SERVER.exists()
    if with_llama and not llama:
        notes.append(f"llama-server skipped: {LLAMA_SERVER} not found (`make peers` builds it)")
    if llama:
        with tempfile.TemporaryDirectory(prefix="infer-offline-") as tmp:
            notes += repack_probe(Path(tmp)).notes()
    systems = [v.name for v in vs] + ([LLAMA] if llama else [])
    results: list[Round] = []
    context_tokens = PEER_SLOTS * (longest + 8)
    with _maybe_llama(llama, context_tokens) as server:
        for i in range(rounds):
            figures_of: Round = {}
            for name in systems if i % 2 == 0 else systems[::-1]:
                print(f"round {i + 1}/{rounds}: {name}", flush=True)
                if name == LLAMA and server is not None:
                    figures_of[name] = asyncio.run(drive(server, workloads, {"cache_prompt": False}, False))
                    continue
                llm = build_llm(model_dir, next(v for v in vs if v.name == name), speculation, context_tokens)
                figures_of[name] = measure_llm(llm, workloads)
                del llm
            results.append(figures_of)
    return {"rounds": results, "systems": systems, "precisions": list(names), "notes": notes,
            "intro": _intro(rounds, work, workloads, speculation)}  # fmt: skip


def _intro(rounds: int, work: MatrixWork, workloads: dict[str, Workload], spec: Speculation | None) -> list[str]:
    grounded, random_ = workloads["grounded/c16"].requests, workloads["random/c16"].requests
    return [
        f"{rounds} round(s); each measures every infer variant (`LLM.generate`, a fresh LLM, prefix caching off, "
        "the KV tokens of llama-server's context) "
        "and llama-server (`-np 16`, Q4_1, over its OpenAI `/v1/completions` with token-id prompts, "
        "`cache_prompt: false`) in turn, the order reversed every other round. Greedy, `ignore_eos`. Batch 1: "
        "`LLM.stream`, one request at a time (decode tok/s from each first token to its last); 16 concurrent: "
        "`LLM.generate` over all requests with `max_num_seqs=16`, llama-server with 16 streams at once. A cell is "
        "the median over rounds, (×) the median of the per-round ratios to llama-server.",
        "",
        f"- grounded: benchmarks/grounded.json (summarize, extract, rewrite a passage; edit code given in the "
        f"prompt), chat-formatted, {min(len(r.prompt) for r in grounded)}–{max(len(r.prompt) for r in grounded)} "
        f"prompt tokens, {work.grounded_tokens} new; random: token ids, {min(len(r.prompt) for r in random_)}–"
        f"{max(len(r.prompt) for r in random_)} prompt tokens, {work.random_tokens} new",
        f"- batch 1: {work.batch1_requests} request(s); 16 concurrent: {work.concurrent_requests} requests",
        f"- speculation: {spec.describe() if spec else NO_SPECULATION}",
    ]


def add_arguments(ap: Any) -> None:
    """The matrix's flags on offline.py's parser."""
    ap.add_argument("--skip-matrix", action="store_true", help="skip every precision vs llama-server in rounds")
    ap.add_argument("--matrix-rounds", type=int, default=2, help="matrix: rounds (medians)")
    ap.add_argument("--matrix-precisions", default=",".join(precisions()), help="matrix: which, comma-separated")
    ap.add_argument("--matrix-batch1", type=int, default=4, help="matrix: batch-1 requests per workload")
    ap.add_argument("--matrix-concurrent", type=int, default=32, help="matrix: requests at 16 concurrent")
    ap.add_argument(
        "--speculation-setting",
        default=None,
        help="the engine setting that turns speculation on (default: the first named specul*)",
    )
    ap.add_argument("--speculation-on", default=None, help="its value for on (default: true / ngram / 4)")  # fmt: skip


def run_from_args(args: Any, model_dir: Path, tokenizer: Any) -> dict[str, Any]:
    from bench_matrix import find_speculation

    names = tuple(args.matrix_precisions.split(","))
    unknown = set(names) - set(precisions())
    if unknown:
        raise SystemExit(f"--matrix-precisions: unknown {sorted(unknown)}: one of {', '.join(precisions())}")
    cap = args.max_new_tokens or 128
    work = MatrixWork(args.matrix_batch1, args.matrix_concurrent, min(128, cap), min(128, cap))
    spec = find_speculation(args.speculation_setting, args.speculation_on)
    return run_matrix(model_dir, tokenizer, names, args.matrix_rounds, work, spec, not args.skip_llama)
