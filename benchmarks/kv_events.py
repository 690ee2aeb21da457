"""What KV-cache events cost the engine step: its time with --kv-events on and off (`make bench-kv-events`).

Writes docs/benchmarks/kv-events.json and kv-events.md. The default model (or --model) is loaded once; each run
builds a fresh engine core over it (an empty prefix cache) with events on or off and steps it through the same
workload: requests at 16 concurrent over a few shared documents (prefix hits), on a KV pool small enough that
finished requests' blocks are evicted, so every kind of event is published. With events on, a subscriber on
another thread reads them as a router would. A round runs both modes, in alternating order; the figure is the
median over rounds of the mean step time on / off. Goal: within 2%.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import zmq

from infer.engine.config import EngineConfig
from infer.engine.core import EngineCore
from infer.engine.interface import ModelInfo
from infer.engine.loader import load_engine
from infer.engine.runner import ModelRunner
from infer.engine.sampling_params import SamplingParams
from infer.engine.tokenizer import Tokenizer

OUT_DIR = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
LOCAL = "tcp://127.0.0.1:*"
GOAL = 0.02  # on / off within 2%

Parts = tuple[EngineConfig, ModelRunner, Tokenizer, ModelInfo]


class Reader:
    """A subscriber on its own thread: counts the batches and bytes it reads."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.sub.connect(endpoint)
        self.num_batches = self.num_bytes = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.stopped.is_set():
            if self.sub.poll(50):
                _, _, payload = self.sub.recv_multipart()
                self.num_batches += 1
                self.num_bytes += len(payload)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.ctx.destroy(linger=0)


def workload(vocab: int, args: argparse.Namespace) -> list[list[int]]:
    """Prompts: a question of --question-tokens after one of --documents shared documents."""
    rng = random.Random(0)
    docs = [[rng.randrange(100, vocab - 100) for _ in range(args.document_tokens)] for _ in range(args.documents)]
    return [docs[i % len(docs)] + [rng.randrange(100, vocab - 100) for _ in range(args.question_tokens)]
            for i in range(args.requests)]  # fmt: skip


def run(parts: Parts, events: bool, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    config, runner, tokenizer, info = parts
    settings = {"kv_events": events, "kv_events_endpoint": LOCAL, "kv_events_replay_endpoint": LOCAL}
    core = EngineCore(replace(config, max_num_seqs=args.concurrency, **settings), runner, tokenizer, info)
    reader = Reader(core.kv_events.endpoint) if core.kv_events is not None else None
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        core.add_request(f"r{i}", prompt, params, lambda out: None)
    step_s: list[float] = []
    while core.has_work:
        started_s = time.perf_counter()
        ran = core.step()
        if ran:
            step_s.append(time.perf_counter() - started_s)
    stats = core.stats()
    published = core.kv_events.last_seq + 1 if core.kv_events is not None else 0
    core.close()
    core.block_manager.assert_no_leaks()
    result = {"steps": len(step_s), "step_ms": 1000 * statistics.fmean(step_s), "total_s": sum(step_s),
              "preemptions": stats.num_preemptions_total, "cached_tokens": stats.num_cached_tokens_total,
              "batches_published": published, "events_dropped": stats.num_kv_events_dropped_total}  # fmt: skip
    if reader is not None:
        reader.close()
        result |= {"batches_read": reader.num_batches, "bytes_read": reader.num_bytes}
    return result


def measure(parts: Parts, prompts: list[list[int]], args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    result: dict[str, Any] = {
        "machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
        "model": parts[3].model_id, "num_blocks": parts[0].num_blocks, "requests": args.requests,
        "concurrency": args.concurrency, "prompt_tokens": len(prompts[0]), "max_tokens": args.max_tokens,
        "rounds": [],
    }  # fmt: skip
    run(parts, False, prompts[: args.concurrency], args)  # warm-up
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        row = {("on" if events else "off"): run(parts, events, prompts, args) for events in order}
        row["ratio"] = row["on"]["step_ms"] / row["off"]["step_ms"]
        result["rounds"].append(row)
        print(f"round {r + 1}: step {row['off']['step_ms']:.2f} ms off, {row['on']['step_ms']:.2f} ms on "
              f"({row['ratio']:.3f}x)", flush=True)  # fmt: skip
        result["ratio"] = statistics.median(x["ratio"] for x in result["rounds"])
        write(result, out_dir)
    return result


def write(result: dict[str, Any], out_dir: Path) -> None:
    (out_dir / "kv-events.json").write_text(json.dumps(result, indent=2) + "\n")
    rounds = result["rounds"]
    met = "met" if abs(result["ratio"] - 1) <= GOAL else "not met"
    on = rounds[-1]["on"]
    lines = [
        "# KV-cache events: the engine step with --kv-events on and off",
        "",
        f"`make bench-kv-events` on {result['machine']}, {result['threads']} threads, {result['model']}: "
        f"{result['requests']} greedy requests at {result['concurrency']} concurrent, {result['prompt_tokens']} "
        f"prompt tokens (shared documents: prefix hits) and {result['max_tokens']} new tokens each, "
        f"{result['num_blocks']} KV blocks (evictions). Each round builds a fresh engine core on the loaded model "
        "for each mode, in alternating order; with events on a subscriber thread reads every batch. Step time: "
        "the mean over the steps that ran a forward pass.",
        "",
        f"**Median on / off: {result['ratio']:.3f}× (goal within {GOAL:.0%}: {met}).**",
        "",
        "| round | steps | step ms off | step ms on | on / off | batches published | read | dropped |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, row in enumerate(rounds, 1):
        off, on = row["off"], row["on"]
        lines.append(f"| {i} | {on['steps']} | {off['step_ms']:.2f} | {on['step_ms']:.2f} | {row['ratio']:.3f}× | "
                     f"{on['batches_published']} | {on['batches_read']} | {on['events_dropped']} |")  # fmt: skip
    lines += ["", f"Last round with events on: {on['bytes_read']} bytes of events read, {on['preemptions']} "
              f"preemptions, {on['cached_tokens']} prompt tokens from the prefix cache.", ""]  # fmt: skip
    (out_dir / "kv-events.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a model directory or GGUF file (default: the default model)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--documents", type=int, default=4)
    parser.add_argument("--document-tokens", type=int, default=160)
    parser.add_argument("--question-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--num-blocks", type=int, default=320, help="KV blocks: fewer than all requests need")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    parts = load_engine(EngineConfig(model=args.model, max_model_len=512, num_blocks=args.num_blocks))
    prompts = workload(parts[3].vocab_size, args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    measure(parts, prompts, args, args.out_dir)
    print((args.out_dir / "kv-events.md").read_text())


if __name__ == "__main__":
    main()
