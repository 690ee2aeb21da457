"""`make bench-contention`: serving beside a busy neighbour. infer and llama.cpp's `llama-server` on the same 2 cores
with k = 0, 1 and 2 CPU-bound processes beside them (`while True: pass` in Python, started after the server is
warm, killed when the load ends).

Systems, each a server started once per round: infer as users run it (`--cpu-threads 0`: threads follow the free
cores, engine/threads.py), infer with its threads fixed at 2 (`--cpu-threads 2`: before the governor), and
llama-server (`-t 2`, the same default model's Q4_1 GGUF, `--no-repack` where the repack probe says so). infer
serves int4 weights (`--quantization int4`, groups of 32 like Q4_1). Loads over the OpenAI `/v1/completions`
endpoint, token-id prompts of 128 random ids, 64 new tokens, greedy, `ignore_eos`, prefix cache off (infer) /
`cache_prompt: false` (llama-server): one stream (4 requests one after another) and 8 concurrent (16 requests).
Figures: output tok/s of each load at each k, and its ratio to the same server's k = 0 in the same round; the
order of the systems is reversed every other round. Goals (issue 27): with k of the 2 cores busy, infer keeps
>= 0.8 x (2 - k) / 2 of its solo throughput at k = 1 and >= 0.3x at k = 2, and does at least as well as
llama-server. Writes docs/benchmarks/contention.json and contention.md.

    python benchmarks/contention.py [--rounds N] [--quick] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from serving_servers import LLAMA_SERVER, Running, infer_server, llama_server, repack_probe, smollm2_gguf

from infer.clients.bench.load import LoadPlan, run_load
from infer.clients.bench.metrics import summarize
from infer.clients.bench.targets import make_target
from infer.clients.bench.workloads import FIRST_ID, RequestSpec, Workload

OUT_DIR = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
INFER, INFER_FIXED, LLAMA = "infer", "infer --cpu-threads 2", "llama-server"
SYSTEMS = (INFER, INFER_FIXED, LLAMA)
NEIGHBOURS = (0, 1, 2)
THREADS, CONTEXT_TOKENS, BLOCK_TOKENS, SLOTS = 2, 4096, 16, 8
PROMPT_TOKENS, NEW_TOKENS, VOCAB_LIMIT = 128, 64, 32_000
LOAD_LIMIT_S = 120.0  # no request is sent after this; those in flight finish
SETTLE_S = 1.0  # after the neighbours start (and the governor's windows: 0.5 s each)
BUSY_LOOP = "while True: pass"


def goal(k: int) -> float:
    return 0.8 * (2 - k) / 2 if k == 1 else 0.3


def workloads(seed: str, quick: bool) -> dict[str, Workload]:
    rng = random.Random(seed)

    def requests(count: int) -> tuple[RequestSpec, ...]:
        return tuple(
            RequestSpec(tuple(rng.randrange(FIRST_ID, VOCAB_LIMIT) for _ in range(PROMPT_TOKENS)), NEW_TOKENS)
            for _ in range(count)
        )

    warm = requests(1)
    return {
        "single": Workload("single", "one stream", requests(2 if quick else 4), 1, warmup=warm),
        "c8": Workload("c8", "8 concurrent", requests(8 if quick else 16), SLOTS, warmup=warm),
    }


@contextlib.contextmanager
def neighbours(k: int) -> Iterator[None]:
    """k CPU-bound processes, stopped on the way out whatever happens."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(k)]
    try:
        time.sleep(SETTLE_S if k else 0.0)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


async def measure(server: Running, load: Workload, extra: dict[str, Any]) -> float:
    target = make_target("completions", server.http, None, extra or None)
    try:
        plan = LoadPlan(concurrency=load.concurrency, warmup=1, duration_s=LOAD_LIMIT_S, progress=False)
        results = await run_load(target, load, plan, f"{server.name} {load.name}")
    finally:
        await target.close()
    failed = [f"{r.status} {r.error}" for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{server.name} {load.name}: {len(failed)} request(s) failed, first: {failed[0]}")
    return summarize(results).output_tokens_per_s


@contextlib.contextmanager
def serve(system: str, log_dir: Path, llama_flags: tuple[str, ...], tag: str) -> Iterator[Running]:
    if system == LLAMA:
        with llama_server(SLOTS, CONTEXT_TOKENS, THREADS, log_dir, None, llama_flags, f"llama-{tag}") as server:
            yield server
        return
    threads = "0" if system == INFER else str(THREADS)
    flags = ("--quantization", "int4", "--cpu-threads", threads, "--num-blocks", str(CONTEXT_TOKENS // BLOCK_TOKENS),
             "--block-size", str(BLOCK_TOKENS), "--no-enable-prefix-caching")  # fmt: skip
    with infer_server(f"infer-{threads}-{tag}", flags, log_dir) as server:
        yield server


def run_system(
    system: str, round_index: int, log_dir: Path, llama_flags: tuple[str, ...], quick: bool
) -> dict[str, Any]:
    """{load: {k: output tok/s}} of one cold server."""
    extra: dict[str, Any] = {"cache_prompt": False} if system == LLAMA else {}
    out: dict[str, dict[str, float]] = {}
    with serve(system, log_dir, llama_flags, f"r{round_index + 1}") as server:
        for key, load in workloads(f"{round_index}", quick).items():
            for k in NEIGHBOURS:
                with neighbours(k):
                    tok_s = asyncio.run(measure(server, load, extra))
                out.setdefault(key, {})[str(k)] = tok_s
                print(f"  {system} {key} k={k}: {tok_s:.1f} tok/s", flush=True)
    return out


def summarize_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per system, load and k: the median output tok/s and the median of the per-round ratios to k = 0."""
    table: dict[str, Any] = {}
    for system in SYSTEMS:
        for key in ("single", "c8"):
            for k in NEIGHBOURS:
                values = [r[system][key][str(k)] for r in rounds if system in r]
                ratios = [r[system][key][str(k)] / r[system][key]["0"] for r in rounds if system in r]
                if values:
                    cell = {"tok_s": statistics.median(values), "ratio": statistics.median(ratios)}
                    table.setdefault(system, {}).setdefault(key, {})[str(k)] = cell
    return table


def goals(table: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key in ("single", "c8"):
        for k in (1, 2):
            ours = table[INFER][key][str(k)]
            peer = table.get(LLAMA, {}).get(key, {}).get(str(k))
            beats = None if peer is None else ours["ratio"] >= peer["ratio"] and ours["tok_s"] >= peer["tok_s"]
            rows.append({
                "load": key, "k": k, "goal": goal(k), "ratio": ours["ratio"], "met": ours["ratio"] >= goal(k),
                "llama_ratio": peer["ratio"] if peer else None, "llama_tok_s": peer["tok_s"] if peer else None,
                "tok_s": ours["tok_s"], "beats_llama": beats,
            })  # fmt: skip
    return rows


def write_report(result: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "contention.json").write_text(json.dumps(result, indent=2) + "\n")
    table, names = result["table"], {"single": "one stream", "c8": "8 concurrent"}
    lines = [
        "# Serving beside a busy neighbour",
        "",
        f"`make bench-contention` (benchmarks/contention.py) on {result['machine']}, {result['rounds']} round(s), "
        f"load average before: {result['load_before']}. k = CPU-bound processes beside the server on its 2 cores. "
        "Output tok/s (median over rounds) and, in parentheses, the ratio to the same server alone (k = 0) in the "
        "same round. infer serves int4 weights; llama-server the Q4_1 GGUF"
        + (f" with {' '.join(result['llama_flags'])}" if result["llama_flags"] else "")
        + ". The workload and the systems: the script's docstring.",
        "",
        "| system | load | k = 0 | k = 1 | k = 2 |",
        "|---|---|---:|---:|---:|",
    ]
    for system in SYSTEMS:
        for key in ("single", "c8"):
            cells = table.get(system, {}).get(key)
            if cells:
                row = " | ".join(f"{cells[str(k)]['tok_s']:.1f} ({cells[str(k)]['ratio']:.2f}x)" for k in NEIGHBOURS)
                lines.append(f"| {system} | {names[key]} | {row} |")
    lines += ["", "| goal | infer | llama-server | met |", "|---|---:|---:|---|"]
    for g in result["goals"]:
        peer = "—" if g["llama_ratio"] is None else f"{g['llama_ratio']:.2f}x ({g['llama_tok_s']:.1f} tok/s)"
        met = "yes" if g["met"] and g["beats_llama"] is not False else "no"
        lines.append(f"| {names[g['load']]}, k = {g['k']}: >= {g['goal']:.2f}x solo, and >= llama-server "
                     f"| {g['ratio']:.2f}x ({g['tok_s']:.1f} tok/s) | {peer} | {met} |")  # fmt: skip
    lines += ["", *[f"- {note}" for note in result["notes"]], ""]
    (out_dir / "contention.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="fewer requests, infer only (checks the script)")
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = ap.parse_args(argv)
    notes: list[str] = []
    systems: tuple[str, ...] = SYSTEMS
    llama_flags: tuple[str, ...] = ()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-contention-"))
    if args.quick or not LLAMA_SERVER.is_file():
        systems = (INFER, INFER_FIXED)
        if not args.quick:
            notes.append(f"llama-server is not built ({LLAMA_SERVER}): `make peers` builds it")
    else:
        probe = repack_probe(log_dir, smollm2_gguf())
        llama_flags = probe.flags
        notes += probe.notes()
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        order = systems if i % 2 == 0 else tuple(reversed(systems))
        rounds.append({s: run_system(s, i, log_dir, llama_flags, args.quick) for s in order})
    table = summarize_rounds(rounds)
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "rounds": args.rounds,
        "load_before": load_before,
        "llama_flags": list(llama_flags),
        "raw": rounds,
        "table": table,
        "goals": goals(table),
        "notes": [*notes, f"server logs: {log_dir}"],
    }
    write_report(result, args.out_dir)
    print((args.out_dir / "contention.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
