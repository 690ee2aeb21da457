"""N-gram speculative decoding at batch 1: output tok/s with and without it (`make bench-speculative`).

Writes docs/benchmarks/speculative.json and speculative.md, from one run on the default model (the offline
engine, so that only the engine is measured). One request at a time, greedy (the same tokens both ways):

- input-grounded: chat prompts that copy from a passage or a code file given in the prompt (repeat it,
  rewrite it with a substitution, rename a function in it, extract its sentences), natural ends;
- random tokens: 128-token random prompts, 128 new tokens (ignore_eos): drafts mostly miss.

Each round runs every prompt with speculation off, then on (the request's `speculative_tokens`), on one engine;
rounds repeat, and the figures are medians over rounds of each workload's total tokens / total time.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from infer import LLM, SamplingParams

OUT_DIR = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"

PASSAGE = (
    "The lighthouse stood on a rock at the mouth of the harbour. Every night the keeper climbed the hundred and "
    "twelve steps, wound the clockwork, trimmed the wick and lit the lamp. Every morning he wrote the weather, "
    "the ships he had seen and the oil he had burned in a book bound in green leather. In winter the storms "
    "came from the north, and the spray reached the gallery; in summer the fishing boats went out at dawn and "
    "came back at dusk, and the keeper counted them as they passed."
)
CODE = '''def load_orders(path):
    """Read the orders file: one order a line, id, customer and amount, comma-separated."""
    orders = []
    with open(path) as f:
        for line in f:
            order_id, customer, amount = line.strip().split(",")
            orders.append({"id": int(order_id), "customer": customer, "amount": float(amount)})
    return orders


def total_by_customer(orders):
    totals = {}
    for order in orders:
        totals[order["customer"]] = totals.get(order["customer"], 0.0) + order["amount"]
    return totals
'''
GROUNDED = {
    "repeat": f"Repeat the following passage exactly, word for word.\n\n{PASSAGE}",
    "rewrite": f"Rewrite the following passage, replacing the word 'keeper' with 'warden' everywhere.\n\n{PASSAGE}",
    "edit-code": f"Rename the function load_orders to read_orders in this Python file and show the whole file.\n\n"
    f"```python\n{CODE}```",
    "extract": f"List every sentence of this passage that mentions the keeper, one per line.\n\n{PASSAGE}",
}


def _random_prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(100, vocab - 100, (length,), generator=g).tolist() for _ in range(n)]


def _run(llm: LLM, prompt: list[int], params: SamplingParams) -> dict[str, float]:
    started_s = time.perf_counter()
    out = llm.generate([prompt], params)[0]
    elapsed_s = time.perf_counter() - started_s
    t = out.timings
    assert t is not None
    return {"tokens": len(out.token_ids), "s": elapsed_s, "ttft_s": t.ttft_s, "drafts": t.num_draft_tokens,
            "accepted": t.num_accepted_tokens, "tokens_hash": hash(tuple(out.token_ids))}  # fmt: skip


def _workload(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> dict[str, float]:
    runs = [_run(llm, p, params) for p in prompts]
    tokens, total_s = sum(r["tokens"] for r in runs), sum(r["s"] for r in runs)
    decode_s = sum(r["s"] - r["ttft_s"] for r in runs)
    drafts, accepted = sum(r["drafts"] for r in runs), sum(r["accepted"] for r in runs)
    return {"tokens": tokens, "tok_s": tokens / total_s, "decode_tok_s": (tokens - len(runs)) / decode_s,
            "acceptance": accepted / drafts if drafts else 0.0, "drafts": drafts,
            "tokens_hash": hash(tuple(r["tokens_hash"] for r in runs))}  # fmt: skip


def measure(llm: LLM, workloads: dict[str, tuple[list[list[int]], SamplingParams]], k: int, rounds: int,
            on_round: Callable[[dict[str, Any]], None]) -> dict[str, Any]:  # fmt: skip
    """Rounds of every workload off then on; `on_round` gets the summary so far after each round."""
    rows: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in workloads}
    summary: dict[str, Any] = {}
    for r in range(rounds):
        for name, (prompts, params) in workloads.items():
            off = _workload(llm, prompts, SamplingParams(**{**_fields(params), "speculative_tokens": 0}))
            on = _workload(llm, prompts, SamplingParams(**{**_fields(params), "speculative_tokens": k}))
            assert on["tokens_hash"] == off["tokens_hash"], f"{name}: speculation changed the greedy tokens"
            rows[name].append({"off": off, "on": on})
            print(f"round {r + 1} {name}: off {off['tok_s']:.1f} tok/s, on {on['tok_s']:.1f} tok/s "
                  f"({on['tok_s'] / off['tok_s']:.2f}x), acceptance {on['acceptance']:.2f}", flush=True)  # fmt: skip
        summary = {name: _summary(rounds_, len(workloads[name][0])) for name, rounds_ in rows.items()}
        on_round(summary)
    return summary


def _summary(rounds: list[dict[str, dict[str, float]]], num_prompts: int) -> dict[str, Any]:
    med = {mode: {key: statistics.median(x[mode][key] for x in rounds)
                  for key in ("tok_s", "decode_tok_s", "acceptance")} for mode in ("off", "on")}  # fmt: skip
    ratios = [x["on"]["tok_s"] / x["off"]["tok_s"] for x in rounds]
    return {**med, "ratio": statistics.median(ratios), "ratios": ratios, "tokens": rounds[0]["on"]["tokens"],
            "num_prompts": num_prompts, "rounds_done": len(rounds)}  # fmt: skip


def _fields(params: SamplingParams) -> dict[str, Any]:
    return {k: getattr(params, k) for k in ("max_tokens", "temperature", "ignore_eos")}


def write(result: dict[str, Any], out_dir: Path) -> None:
    (out_dir / "speculative.json").write_text(json.dumps(result, indent=2) + "\n")
    goals = {"grounded": 1.8, "random": 0.95}
    lines = [
        "# N-gram speculative decoding, batch 1",
        "",
        f"`make bench-speculative` on {result['machine']}, {result['threads']} threads, the default model "
        f"({result['dtype']}, quantization {result['quantization']}), offline engine, one request at a time, "
        f"greedy; up to {result['k']} drafts a step; medians of {_rounds_done(result)} rounds (each round: every "
        "prompt off, then on). Output tok/s = output tokens / request time (prefill included); decode tok/s "
        "leaves the first token out. The greedy tokens were checked equal with and without speculation.",
        "",
        "| workload | prompts | output tokens | off tok/s | on tok/s | on / off | goal | decode tok/s off → on "
        "| acceptance |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name, s in result["workloads"].items():
        goal = goals.get(name, 0)
        met = "met" if s["ratio"] >= goal else "not met"
        lines.append(
            f"| {name} | {s['num_prompts']} | {s['tokens']} | {s['off']['tok_s']:.1f} | {s['on']['tok_s']:.1f} | "
            f"{s['ratio']:.2f}× | ≥ {goal}× ({met}) | {s['off']['decode_tok_s']:.1f} → {s['on']['decode_tok_s']:.1f} "
            f"| {s['on']['acceptance']:.2f} |"
        )
    rounds = [f"{name} {', '.join(f'{r:.2f}' for r in s['ratios'])}" for name, s in result["workloads"].items()]
    lines += ["", "Per-round ratios (on / off): " + "; ".join(rounds), ""]
    (out_dir / "speculative.md").write_text("\n".join(lines) + "\n")


def _rounds_done(result: dict[str, Any]) -> int:
    return min((s["rounds_done"] for s in result["workloads"].values()), default=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--k", type=int, default=4, help="drafts per step, at most")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    llm = LLM(max_model_len=1024, dtype=args.dtype, quantization=args.quantization)
    grounded = [llm.tokenizer.encode_chat([{"role": "user", "content": text}]) for text in GROUNDED.values()]
    workloads = {
        "grounded": (grounded, SamplingParams(max_tokens=args.max_tokens, temperature=0)),
        "random": (_random_prompts(4, 128, llm.core.model_info.vocab_size),
                   SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)),
    }  # fmt: skip
    llm.generate([grounded[0]], SamplingParams(max_tokens=8, temperature=0))  # warm-up
    result = {"machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
              "dtype": args.dtype, "quantization": args.quantization, "k": args.k, "rounds": args.rounds,
              "kernels": llm.core.model_info.kernels, "workloads": {}}  # fmt: skip
    args.out_dir.mkdir(parents=True, exist_ok=True)
    measure(llm, workloads, args.k, args.rounds, lambda summary: write({**result, "workloads": summary}, args.out_dir))
    print((args.out_dir / "speculative.md").read_text())


if __name__ == "__main__":
    main()
