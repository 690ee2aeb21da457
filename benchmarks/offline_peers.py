"""The rows `benchmarks/offline.py` adds beside fp32 `LLM.generate`: infer's lower-precision options and llama.cpp.

Each is measured on the same workload in the same run: `LLM.generate` with `--dtype bfloat16` or each
`--quantization` choice (bench_matrix.precisions), and llama.cpp's `llama-server` (built by `make peers`;
skipped with a note when absent) with as many parallel slots as infer runs sequences, driven over its OpenAI
endpoint by `infer bench`'s load generator with token-id prompts, `ignore_eos` and no prompt cache.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench_matrix import precisions
from serving_servers import LLAMA_SERVER, llama_server, repack_probe

from infer import LLM, SamplingParams
from infer.clients.bench.load import LoadPlan, run_load
from infer.clients.bench.metrics import summarize
from infer.clients.bench.targets import make_target
from infer.clients.bench.workloads import RequestSpec
from infer.clients.bench.workloads import Workload as BenchWorkload

PRECISIONS = {name: settings for name, settings in precisions().items() if name != "fp32"}


def bench_precisions(
    model_dir: Path,
    prompts: list[list[int]],
    max_new: list[int],
    throughput: Callable[[LLM], float],
    batch1: Callable[[LLM], float],
    names: Sequence[str] = tuple(PRECISIONS),
) -> dict[str, Any]:
    """{name: {"tok_s", "batch1_decode_tok_s"}} for each lower-precision option named, one LLM at a time."""
    out = {}
    for name in names:
        settings = PRECISIONS[name]
        llm = LLM(str(model_dir), max_model_len=1024, **settings)
        llm.generate(prompts[:4], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))  # warm-up
        out[name] = {"tok_s": throughput(llm), "batch1_decode_tok_s": batch1(llm)}
        del llm
    return out


def bench_llama(
    prompts: list[list[int]], max_new: list[int], slots: int, batch1_prompt: list[int], batch1_new: int
) -> dict[str, Any]:
    """llama-server's output tok/s over the workload with `slots` streams at once, and its batch-1 decode
    tok/s (1 / mean time per output token after the first), with the flags its repack probe chose and why;
    {"skipped": why} when it is not built."""
    if not LLAMA_SERVER.exists():
        return {"skipped": f"{LLAMA_SERVER} not found (`make peers` builds it)"}
    context = slots * (max(len(p) for p in prompts) + max(max_new) + 8)
    specs = tuple(RequestSpec(tuple(p), n) for p, n in zip(prompts, max_new, strict=True))
    work = BenchWorkload("offline", "the offline workload", specs)
    one = BenchWorkload("batch1", "one request", (RequestSpec(tuple(batch1_prompt), batch1_new),))
    with tempfile.TemporaryDirectory(prefix="infer-offline-") as tmp:
        probe = repack_probe(Path(tmp))
        with llama_server(slots, context, 2, Path(tmp), flags=probe.flags) as server:

            async def drive() -> tuple[float, float]:
                target = make_target("completions", server.http, None, {"cache_prompt": False})
                try:
                    await run_load(target, one, LoadPlan(concurrency=1, progress=False))  # warm-up
                    start = time.perf_counter()
                    results = await run_load(target, work, LoadPlan(concurrency=slots, progress=False))
                    elapsed = time.perf_counter() - start
                    assert all(r.ok for r in results), [r.status for r in results if not r.ok]
                    single = summarize(await run_load(target, one, LoadPlan(concurrency=1, progress=False)))
                    return sum(r.output_tokens for r in results) / elapsed, 1 / single.tpot_s.mean
                finally:
                    await target.close()

            tok_s, batch1 = asyncio.run(drive())
    return {"tok_s": tok_s, "batch1_decode_tok_s": batch1, "slots": slots, "flags": list(probe.flags),
            "notes": probe.notes()}  # fmt: skip
