"""`make bench-models`: infer against llama.cpp's `llama-server` on the same real GGUF files, side by side.

For each model of `make models` (benchmarks/real_models.py: Gemma 3 270M, Qwen2.5-Coder 0.5B and 1.5B Instruct):

1. perplexity of a fixed text (benchmarks/perplexity_text.txt): `llama-perplexity -c CTX -t 2` and ours through
   the engine computed the same way (the text cut into chunks of CTX tokens, a chunk's first token replaced by BOS
   when the model adds one, each chunk scored on its second half; CTX = 512 tokens, or half a shorter text);
2. a probe: llama-server with and without `--no-repack`, one stream; the faster serves the rest of the run (only
   `--no-repack` when repacking fails a one-token probe, serving_servers.repack_probe: the AMX fault);
3. rounds, the order of the systems reversed every other round: each server started cold (time to SERVING, peak
   RSS after load), then one stream (128-token prompts, 64 new tokens), 16 concurrent (16 requests at once, same
   shapes), for the Coder models a code-editing chat at one stream (rename a variable, add type hints: the answer
   mostly copies the code) with infer's n-gram speculation off and on and llama-server without and with its own
   draftless n-gram speculation (a second server); peak RSS after the workload.

Both servers get the same kind of token-id prompts over the OpenAI `/v1/completions` endpoint (greedy,
`ignore_eos`: fixed lengths; fresh random prompts per round and system; caches cold: infer without prefix caching,
llama-server with `cache_prompt: false`), 2 threads, and the same KV capacity: llama-server's `-c 4096` as one pool
its 16 slots share (`--kv-unified`), infer's 256 blocks of 16 tokens. The machine's read bandwidth (torch sum of
1 GiB, 2 threads, best of 5) is measured before and after, for the one-stream share of the bandwidth limit.
Writes docs/benchmarks/models.json and models.md.

    python benchmarks/models.py [--models NAME ...] [--rounds N] [--quick] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import difflib
import gc
import inspect
import json
import json.decoder
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from real_models import model_path
from serving_peers import figures
from serving_servers import LLAMA_SERVER, Running, infer_server, llama_server, llama_version, repack_probe

from infer.clients.bench.load import LoadPlan, run_load
from infer.clients.bench.metrics import summarize
from infer.clients.bench.targets import make_target
from infer.clients.bench.workloads import FIRST_ID, RequestSpec, Workload

OUT_DIR = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
MODELS = ("gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
LLAMA_PERPLEXITY = LLAMA_SERVER.with_name("llama-perplexity")
THREADS, SLOTS, BLOCK_TOKENS = 2, 16, 16
# NOTE: the Apache License 2.0 (infer's own licence, copied verbatim): ~2,500 tokens of English prose that none of
# the models was tuned on specifically; precision.py's 174-token text left llama-perplexity two chunks of 87
TEXT = Path(__file__).with_name("perplexity_text.txt").read_text(encoding="utf-8").strip()
PERPLEXITY_CTX = 512  # tokens a chunk (each scored on its second half), as `llama-perplexity -c`
CONTEXT_TOKENS = 4096  # llama-server's -c: one pool for its 16 slots; infer's KV cache holds as many tokens
# NOTE: drafts per step, at most (each request's drafts then adapt to what is accepted): 8, not
# benchmarks/speculative.py's 4: a verify step of up to 9 rows is compute-bound on 2 cores (8.5 ms a row at
# 1.5B) but the copy-heavy edits accept long runs: Qwen2.5-Coder 1.5B's code-editing decode 34-40 tok/s at 4,
# 40-45 at 8, higher in each of 5 alternated offline runs
SPECULATIVE_TOKENS = 8
LLAMA_NGRAM_FLAGS = ("--spec-type", "ngram-simple")  # llama.cpp's draftless n-gram speculation, its own defaults
RANDOM_ID_LIMIT = 32_000  # random prompt ids in [FIRST_ID, this): ordinary tokens of each vocabulary here
INFER, LLAMA, LLAMA_NGRAM = "infer", "llama", "llama+ngram"
ONE_STREAM_GOAL = {"gemma3-270m": 1.3, "qwen2.5-coder-0.5b": 1.3, "qwen2.5-coder-1.5b": 1.0}
CONCURRENT_GOAL = {"gemma3-270m": 3.0, "qwen2.5-coder-0.5b": 3.0, "qwen2.5-coder-1.5b": 2.0}
CODE_GOAL = {"qwen2.5-coder-1.5b": 1.5}
PERPLEXITY_TOLERANCE = 0.005
MIB = 1 << 20
Round = dict[str, dict[str, dict[str, float]]]  # {system: {"single" | "c16" | "code" | "server": {metric: value}}}


@dataclass(frozen=True)
class Work:
    rounds: int = 2
    prompt_tokens: int = 128
    new_tokens: int = 64
    single_requests: int = 4  # one at a time
    concurrent_requests: int = 16  # all at once
    code_tokens: int = 256  # new tokens of a code-editing answer (the code is ~500 tokens)
    probe_tokens: int = 32
    quick: bool = False

    def __post_init__(self) -> None:
        if min(self.rounds, self.prompt_tokens, self.new_tokens, self.single_requests, self.code_tokens) < 1:
            raise ValueError("rounds, requests and token counts must be >= 1")


QUICK = Work(rounds=1, new_tokens=32, single_requests=2, code_tokens=64, probe_tokens=16, quick=True)


@dataclass(frozen=True)
class ModelRun:
    name: str
    path: Path
    work: Work
    log_dir: Path
    llama_flags: tuple[str, ...]  # besides -m -np -c -t
    code_prompts: tuple[tuple[int, ...], ...]  # chat-rendered token ids; () for a model without a chat template


# --- the machine


def machine() -> dict[str, Any]:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    return {"cpu": fields.get("Model name", "?").strip(), "cores": os.cpu_count(),
            "simd": [f for f in flags if f.startswith(("avx2", "avx512", "amx"))]}  # fmt: skip


def read_bandwidth_gib_s(repeats: int = 5) -> float:
    """Read bandwidth on THREADS threads: torch sum over a 1 GiB fp32 tensor, best of `repeats`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    x, best = torch.ones(1 << 28), math.inf
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            float(x.sum())
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return x.nbytes / best / (1 << 30)


def peak_rss_bytes(pid: int) -> int:
    """VmHWM of a process: the most resident memory it has had."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]


def weight_bytes(path: Path) -> dict[str, int]:
    """The file's size, and the tensor bytes a decode step reads: all, less the input embedding when the LM head is
    a tensor of its own (a step reads one row of the embedding)."""
    from gguf import GGUFReader

    sizes = {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors}
    embedding = sizes.get("token_embd.weight", 0) if "output.weight" in sizes else 0
    return {"file_bytes": path.stat().st_size, "read_bytes_per_token": sum(sizes.values()) - embedding}


# --- perplexity


@torch.inference_mode()
def chunked_perplexity(llm: Any, ids: list[int], ctx: int) -> float:
    """llama-perplexity's estimate through our engine: chunks of `ctx` tokens (the first made BOS when the model adds
    one), each scored on its second half (the logits at ctx/2 .. ctx-2)."""
    from infer.engine.runner import SeqWork

    runner, bos = llm.core.runner, llm.tokenizer.bos_token_id
    add_bos, first, nll, count = bos is not None and ids[0] == bos, ctx // 2, 0.0, 0
    for start in range(0, len(ids) // ctx * ctx, ctx):
        chunk = [bos if add_bos and i == 0 else t for i, t in enumerate(ids[start : start + ctx])]
        step = runner.prepare([SeqWork(chunk, 0, list(range(-(-ctx // runner.block_size))), True)]).step
        logits = runner.model.compute_logits(runner.model(step))  # [ctx, vocab] fp32
        targets = torch.tensor(chunk[first + 1 :])
        nll += float(torch.nn.functional.cross_entropy(logits[first:-1], targets, reduction="sum"))
        count += ctx - first - 1
    return math.exp(nll / count)


@torch.inference_mode()
def reference_perplexity(path: Path, ids: list[int], ctx: int) -> float:
    """The same estimate (same ids, chunks and scored halves) by transformers on the same file, dequantized to fp32:
    the correctness reference, to tell our deviation from llama.cpp's own (its activations are rounded to 8 bits)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32).eval()  # fmt: skip
    try:
        bos, first, nll, count = model.config.bos_token_id, ctx // 2, 0.0, 0
        add_bos = bos is not None and ids[0] == bos
        for start in range(0, len(ids) // ctx * ctx, ctx):
            chunk = [bos if add_bos and i == 0 else t for i, t in enumerate(ids[start : start + ctx])]
            logits = model(torch.tensor([chunk])).logits[0].float()
            nll += float(torch.nn.functional.cross_entropy(logits[first:-1], torch.tensor(chunk[first + 1 :]),
                                                           reduction="sum"))  # fmt: skip
            count += ctx - first - 1
        return math.exp(nll / count)
    finally:
        del model
        gc.collect()


def code_tasks() -> list[list[dict[str, str]]]:
    """Two copy-heavy edits of CPython 3.11's own functions (PSF License), 49-58 lines each, as chats."""
    scan = inspect.getsource(json.decoder.py_scanstring)  # type: ignore[attr-defined]
    grouped = textwrap.dedent(inspect.getsource(difflib.SequenceMatcher.get_grouped_opcodes))
    asks = [("Rename the variable `chunks` to `parts` everywhere in this Python function and show the whole "
             f"function.\n\n```python\n{scan}```"),
            ("Add type hints to the parameters and the return value of this Python method and show the whole "
             f"method.\n\n```python\n{grouped}```")]  # fmt: skip
    return [[{"role": "user", "content": ask}] for ask in asks]


def our_side(name: str, path: Path) -> dict[str, Any]:
    """What our engine says offline: the perplexity (and its context size), the KV cache's bytes per token, the
    code-editing prompts rendered with the model's chat template (Coder models)."""
    from infer import LLM
    from infer.engine.runner import kv_cache_bytes_per_block

    llm = LLM(str(path), max_model_len=512, num_blocks=64)
    try:
        ids = llm.tokenizer.encode(TEXT)
        ctx = min(PERPLEXITY_CTX, len(ids) // 2)
        out: dict[str, Any] = {"text_tokens": len(ids), "ctx": ctx, "perplexity": chunked_perplexity(llm, ids, ctx)}
        out["ids"] = ids  # for transformers' estimate, after this engine is gone
        runner = llm.core.runner
        out["kv_bytes_per_token"] = kv_cache_bytes_per_block(runner.model, 1, runner.dtype)
        out["kernels"] = llm.core.model_info.kernels
        is_coder = name.startswith("qwen2.5-coder") and llm.tokenizer.chat_template is not None
        out["code_prompts"] = [llm.tokenizer.encode_chat(chat) for chat in code_tasks()] if is_coder else []
        return out
    finally:
        del llm
        gc.collect()


def llama_perplexity(path: Path, ctx: int, flags: tuple[str, ...], log_dir: Path) -> float:
    """`llama-perplexity -m FILE -f TEXT -c CTX -t 2`'s final estimate."""
    text = log_dir / "perplexity.txt"
    text.write_text(TEXT, encoding="utf-8")  # NOTE: no trailing newline (llama-perplexity would drop it)
    cmd = [str(LLAMA_PERPLEXITY), "-m", str(path), "-f", str(text), "-c", str(ctx), "-t", str(THREADS), *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    (log_dir / f"perplexity-{path.stem}.log").write_text(out.stdout + out.stderr)
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)
    if found is None:
        raise RuntimeError(f"llama-perplexity gave no estimate (exit {out.returncode}): {out.stderr[-500:]}")
    return float(found.group(1))


# --- workloads and servers


def random_requests(rng: random.Random, count: int, work: Work, new_tokens: int) -> tuple[RequestSpec, ...]:
    def prompt() -> tuple[int, ...]:
        return tuple(rng.randrange(FIRST_ID, RANDOM_ID_LIMIT) for _ in range(work.prompt_tokens))

    return tuple(RequestSpec(prompt(), new_tokens) for _ in range(count))


def workloads(run: ModelRun, seed: str) -> dict[str, Workload]:
    """Fresh random prompts (seeded by model, round and system), each load with a warm-up request of its own."""
    rng, work = random.Random(seed), run.work
    warm = [random_requests(rng, 1, work, 8) for _ in range(3)]
    out = {
        "single": Workload("single", "one stream", random_requests(rng, work.single_requests, work, work.new_tokens),
                           1, warmup=warm[0]),
        "c16": Workload("c16", "16 concurrent", random_requests(rng, work.concurrent_requests, work,
                                                               work.new_tokens), SLOTS, warmup=warm[1]),
    }  # fmt: skip
    if run.code_prompts:
        code = tuple(RequestSpec(p, work.code_tokens, tag="code") for p in run.code_prompts)
        out["code"] = Workload("code", "code editing, one stream", code, 1, warmup=warm[2])
    return out


def plan(system: str, loads: dict[str, Workload]) -> list[tuple[str, Workload, dict[str, Any]]]:
    """(key, workload, extra request fields) in the order a server runs them."""
    if system == LLAMA_NGRAM:
        return [("code", loads["code"], {"cache_prompt": False})]
    if system == LLAMA:
        return [(key, load, {"cache_prompt": False}) for key, load in loads.items()]
    out: list[tuple[str, Workload, dict[str, Any]]] = [(k, loads[k], {}) for k in ("single", "c16")]
    if "code" in loads:
        out += [("code", loads["code"], {"speculative_tokens": 0}),
                ("code+spec", loads["code"], {"speculative_tokens": SPECULATIVE_TOKENS})]  # fmt: skip
    return out


async def measure(server: Running, key: str, load: Workload, extra: dict[str, Any]) -> dict[str, float]:
    target = make_target("completions", server.http, None, extra or None)
    try:
        results = await run_load(target, load, LoadPlan(progress=False), f"{server.name} {key}")
    finally:
        await target.close()
    failed = [f"{r.status} {r.error}" for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{key}: {len(failed)} request(s) failed, first: {failed[0]}")
    short = [r.output_tokens for r in results if r.output_tokens != r.max_tokens]
    out = figures(summarize(results)) | {"short_requests": float(len(short))}
    print(f"  {server.name} {key}: " + ", ".join(f"{k} {v:.3g}" for k, v in out.items()), flush=True)
    return out


@contextlib.contextmanager
def serve(system: str, run: ModelRun, tag: str) -> Iterator[Running]:
    if system == INFER:
        flags: tuple[str, ...] = ("--model", str(run.path), "--num-blocks", str(CONTEXT_TOKENS // BLOCK_TOKENS),
                 "--block-size", str(BLOCK_TOKENS), "--no-enable-prefix-caching")  # fmt: skip
        with infer_server(f"infer-{tag}", flags, run.log_dir) as server:
            yield server
        return
    flags = run.llama_flags + (LLAMA_NGRAM_FLAGS if system == LLAMA_NGRAM else ())
    with llama_server(SLOTS, CONTEXT_TOKENS, THREADS, run.log_dir, run.path, flags, f"llama-{tag}") as server:
        yield server


def log_facts(system: str, log: Path) -> dict[str, float]:
    """From infer's log: its KV tokens, CPU threads, and whether the compiled kernels ran (1) or the references (0)."""
    text = log.read_text(errors="replace")
    if system != INFER:
        return {}
    kv, threads = re.search(r"(\d+) KV blocks of (\d+) tokens", text), re.search(r"(\d+) CPU threads", text)
    return ({"kv_tokens": float(int(kv.group(1)) * int(kv.group(2)))} if kv else {}) | (
        {"threads": float(threads.group(1))} if threads else {}) | {
        "compiled_kernels": float("kernels: compiled CPU kernels" in text)}  # fmt: skip


def run_system(system: str, run: ModelRun, round_index: int) -> dict[str, dict[str, float]]:
    """One cold server: its start, the workloads, its peak RSS after load and after the workloads."""
    tag = f"{system.replace('+', '-')}-{run.name}-r{round_index + 1}"
    out: dict[str, dict[str, float]] = {}
    with serve(system, run, tag) as server:
        facts = {"ready_s": server.ready_s, "peak_rss_load_bytes": float(peak_rss_bytes(server.pid))}
        for key, load, extra in plan(system, workloads(run, f"{run.name}/{round_index}/{system}")):
            out[key] = asyncio.run(measure(server, key, load, extra))
        facts["peak_rss_end_bytes"] = float(peak_rss_bytes(server.pid))
    out["server"] = facts | log_facts(system, server.log)
    return out


def probe_repack(path: Path, work: Work, log_dir: Path) -> dict[str, float]:
    """llama-server's one-stream decode tok/s with weight repacking (its default) and with `--no-repack`, each the
    mean of two starts (in the order A B B A); repacking 0 without a start when it fails a one-token probe
    (`repack_probe`: the AMX fault)."""
    run = ModelRun(path.stem, path, replace(work, single_requests=2, new_tokens=work.probe_tokens), log_dir, (), ())
    faults = repack_probe(log_dir, path).faults
    found: dict[str, list[float]] = {"repack": [0.0] if faults else [], "no-repack": []}
    for label in ("no-repack", "no-repack") if faults else ("repack", "no-repack", "no-repack", "repack"):
        flags = ("--no-repack",) if label == "no-repack" else ()
        try:
            with llama_server(SLOTS, CONTEXT_TOKENS, THREADS, log_dir, path, ("--kv-unified", *flags),
                              f"llama-probe-{label}-{path.stem}") as server:  # fmt: skip
                load = workloads(run, f"probe/{label}/{len(found[label])}")["single"]
                figs = asyncio.run(measure(server, f"probe {label}", load, {"cache_prompt": False}))
                found[label].append(figs["decode_tok_s"])
        except Exception as e:  # NOTE: e.g. the AMX fault of a repacked path on some Intel machines
            print(f"  llama-server ({label}) failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            found[label].append(0.0)
    return {label: statistics.mean(values) for label, values in found.items()}


# --- a model's whole run


def run_rounds(run: ModelRun, notes: list[str]) -> list[Round]:
    systems = [INFER, LLAMA] + ([LLAMA_NGRAM] if run.code_prompts else [])
    rounds: list[Round] = []
    for i in range(run.work.rounds):
        figures_of: Round = {}
        for system in systems if i % 2 == 0 else systems[::-1]:
            print(f"{run.name} round {i + 1}/{run.work.rounds}: {system}", flush=True)
            try:
                figures_of[system] = run_system(system, run, i)
            except Exception as e:  # NOTE: one server failing must not lose the others' figures
                notes.append(f"{run.name} round {i + 1}, {system} failed: {type(e).__name__}: {str(e)[:600]}")
                print(notes[-1], flush=True)
        rounds.append(figures_of)
    return rounds


def run_model(name: str, work: Work, log_dir: Path) -> dict[str, Any]:
    path, notes = model_path(name), list[str]()
    if not path.is_file():
        return {"notes": [f"{path} is missing: run `make models`"], "rounds": []}
    print(f"{name}: {path}", flush=True)
    out: dict[str, Any] = {"file": path.name, **weight_bytes(path), "notes": notes}
    try:
        out["ours"] = our_side(name, path)
    except Exception as e:
        notes.append(f"our engine could not load {path.name} offline: {type(e).__name__}: {str(e)[:600]}")
        out["ours"] = {"code_prompts": []}
    if "ids" in out["ours"]:
        try:
            out["reference_perplexity"] = reference_perplexity(path, out["ours"]["ids"], out["ours"]["ctx"])
        except Exception as e:
            notes.append(f"transformers' perplexity failed: {type(e).__name__}: {str(e)[:600]}")
        del out["ours"]["ids"]
    out["probe"] = probe_repack(path, work, log_dir)
    notes += repack_probe(log_dir, path).notes()
    repack = out["probe"]["repack"] > out["probe"]["no-repack"]
    out["llama_flags"] = ["--kv-unified", *([] if repack else ["--no-repack"])]
    if "ctx" in out["ours"]:
        try:
            out["llama_perplexity"] = llama_perplexity(path, out["ours"]["ctx"], () if repack else ("--no-repack",),
                                                       log_dir)  # fmt: skip
        except Exception as e:
            notes.append(f"llama-perplexity failed: {type(e).__name__}: {str(e)[:600]}")
    prompts = tuple(tuple(p) for p in out["ours"].pop("code_prompts"))
    out["code_prompt_tokens"] = [len(p) for p in prompts]
    run = ModelRun(name, path, work, log_dir, tuple(out["llama_flags"]), prompts)
    out["rounds"] = run_rounds(run, notes)
    return out


# --- figures across rounds


def median(rounds: list[Round], system: str, key: str, metric: str) -> float | None:
    values = [r[system][key][metric] for r in rounds if metric in r.get(system, {}).get(key, {})]
    return statistics.median(values) if values else None


def ratio(rounds: list[Round], a: tuple[str, str], b: tuple[str, str], metric: str) -> float | None:
    """a / b within each round where both ran, then the median."""
    pairs = [(r[a[0]][a[1]], r[b[0]][b[1]]) for r in rounds if a[1] in r.get(a[0], {}) and b[1] in r.get(b[0], {})]
    values = [x[metric] / y[metric] for x, y in pairs if y.get(metric)]
    return statistics.median(values) if values else None


def peak(rounds: list[Round], system: str) -> float | None:
    values = [r[system]["server"]["peak_rss_end_bytes"] for r in rounds if system in r]
    return max(values) if values else None


def bandwidth_share(result: dict[str, Any], m: dict[str, Any], system: str) -> float | None:
    """One-stream decode tok/s over the bandwidth limit (the faster bandwidth read / the bytes a step reads)."""
    decode = median(m["rounds"], system, "single", "decode_tok_s")
    gib_s = max(result["bandwidth_before_gib_s"], result["bandwidth_after_gib_s"])
    return decode / (gib_s * (1 << 30) / m["read_bytes_per_token"]) if decode else None


def fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{suffix}"


def goal_rows(name: str, m: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """(goal, target, measured, met) of one model."""
    rounds, ours = m["rounds"], m.get("ours", {})
    rows: list[tuple[str, str, str, bool | None]] = []
    ppl, ref = ours.get("perplexity"), m.get("llama_perplexity")
    diff = ppl / ref - 1 if ppl and ref else None
    hf = m.get("reference_perplexity")
    against_hf = (f"; transformers on the same file {hf:.3f}: ours {100 * (ppl / hf - 1):+.2f}%, llama.cpp's "
                  f"{100 * (ref / hf - 1):+.2f}%" if hf and ppl and ref else "")  # fmt: skip
    rows.append(("perplexity vs llama-perplexity", "within ±0.5%", f"{fmt(ppl, '.3f')} vs {fmt(ref, '.3f')} "
                 f"({fmt(None if diff is None else 100 * diff, '+.2f', '%')}){against_hf}",
                 None if diff is None else abs(diff) <= PERPLEXITY_TOLERANCE))  # fmt: skip
    for key, label, goal in (("single", "one stream, output tok/s", ONE_STREAM_GOAL[name]),
                             ("c16", "16 concurrent, output tok/s", CONCURRENT_GOAL[name])):  # fmt: skip
        r = ratio(rounds, (INFER, key), (LLAMA, key), "output_tok_s")
        measured = (f"{fmt(r, '.2f', '×')} ({fmt(median(rounds, INFER, key, 'output_tok_s'))} vs "
                    f"{fmt(median(rounds, LLAMA, key, 'output_tok_s'))})")  # fmt: skip
        rows.append((label, f"≥ {goal}×", measured, None if r is None else r >= goal))
    if name in CODE_GOAL:
        r = ratio(rounds, (INFER, "code+spec"), (LLAMA, "code"), "output_tok_s")
        r_ngram = ratio(rounds, (INFER, "code+spec"), (LLAMA_NGRAM, "code"), "output_tok_s")
        rows.append(("code editing, n-gram speculation on, output tok/s", f"≥ {CODE_GOAL[name]}×",
                     f"{fmt(r, '.2f', '×')} (vs llama-server with its n-gram speculation: {fmt(r_ngram, '.2f', '×')})",
                     None if r is None else r >= CODE_GOAL[name]))  # fmt: skip
    ours_rss, llama_rss = peak(rounds, INFER), peak(rounds, LLAMA)
    kv = ours.get("kv_bytes_per_token", 0) * CONTEXT_TOKENS or None
    met = None if None in (ours_rss, llama_rss, kv) else ours_rss <= llama_rss + kv  # type: ignore[operator]
    rows.append(("peak RSS while serving", "≤ llama-server's + our KV cache", f"{fmt(_mib(ours_rss), '.0f')} MiB vs "
                 f"{fmt(_mib(llama_rss), '.0f')} + {fmt(_mib(kv), '.0f')} MiB", met))  # fmt: skip
    r = ratio(rounds, (INFER, "server"), (LLAMA, "server"), "ready_s")
    ready = [median(rounds, system, "server", "ready_s") for system in (INFER, LLAMA)]
    rows.append(("time to SERVING", "≤ 2× llama-server's", f"{fmt(r, '.2f', '×')} ({fmt(ready[0])} vs "
                 f"{fmt(ready[1], '.2f')} s)", None if r is None else r <= 2.0))  # fmt: skip
    return rows


def _mib(value: float | None) -> float | None:
    return None if value is None else value / MIB


# --- the report


def model_table(result: dict[str, Any], m: dict[str, Any]) -> list[str]:
    rounds, ours = m["rounds"], m.get("ours", {})
    lines = ["| | infer | llama-server | infer / llama-server |", "|---|---:|---:|---:|"]

    def row(label: str, a: tuple[str, str], b: tuple[str, str], metric: str, spec: str = ".1f", k: float = 1) -> None:
        x, y = median(rounds, *a, metric), median(rounds, *b, metric)
        lines.append(f"| {label} | {fmt(x and x * k, spec)} | {fmt(y and y * k, spec)} | "
                     f"{fmt(ratio(rounds, a, b, metric), '.2f', '×')} |")  # fmt: skip

    row("one stream: output tok/s", (INFER, "single"), (LLAMA, "single"), "output_tok_s")
    row("one stream: decode tok/s (1 / mean TPOT)", (INFER, "single"), (LLAMA, "single"), "decode_tok_s")
    row("one stream: TTFT P50, ms", (INFER, "single"), (LLAMA, "single"), "ttft_p50_s", ".0f", 1000)
    row("16 concurrent: output tok/s", (INFER, "c16"), (LLAMA, "c16"), "output_tok_s")
    if m.get("code_prompt_tokens"):
        row("code editing, speculation off: output tok/s", (INFER, "code"), (LLAMA, "code"), "output_tok_s")
        row(f"code editing, infer `speculative_tokens: {SPECULATIVE_TOKENS}`: output tok/s", (INFER, "code+spec"),
            (LLAMA, "code"), "output_tok_s")  # fmt: skip
        row("code editing, infer speculation on vs llama-server `" + " ".join(LLAMA_NGRAM_FLAGS) + "`: output tok/s",
            (INFER, "code+spec"), (LLAMA_NGRAM, "code"), "output_tok_s")  # fmt: skip
        row("code editing, decode tok/s: speculation on, both", (INFER, "code+spec"), (LLAMA_NGRAM, "code"),
            "decode_tok_s")  # fmt: skip
    ppl, ref = ours.get("perplexity"), m.get("llama_perplexity")
    rel = ppl / ref if ppl and ref else None
    lines.append(f"| perplexity (ctx {ours.get('ctx', '?')}, {ours.get('text_tokens', '?')} tokens) | "
                 f"{fmt(ppl, '.3f')} | {fmt(ref, '.3f')} | {fmt(rel, '.4f', '×')} |")  # fmt: skip
    hf = m.get("reference_perplexity")
    if hf:
        lines.append(f"| perplexity: transformers on the same file (fp32), the reference: {hf:.3f} | "
                     f"{ppl / hf if ppl else 0:.4f}× | {ref / hf if ref else 0:.4f}× | |")  # fmt: skip
    row("peak RSS after load, MiB", (INFER, "server"), (LLAMA, "server"), "peak_rss_load_bytes", ".0f", 1 / MIB)
    row("peak RSS after the workload, MiB", (INFER, "server"), (LLAMA, "server"), "peak_rss_end_bytes", ".0f", 1 / MIB)
    rss = [peak(rounds, system) for system in (INFER, LLAMA)]
    lines.append(f"| peak RSS / file size ({m['file_bytes'] / MIB:.0f} MiB) | "
                 + " | ".join(fmt(x and x / m["file_bytes"], ".2f", "×") for x in rss) + " | |")  # fmt: skip
    kv = ours.get("kv_bytes_per_token", 0) * CONTEXT_TOKENS / MIB or None
    lines.append(f"| KV cache, {CONTEXT_TOKENS} tokens, MiB | {fmt(kv, '.0f')} (fp32) | in its RSS (f16) | |")
    row("time to SERVING (process start to health OK), s", (INFER, "server"), (LLAMA, "server"), "ready_s", ".2f")
    a, b = bandwidth_share(result, m, INFER), bandwidth_share(result, m, LLAMA)
    lines.append(f"| one-stream decode / bandwidth limit | {fmt(a and 100 * a, '.0f', '%')} | "
                 f"{fmt(b and 100 * b, '.0f', '%')} | |")  # fmt: skip
    return lines


def model_notes(result: dict[str, Any], m: dict[str, Any]) -> list[str]:
    gib_s = max(result["bandwidth_before_gib_s"], result["bandwidth_after_gib_s"])
    probe = m.get("probe", {})
    infer_facts: dict[str, float] = next((r[INFER]["server"] for r in m["rounds"] if INFER in r), {})
    kernels = {1.0: "its compiled CPU kernels", 0.0: "**the PyTorch reference kernels** (compiled kernels not built "
               "for this source: not representative)"}.get(infer_facts.get("compiled_kernels", -1), "?")  # fmt: skip
    return [
        f"File {m['file']}, {m['file_bytes'] / MIB:.0f} MiB; a decode step reads {m['read_bytes_per_token'] / MIB:.0f}"
        f" MiB of weights (every tensor, less the input embedding when the head is a tensor of its own): limit "
        f"{gib_s * (1 << 30) / m['read_bytes_per_token']:.1f} tok/s at {gib_s:.1f} GiB/s.",
        f"llama-server: `{' '.join(m.get('llama_flags', []))}` (repack probe, one-stream decode: repacked "
        f"{fmt(probe.get('repack'))}, `--no-repack` {fmt(probe.get('no-repack'))} tok/s). infer: "
        f"{fmt(infer_facts.get('kv_tokens'), '.0f')} KV tokens, {fmt(infer_facts.get('threads'), '.0f')} threads, "
        f"{kernels} (its log); our perplexity offline ran kernels `{m.get('ours', {}).get('kernels', '?')}`.",
        *([f"Code-editing prompts: {m['code_prompt_tokens']} tokens."] if m.get("code_prompt_tokens") else []),
        *[f"NOTE: {n}" for n in m.get("notes", [])],
    ]


def intro(result: dict[str, Any]) -> list[str]:
    w = result["work"]
    quick = ["**A QUICK SMOKE RUN (`--quick`): one round, shorter outputs. Not a measurement to quote.**", ""]
    return [*(quick if w["quick"] else []),
        f"`make bench-models` (benchmarks/models.py): infer (`infer serve --model FILE.gguf`, `--quantization auto`: "
        "each tensor in its own bits) against llama.cpp's `llama-server` on the same files, over the OpenAI "
        f"`/v1/completions` endpoint with token-id prompts, {w['rounds']} round(s) (each starts every server cold in "
        "turn, the order reversed every other round). Greedy, `ignore_eos` (fixed lengths), fresh random prompts "
        "per round and system, cold caches (infer `--no-enable-prefix-caching`, llama-server `cache_prompt: false`)."
        f" One stream: {w['single_requests']} requests one at a time, {w['prompt_tokens']}-token prompts, "
        f"{w['new_tokens']} new tokens; 16 concurrent: {w['concurrent_requests']} requests at once, same shapes; "
        f"code editing (Coder models): two chats (rename a variable, add type hints to a function of 49-58 lines "
        f"from CPython 3.11's sources) rendered with the model's chat template, {w['code_tokens']} new tokens, one "
        f"at a time. Both hold {CONTEXT_TOKENS} KV tokens (llama-server `-np {SLOTS} -c {CONTEXT_TOKENS} "
        f"--kv-unified -t {THREADS}`; infer {CONTEXT_TOKENS // BLOCK_TOKENS} blocks of {BLOCK_TOKENS}). A cell is "
        "the median over rounds, a ratio the median of the per-round ratios; peak RSS (VmHWM) is the largest.",
    ]  # fmt: skip


def write_report(result: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "models.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# Real GGUF models: infer vs llama-server", "", *intro(result), "", "## Goals", "",
             "| model | goal | target | measured | met |", "|---|---|---|---|---|"]  # fmt: skip
    for name, m in result["models"].items():
        if m.get("rounds"):
            for goal, target, measured, met in goal_rows(name, m):
                verdict = "—" if met is None else ("yes" if met else "no")
                lines.append(f"| {name} | {goal} | {target} | {measured} | {verdict} |")
    for name, m in result["models"].items():
        lines += ["", f"## {name}", ""]
        if m.get("rounds"):
            lines += [*model_table(result, m), "", *(f"- {line}" for line in model_notes(result, m))]
        else:
            lines += [f"NOTE: {n}" for n in m.get("notes", [])]
    lines += ["", "## The run", "", *run_facts(result)]
    (out_dir / "models.md").write_text("\n".join(lines) + "\n")


def run_facts(result: dict[str, Any]) -> list[str]:
    mach, ngram = result["machine"], " ".join(LLAMA_NGRAM_FLAGS)
    return [
        f"- machine: {mach['cpu']}, {mach['cores']} cores ({', '.join(mach['simd']) or 'no AVX2'})",
        f"- load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in result['load_before'])}; after: "
        f"{', '.join(f'{x:.2f}' for x in result['load_after'])}",
        f"- read bandwidth (torch sum of 1 GiB, {THREADS} threads, best of 5): {result['bandwidth_before_gib_s']:.1f} "
        f"GiB/s before, {result['bandwidth_after_gib_s']:.1f} after; the limit uses the faster",
        f"- llama.cpp: {result['llama_version'] or '?'}; `llama-server -m FILE -np {SLOTS} -c {CONTEXT_TOKENS} -t "
        f"{THREADS}` plus each model's flags above; its draftless n-gram speculation as a second server for the "
        f"code-editing workload: `{ngram}` (llama.cpp's defaults: lookup n-gram 12, draft m-gram 48); "
        f"`llama-perplexity -m FILE -f TEXT -c CTX -t {THREADS}` (with `--no-repack` where the server used it)",
        f"- infer: `infer serve --model FILE --num-blocks {CONTEXT_TOKENS // BLOCK_TOKENS} --block-size {BLOCK_TOKENS}"
        f" --no-enable-prefix-caching` (threads: its default); speculation per request (`speculative_tokens` 0 and "
        f"{SPECULATIVE_TOKENS}) on the same server",
        "- perplexity text: benchmarks/perplexity_text.txt (the Apache License 2.0), chunks of 512 tokens; our "
        "figure is computed through the engine offline "
        "(`LLM`, the same file and bits) the way llama-perplexity does",
        f"- wall time: {result['wall_s'] / 60:.1f} min; server logs in {result['log_dir']}",
        *[f"- NOTE: {n}" for n in result.get("notes", [])],
    ]


# --- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--rounds", type=int, default=None, help="default 2 (1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round, fewer requests and tokens")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    for binary in (LLAMA_SERVER, LLAMA_PERPLEXITY):
        if not binary.exists():
            print(f"{binary} not found: `make peers` builds it", file=sys.stderr)
            return 2
    work = QUICK if args.quick else Work()
    work = replace(work, rounds=args.rounds) if args.rounds else work
    log_dir, start = Path(tempfile.mkdtemp(prefix="bench-models-")), time.monotonic()
    result: dict[str, Any] = {"machine": machine(), "load_before": list(os.getloadavg()), "work": asdict(work),
                              "llama_version": llama_version(), "log_dir": str(log_dir),
                              "bandwidth_before_gib_s": read_bandwidth_gib_s(), "models": {}}  # fmt: skip
    print(f"machine {result['machine']}, bandwidth {result['bandwidth_before_gib_s']:.1f} GiB/s, logs {log_dir}")
    for name in args.models:
        result["models"][name] = run_model(name, work, log_dir)
    result |= {"bandwidth_after_gib_s": read_bandwidth_gib_s(), "load_after": list(os.getloadavg()),
               "wall_s": time.monotonic() - start}  # fmt: skip
    write_report(result, args.out_dir)
    print((args.out_dir / "models.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
