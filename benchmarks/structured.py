"""Structured output: what a constraint costs, and whether the outputs validate (`make bench-structured`).

Writes docs/benchmarks/structured.json and structured.md, from one run on the default model (the offline
engine, so that only the engine is measured):

- compile time: the compiler's start (xgrammar's import and the vocabulary, once per engine), each schema
  cold (first compile) and cached (the same schema again);
- output tok/s at 16 concurrent, constrained against unconstrained: each round samples 16 requests under
  JSON schemas at temperature 1, then the same prompts without a constraint (ignore_eos) and the same number
  of tokens each, so that both runs have the same batch over time; rounds alternate the two;
- the fraction of constrained outputs that parse and validate (jsonschema);
- the mask's own cost per step at 16 rows: filling it (xgrammar) and applying it to the logits.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import jsonschema
import torch

from infer import LLM, SamplingParams
from infer.engine import Constraint
from infer.engine.default_model import default_model_dir
from infer.engine.structured import GrammarCompiler
from infer.engine.structured.manager import TokenBitmask, apply_bitmask

OUT_DIR = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
CONCURRENT = 16


SCHEMAS: dict[str, Any] = json.loads((Path(__file__).resolve().parent / "structured_schemas.json").read_text())


def bench_compile(llm: LLM) -> dict[str, Any]:
    """A compiler of its own (nothing cached): its start, then each schema cold and cached, in ms."""
    info = llm.core.model_info
    compiler = GrammarCompiler(llm.tokenizer, info.vocab_size, info.eos_token_ids)
    started = time.perf_counter()
    compiler.start().result()
    out: dict[str, Any] = {"start_ms": (time.perf_counter() - started) * 1e3, "schemas": {}}
    for name, schema in SCHEMAS.items():
        timings = []
        for _ in range(2):  # cold, then cached
            started = time.perf_counter()
            compiler.submit(Constraint.json_schema(schema)).result()
            timings.append((time.perf_counter() - started) * 1e3)
        out["schemas"][name] = {"cold_ms": timings[0], "cached_ms": timings[1]}
    compiler.shutdown()
    return out


def _prompts(llm: LLM) -> list[tuple[str, list[int]]]:
    names = [list(SCHEMAS)[i % len(SCHEMAS)] for i in range(CONCURRENT)]
    return [(n, llm.tokenizer.encode_chat([{"role": "user", "content": f"A JSON object ({n}), please."}]))
            for n in names]  # fmt: skip


def bench_round(llm: LLM, seed: int, max_tokens: int) -> dict[str, Any]:
    """16 constrained requests, then the same prompts unconstrained with the same lengths."""
    prompts = _prompts(llm)
    shaped = [SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed * 100 + i,
                             constraint=Constraint.json_schema(SCHEMAS[name]))
              for i, (name, _) in enumerate(prompts)]  # fmt: skip
    started = time.perf_counter()
    outs = llm.generate([p for _, p in prompts], shaped)
    constrained_s = time.perf_counter() - started
    lengths = [len(o.token_ids) for o in outs]
    free = [SamplingParams(max_tokens=n, temperature=1.0, seed=seed * 100 + i, ignore_eos=True)
            for i, n in enumerate(lengths)]  # fmt: skip
    started = time.perf_counter()
    free_outs = llm.generate([p for _, p in prompts], free)
    unconstrained_s = time.perf_counter() - started
    assert [len(o.token_ids) for o in free_outs] == lengths
    valid = []
    for (name, _), out in zip(prompts, outs, strict=True):
        try:
            jsonschema.validate(json.loads(out.text), SCHEMAS[name])
            valid.append(True)
        except (ValueError, jsonschema.ValidationError):
            valid.append(False)
    return {"num_tokens": sum(lengths), "constrained_s": constrained_s, "unconstrained_s": unconstrained_s,
            "num_valid": sum(valid), "num_outputs": len(outs), "example": outs[0].text}  # fmt: skip


def bench_mask(llm: LLM, num_steps: int = 200) -> dict[str, float]:
    """Fill and apply one step's mask for 16 rows, each mid-way through its schema's output, in µs."""
    import xgrammar as xgr

    info = llm.core.model_info
    compiler = GrammarCompiler(llm.tokenizer, info.vocab_size, info.eos_token_ids)
    matchers = []
    for i in range(CONCURRENT):
        compiled = compiler.submit(Constraint.json_schema(list(SCHEMAS.values())[i % len(SCHEMAS)])).result()
        matcher = xgr.GrammarMatcher(compiled)
        matcher.accept_string('{"')  # inside the object: the common case
        matchers.append(matcher)
    bits = xgr.allocate_token_bitmask(CONCURRENT, info.vocab_size)
    rows = list(range(CONCURRENT))
    batch = xgr.BatchGrammarMatcher()
    logits = torch.randn(CONCURRENT, info.vocab_size)
    fill_s = apply_s = 0.0
    for _ in range(num_steps):
        started = time.perf_counter()
        batch.batch_fill_next_token_bitmask(matchers, bits, indices=rows)
        filled = time.perf_counter()
        apply_bitmask(logits, TokenBitmask(bits, rows))
        fill_s, apply_s = fill_s + filled - started, apply_s + time.perf_counter() - filled
    compiler.shutdown()
    return {"fill_us": fill_s / num_steps * 1e6, "apply_us": apply_s / num_steps * 1e6}


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds: each round's two runs are seconds apart, the rounds minutes (a shared machine's
    speed drifts between them)."""
    return {
        "constrained_tok_s": statistics.median(r["num_tokens"] / r["constrained_s"] for r in rounds),
        "unconstrained_tok_s": statistics.median(r["num_tokens"] / r["unconstrained_s"] for r in rounds),
        "ratio": statistics.median(r["unconstrained_s"] / r["constrained_s"] for r in rounds),  # constrained ÷ free
        "num_valid": sum(r["num_valid"] for r in rounds),
        "num_outputs": sum(r["num_outputs"] for r in rounds),
    }


def write_report(r: dict[str, Any], out_dir: Path = OUT_DIR) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "structured.json").write_text(json.dumps(r, indent=2) + "\n")
    s, mask, comp = r["summary"], r["mask"], r["compile"]
    step_us = CONCURRENT / s["unconstrained_tok_s"] * 1e6  # a step of 16 rows (prefill included), unconstrained
    lines = [
        "# Structured output",
        "",
        f"Measured by `make bench-structured` on {r['machine']}, fp32, model {r['model']}, the offline engine "
        f"({r['kernels']}), xgrammar {r['xgrammar']}. All figures come from this one run.",
        "",
        f"## Throughput at {CONCURRENT} concurrent",
        "",
        f"{r['rounds']} rounds; each samples {CONCURRENT} requests at temperature 1 under the five JSON schemas "
        "below (max_tokens "
        f"{r['max_tokens']}), then the same prompts without a constraint and with the same number of tokens each "
        "(ignore_eos), so that both see the same batch over time.",
        "",
        "| run | output tok/s (median round) |",
        "|---|---:|",
        f"| unconstrained | {s['unconstrained_tok_s']:.1f} |",
        f"| constrained (JSON schema) | {s['constrained_tok_s']:.1f} |",
        f"| constrained is slower by (median of the rounds' ratios) | {100 * (1 - s['ratio']):.1f}% |",
        "",
        "| round | tokens | constrained tok/s | unconstrained tok/s | outputs valid |",
        "|---:|---:|---:|---:|---:|",
        *(
            f"| {i + 1} | {x['num_tokens']} | {x['num_tokens'] / x['constrained_s']:.1f} | "
            f"{x['num_tokens'] / x['unconstrained_s']:.1f} | {x['num_valid']} of {x['num_outputs']} |"
            for i, x in enumerate(r["per_round"])
        ),
        "",
        f"Outputs that parse and validate (jsonschema): **{s['num_valid']} of {s['num_outputs']}** "
        f"({100 * s['num_valid'] / s['num_outputs']:.0f}%).",
        "",
        f"The mask's own cost per step at {CONCURRENT} rows (mean of {r['mask_steps']}): filling it "
        f"{mask['fill_us']:.0f} µs ({mask['fill_us'] / CONCURRENT:.1f} µs a row), applying it to the "
        f"[{CONCURRENT}, vocab] logits {mask['apply_us']:.0f} µs; together "
        f"{100 * (mask['fill_us'] + mask['apply_us']) / step_us:.1f}% of an unconstrained step of "
        f"{CONCURRENT} rows ({step_us / 1e3:.1f} ms, the median round's {CONCURRENT} ÷ tok/s, prefills included).",
        "",
        "## Grammar compile time",
        "",
        f"The compiler's start (xgrammar's import, the {r['vocab_size']}-token vocabulary): "
        f"{comp['start_ms']:.0f} ms, once per engine, on the first constrained request.",
        "",
        "| schema | cold (ms) | cached (ms) |",
        "|---|---:|---:|",
    ]
    for name, t in comp["schemas"].items():
        lines.append(f"| {name} | {t['cold_ms']:.1f} | {t['cached_ms']:.3f} |")
    lines += ["", f"An output (`{next(iter(SCHEMAS))}`): `{r['example']}`", ""]
    (out_dir / "structured.md").write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--mask-steps", type=int, default=200, help="steps of the mask microbenchmark")
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = ap.parse_args()
    from importlib.metadata import version

    model_dir = default_model_dir()
    llm = LLM(str(model_dir), max_model_len=1024)
    results: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "model": model_dir.name,
        "kernels": "compiled CPU kernels" if llm.core.model_info.kernels == "cpu" else "PyTorch references",
        "xgrammar": version("xgrammar"),
        "vocab_size": llm.core.model_info.vocab_size,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
    }
    results["compile"] = bench_compile(llm)
    bench_round(llm, seed=999, max_tokens=8)  # warm-up: kernels, and this engine's own compiles
    rounds = [bench_round(llm, seed, args.max_tokens) for seed in range(args.rounds)]
    results["per_round"] = [{k: v for k, v in r.items() if k != "example"} for r in rounds]
    results["summary"] = summarize(rounds)
    results["example"] = rounds[0]["example"]
    results["mask"] = bench_mask(llm, args.mask_steps)
    results["mask_steps"] = args.mask_steps
    write_report(results, args.out_dir)
    print((args.out_dir / "structured.md").read_text())


if __name__ == "__main__":
    main()
