"""docs/benchmarks/serving.md and .json from one `benchmarks/serving.py` run: the goals as ratios, every run's
table, the plots."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matrix_report

from infer.clients.bench.metrics import BenchRun, Summary
from infer.clients.bench.plots import plot_cdfs, plot_sweep
from infer.clients.bench.report import markdown_table, slo_text

Runs = dict[str, list[BenchRun]]


@dataclass(frozen=True)
class Goal:
    name: str
    target: str
    ratio: float  # nan when a side did not run
    met: bool | None  # None: not measured
    detail: str


def _summary(runs: Runs, key: str, tag: str | None = None) -> Summary | None:
    if key not in runs or not runs[key]:
        return None
    run = runs[key][0]
    return run.by_tag().get(tag) if tag else run.summary


def _goal(name: str, target: str, ratio: float, ok: Callable[[float], bool], detail: str) -> Goal:
    measured = not math.isnan(ratio)
    return Goal(name, target, ratio, ok(ratio) if measured else None, detail if measured else "not run")


def _pair(runs: Runs, a: str, b: str, tag: str | None = None) -> tuple[Summary, Summary] | None:
    sa, sb = _summary(runs, a, tag), _summary(runs, b, tag)
    return (sa, sb) if sa is not None and sb is not None else None


def _total_tok_s(s: Summary) -> float:
    return s.output_tokens_per_s + s.input_tokens_per_s


def _chunked(runs: Runs, offline: dict[str, Any] | None) -> Goal:
    name, target = "chunked / whole prefill: P99 ITL of decoding requests", "≤ 0.3 with ≤ 10% throughput loss"
    p = _pair(runs, "chunked_prefill/chunked", "chunked_prefill/unchunked", "decode")
    whole = _pair(runs, "chunked_prefill/chunked", "chunked_prefill/unchunked")
    if not (p and whole):
        return _goal(name, target, math.nan, bool, "")
    r, loss = p[0].itl_s.p99 / p[1].itl_s.p99, 1 - _total_tok_s(whole[0]) / _total_tok_s(whole[1])
    detail = (f"P99 ITL of the decoding streams {1000 * p[0].itl_s.p99:.0f} vs {1000 * p[1].itl_s.p99:.0f} ms; "
              f"throughput (prompt + output tok/s) {_total_tok_s(whole[0]):.0f} vs {_total_tok_s(whole[1]):.0f}, "
              f"a {100 * loss:.0f}% loss")  # fmt: skip
    return _goal(name, target, r, lambda x: x <= 0.3 and loss <= 0.10, detail)


def _paged(runs: Runs, offline: dict[str, Any] | None) -> Goal:
    p = _pair(runs, "paged_attention/paged", "paged_attention/full")
    r = p[0].max_concurrent_decoding / max(1, p[1].max_concurrent_decoding) if p else math.nan
    detail = f"{p[0].max_concurrent_decoding} vs {p[1].max_concurrent_decoding} streams at once" if p else ""
    return _goal("paged / full KV reservation: max concurrent sequences", "≥ 4×", r, lambda x: x >= 4, detail)


def _continuous(runs: Runs, offline: dict[str, Any] | None) -> Goal:
    p = _pair(runs, "continuous_batching/continuous", "continuous_batching/static")
    r = p[0].ttft_s.p99 / p[1].ttft_s.p99 if p else math.nan
    detail = f"{p[0].ttft_s.p99:.2f} vs {p[1].ttft_s.p99:.2f} s" if p else ""
    return _goal("continuous / static batching: P99 TTFT", "≤ 0.5", r, lambda x: x <= 0.5, detail)


def _offline(runs: Runs, offline: dict[str, Any] | None) -> Goal:
    online = _summary(runs, "saturation/grpc")
    both = online is not None and offline is not None
    r = online.output_tokens_per_s / offline["output_tokens_per_s"] if online and offline else math.nan
    detail = (
        f"{online.output_tokens_per_s:.1f} vs {offline['output_tokens_per_s']:.1f} tok/s" if online and offline else ""
    )
    name = "online gRPC / offline `LLM.generate` throughput, 16 at once"
    return _goal(name, "≥ 0.9", r if both else math.nan, lambda x: x >= 0.9, detail)


def _prefix(runs: Runs, offline: dict[str, Any] | None) -> Goal:
    p = _pair(runs, "prefix_caching/on", "prefix_caching/off")
    r = p[0].ttft_s.p50 / p[1].ttft_s.p50 if p else math.nan
    detail = f"median TTFT {1000 * p[0].ttft_s.p50:.0f} vs {1000 * p[1].ttft_s.p50:.0f} ms" if p else ""
    return _goal("prefix-cache hit / cold TTFT (1,024 shared tokens)", "≤ 0.15", r, lambda x: x <= 0.15, detail)


def _http(runs: Runs, offline: dict[str, Any] | None) -> Goal:
    p = _pair(runs, "saturation/grpc", "saturation/http")
    r = p[0].output_tokens_per_s / p[1].output_tokens_per_s - 1 if p else math.nan
    detail = (f"{p[1].output_tokens_per_s:.1f} (HTTP) vs {p[0].output_tokens_per_s:.1f} (gRPC) tok/s; "
              f"mean TPOT {1000 * p[1].tpot_s.mean:.0f} vs {1000 * p[0].tpot_s.mean:.0f} ms") if p else ""  # fmt: skip
    return _goal("HTTP gateway overhead per output token vs gRPC", "≤ 5%", r, lambda x: x <= 0.05, detail)


GOALS = (_chunked, _paged, _continuous, _offline, _prefix, _http)


def goals(runs: Runs, offline: dict[str, Any] | None) -> list[Goal]:
    """The issue's goals, in its order, each a ratio of two runs of this one run (or 'not measured')."""
    return [goal(runs, offline) for goal in GOALS]


def _ratio(g: Goal) -> str:
    if g.met is None:
        return "–"
    return f"{100 * g.ratio:+.1f}%" if g.target.endswith("%") else f"{g.ratio:.2f}"


def goals_table(gs: list[Goal]) -> list[str]:
    lines = ["| goal | target | measured | figures | met |", "|---|---|---:|---|---|"]
    for g in gs:
        met = "not measured" if g.met is None else ("**yes**" if g.met else "**no**")
        lines.append(f"| {g.name} | {g.target} | {_ratio(g)} | {g.detail} | {met} |")
    return lines


PLOTS = (  # file, runs, title
    ("serving-continuous-vs-static.png", ("continuous_batching/continuous", "continuous_batching/static"),
     "continuous vs static batching (staggered arrivals)"),
    ("serving-chunked-prefill.png", ("chunked_prefill/chunked", "chunked_prefill/unchunked"),
     "chunked vs whole prefill (long prompts arriving during decodes)"),
    ("serving-saturation.png", ("saturation/grpc", "saturation/http"),
     "16 concurrent streams: infer over gRPC and HTTP"),
    ("serving-prefix-caching.png", ("prefix_caching/on", "prefix_caching/off"), "prefix caching on vs off"),
)  # fmt: skip


def plots(runs: Runs, out_dir: Path) -> list[Path]:
    written = []
    for name, keys, title in PLOTS:
        chosen = [r for k in keys for r in runs.get(k, [])]
        if chosen:
            written.append(plot_cdfs(chosen, out_dir / name, title))
    if len(runs.get("mixed", [])) > 1:
        written.append(plot_sweep(runs["mixed"], out_dir / "serving-rate-sweep.png", "mixed workload: rate sweep"))
    return written


CONFIGS = {
    "continuous": "the defaults: continuous batching, paged KV, chunked prefill (256-token steps), prefix caching",
    "static": "`--batching static`: a batch is gathered, run to its end, then the next",
    "full": "`--kv-reserve full`: each request reserves max_model_len of KV blocks at admission",
    "unchunked": "`--no-enable-chunked-prefill --max-num-batched-tokens 2048`: each prompt prefilled whole",
    "no_prefix": "`--no-enable-prefix-caching`",
}


def _intro(meta: dict[str, Any]) -> list[str]:
    return [
        "# Online serving",
        "",
        f"Measured by `{meta['command']}` on {meta['machine']} in {meta['wall_s'] / 60:.1f} min; model "
        "SmolLM2-135M-Instruct (fp32 for infer unless a run says another precision; llama.cpp serves the Q4_1 GGUF "
        "it was converted from). Every "
        "figure comes from this one run: each server is started on free 127.0.0.1 ports, driven by `infer bench`'s "
        "load generator over gRPC (or the OpenAI HTTP gateway where said), then stopped. Prompts are token ids from "
        "a seed (exact lengths), greedy, `ignore_eos`. The CPU is shared with other work: compare the ratios, "
        "not the absolute numbers with another run.",
        "",
    ]


def _configs(meta: dict[str, Any]) -> list[str]:
    lines = [f"Every infer server: `--num-blocks {meta['num_blocks']}` (the same KV bytes, {meta['num_blocks']} "
             f"blocks of 16 tokens), `--max-model-len {meta['max_model_len']}`, otherwise:", ""]  # fmt: skip
    lines += [f"- `{name}`: {text}" for name, text in CONFIGS.items()]
    peer = meta["llama"] or "not run"
    lines += ["- the peer comparison above: its own KV size (llama-server's context), `--no-enable-prefix-caching` "
              "and each precision (`--dtype bfloat16`, "
              "`--quantization ...`), with speculation on and off; llama.cpp `llama-server -np 16 -t 2` "
              f"({peer}) over its OpenAI `/v1/completions` with token-id prompts, `cache_prompt: false`",
              ""]  # fmt: skip
    return lines


def markdown(result: dict[str, Any], meta: dict[str, Any], images: list[Path]) -> str:
    runs: Runs = result["runs"]
    offline = result["offline"]
    lines = [*_intro(meta), "## Goals (ratios from this run)", "", *goals_table(goals(runs, offline)), ""]
    if result.get("peers"):
        lines += matrix_report.markdown(result["peers"], "over HTTP")
    lines += ["## Configurations", "", *_configs(meta), "## Every run", ""]
    lines += [f"SLOs for goodput: {slo_text(next(iter(runs.values()))[0].slo)}." if runs else "", ""]
    lines += [*markdown_table([r for group in runs.values() for r in group]), ""]
    if offline:
        lines += [f"Offline `LLM.generate` on the saturation prompts (16 running at most, same KV blocks): "
                  f"{offline['output_tokens_per_s']:.1f} output tok/s ({offline['output_tokens']} tokens in "
                  f"{offline['seconds']:.1f} s).", ""]  # fmt: skip
    lines += ["Servers in order, their wall time, and the 1-minute load average of the machine before → after "
              "(2 cores; above 2, other work competed for them):", ""]  # fmt: skip
    lines += [f"- {note}" for note in result["notes"]] + [""]
    lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in images] + [""]
    return "\n".join(lines)


def write_report(result: dict[str, Any], meta: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    images = plots(result["runs"], out_dir)
    runs = {key: [r.to_json(with_requests=False) for r in group] for key, group in result["runs"].items()}
    gs = [
        g.__dict__ | {"ratio": None if math.isnan(g.ratio) else g.ratio}
        for g in goals(result["runs"], result["offline"])
    ]
    peers = result.get("peers")
    if peers:
        gs += matrix_report.goals(peers["rounds"], peers["precisions"], "over HTTP")
    data = {"meta": meta, "goals": gs, "offline": result["offline"], "peers": peers, "runs": runs,
            "notes": result["notes"]}  # fmt: skip
    json_path, md_path = out_dir / "serving.json", out_dir / "serving.md"
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    md_path.write_text(markdown(result, meta, images))
    return [json_path, md_path, *images]
