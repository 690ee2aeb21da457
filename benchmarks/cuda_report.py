"""docs/benchmarks/cuda.json and cuda.md from a run of benchmarks/cuda.py: issue 39's goals first, each with
its figure and pass or fail (or why it was not measured), then every figure of every model."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SMALL, MID = "smollm2-135m", "qwen2.5-1.5b"


@dataclass(frozen=True)
class Goal:
    name: str
    target: str
    value: float | None  # None: not measured
    shown: str  # the value as the table shows it, or why it was not measured
    passed: bool | None  # None: not measured


def _get(d: Any, *keys: Any) -> Any:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _goal(name: str, target: str, value: float | None, ok: Callable[[float], bool], fmt: str, why: str) -> Goal:
    if value is None or not math.isfinite(value):
        return Goal(name, target, None, f"not measured: {why}", None)
    return Goal(name, target, value, fmt.format(value), ok(value))


def decode_limit_share(results: dict[str, Any], key: str) -> float | None:
    """Batch-1 decode (graphs on) over the limit reading the weights once a token sets: bandwidth / bytes."""
    tok_s, nbytes = _get(results, "models", key, "engines", "graphs_on", "batch1_decode_tok_s"), None
    nbytes = _get(results, "models", key, "decode_bytes")
    if tok_s is None or not nbytes:
        return None
    return float(tok_s) / (results["bandwidth_bytes_s"] / nbytes)


def goals(results: dict[str, Any]) -> list[Goal]:
    c_small, c_mid = results["settings"]["concurrency"]
    small, mid = f"{SMALL} (bf16)", f"{MID} shape (bf16)"
    host = _get(results, "models", SMALL, "engines", "graphs_on", "host", 1)
    host_why = (host or {}).get("why", "not run")
    served_small = _get(results, "models", SMALL, "server", str(c_small), "output_tok_s")
    served_mid = _get(results, "models", MID, "server", str(c_mid), "output_tok_s")
    hf_mid = _get(results, "models", MID, "hf", "padded16_tok_s")
    parities = {k: m["parity"] for k, m in results["models"].items() if "parity" in m}
    return [
        _goal(f"host share of a batch-1 decode step, {small}, graphs on", "≤ 15%", _get(host, "host_share"),
              lambda v: v <= 0.15, "{:.0%}", host_why),
        _goal(f"batch-1 decode, {small}, graphs on", "≥ 1,000 tok/s",
              _get(results, "models", SMALL, "engines", "graphs_on", "batch1_decode_tok_s"),
              lambda v: v >= 1000, "{:,.0f} tok/s", "not run"),
        _goal(f"{c_small} concurrent through the server, {small}", "≥ 10,000 output tok/s", served_small,
              lambda v: v >= 10_000, "{:,.0f} tok/s", "not run"),
        _goal(f"batch-1 decode, {mid}, graphs on, share of the HBM bandwidth limit", "≥ 60%",
              decode_limit_share(results, MID), lambda v: v >= 0.60, "{:.0%}", "not run"),
        _goal(f"{c_mid} concurrent through the server against transformers' padded batches of 16, {mid}", "≥ 10×",
              served_mid / hf_mid if served_mid and hf_mid else None, lambda v: v >= 10, "{:.1f}×", "not run"),
        _parity_goal(parities),
    ]  # fmt: skip


def _parity_goal(parities: dict[str, dict[str, Any]]) -> Goal:
    n = len(parities)
    name = f"greedy tokens and logprobs identical, graphs on and off ({n} model{'' if n == 1 else 's'})"
    if not parities:
        return Goal(name, "identical", None, "not measured: not run", None)
    differ = [k for k, p in parities.items() if not p["identical"]]
    shown = "differ: " + ", ".join(differ) if differ else "identical"
    return Goal(name, "identical", float(not differ), shown, not differ)


def _f(v: Any, fmt: str = "{:,.0f}") -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v)


def _captured(graphs: dict[str, Any] | None) -> str:
    """The graphs-on engine's capture: sizes, seconds, pool MiB (none: it ran eagerly)."""
    if not graphs or not graphs["sizes"]:
        return "none" if graphs is not None else "–"
    return f"{len(graphs['sizes'])} sizes, {graphs['capture_s']:.1f} s, {graphs['memory_bytes'] / 2**20:,.0f} MiB"


def _parity_cell(parity: dict[str, Any]) -> str:
    if parity["identical"]:
        return "identical"
    tokens = "equal" if parity["tokens_equal"] else "DIFFER"
    return f"tokens {tokens}, max Δlogprob {parity['max_logprob_diff']:.2g}"


def _verdict(g: Goal) -> str:
    return "not measured" if g.passed is None else "pass" if g.passed else "**FAIL**"


def markdown(results: dict[str, Any], gs: list[Goal]) -> str:
    r, st = results, results["settings"]
    v = r["versions"]
    lines = [
        "# Real model sizes on CUDA" + (" (dry run: tiny shapes)" if r["tiny"] else ""),
        "",
        f"`make bench-gpu` (benchmarks/cuda.py) on **{r['device']}**; torch {v['torch']}, triton "
        f"{v.get('triton', '–')}, transformers {v['transformers']}, Python {v['python']}. Models of the real shapes "
        "with random bf16 weights drawn on the device (benchmarks/cuda_models.py); greedy, `ignore_eos`, no prefix "
        f"caching; max_num_seqs {st['max_num_seqs']}, max_model_len {st['max_model_len']}, prompts of "
        f"{st['prompt_tokens']} tokens. HBM bandwidth {r['bandwidth_bytes_s'] / 1e12:.2f} TB/s "
        f"({r['bandwidth_source']}). The run took {r['elapsed_s']:.0f} s of a {st['budget_s']:.0f} s budget. "
        "Every figure comes from this one run.",
        "",
        "## Goals (issue 39)",
        "",
        "| goal | target | measured | |",
        "|---|---|---:|---|",
        *[f"| {g.name} | {g.target} | {g.shown} | {_verdict(g)} |" for g in gs],
        "",
    ]
    if r["skipped"]:
        lines += ["Not run (the time budget was spent): " + "; ".join(r["skipped"]) + ".", ""]
    errors = [f"{k}: {m['error'].splitlines()[0][:300]}" for k, m in r["models"].items() if "error" in m]
    errors += [f"{k}, {name}: {e['error'].splitlines()[0][:300]}" for k, m in r["models"].items()
               for name, e in (m.get("engines") or {}).items() if "error" in e]  # fmt: skip
    if errors:
        lines += ["Stopped by an error (the figures before it stand):", "", *[f"- `{e}`" for e in errors], ""]
    lines += _model_table(r) + _sweep_table(r) + _server_table(r)
    return "\n".join(lines)


def _model_table(r: dict[str, Any]) -> list[str]:
    lines = [
        "## Each model",
        "",
        "Batch-1 decode: one stream's tokens over the time from its first to its last. Limit: HBM bandwidth over "
        "the bytes of weights a decode step reads. Host share: 1 − the GPU's kernel time (torch.profiler) over the "
        "wall time of a decode step.",
        "",
        "| model | weights read / step | batch-1 tok/s graphs on | off | transformers | of the limit | host share b1 "
        "on | off | host share b16 on | off | on = off (tokens, logprobs) | graphs captured | load s on |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for key, m in r["models"].items():
        on, off = _get(m, "engines", "graphs_on") or {}, _get(m, "engines", "graphs_off") or {}
        label = m["label"] + (f", first {m['num_layers']} layers" if m.get("num_layers") else "")
        share = decode_limit_share(r, key)
        parity, hf = m.get("parity"), m.get("hf") or {}
        same = "–" if parity is None else _parity_cell(parity)
        hf_b1 = "error" if "error" in hf else _f(hf.get("batch1_decode_tok_s"))
        pct = "{:.0%}"
        cells = [label, f"{_f(m.get('decode_bytes'), '{:,}')} B", _f(on.get("batch1_decode_tok_s")),
                 _f(off.get("batch1_decode_tok_s")), hf_b1, _f(share, pct),
                 _f(_get(on, "host", 1, "host_share"), pct), _f(_get(off, "host", 1, "host_share"), pct),
                 _f(_get(on, "host", 16, "host_share"), pct), _f(_get(off, "host", 16, "host_share"), pct), same,
                 _captured(on.get("graphs")), _f(on.get("load_s"), "{:.1f}")]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    errors = [f"{k}: {m['hf']['error']}" for k, m in r["models"].items() if "error" in (m.get("hf") or {})]
    return [*lines, "", *(["transformers did not run: " + "; ".join(errors), ""] if errors else [])]


def _sweep_table(r: dict[str, Any]) -> list[str]:
    sizes = r["settings"]["capture_sizes"]
    lines = [
        "## Decode at each captured batch size",
        "",
        f"Decode tok/s (all rows together) of a batch of that many {r['settings']['prompt_tokens']}-token prompts "
        f"over {r['settings']['new_tokens'] - 1} decode steps, CUDA graphs on / off.",
        "",
        "| model | " + " | ".join(str(b) for b in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    for m in r["models"].values():
        on, off = _get(m, "engines", "graphs_on", "sizes") or {}, _get(m, "engines", "graphs_off", "sizes") or {}
        cells = [f"{_f(_get(on, b, 'tok_s'))} / {_f(_get(off, b, 'tok_s'))}" for b in sizes]
        lines.append(f"| {m['label']} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _server_table(r: dict[str, Any]) -> list[str]:
    lines = [
        "## Through the server",
        "",
        "`infer serve` (graphs on) driven over gRPC by `infer bench`'s load generator: each stream runs two "
        f"requests of {r['settings']['server_tokens']} new tokens. transformers: the first "
        f"{r['settings']['hf_requests']} of the same requests in left-padded batches of 16, credited with every "
        "token.",
        "",
        "| model | streams | output tok/s | TTFT p50 s | TPOT mean ms | transformers padded 16 tok/s | ready s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for m in r["models"].values():
        server = m.get("server") or {}
        for c, f in server.items():
            if c == "ready_s":
                continue
            hf = _get(m, "hf", "padded16_tok_s") if c != "1" else None
            cells = [m["label"], c, _f(f["output_tok_s"]), _f(f["ttft_p50_s"], "{:.3f}"),
                     _f(f["tpot_mean_s"] * 1e3, "{:.2f}"), _f(hf), _f(server["ready_s"], "{:.1f}")]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def write_report(results: dict[str, Any], out_dir: Path) -> None:
    gs = goals(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "cuda.json").write_text(json.dumps({**results, "goals": [asdict(g) for g in gs]}, indent=2) + "\n")
    (out_dir / "cuda.md").write_text(markdown(results, gs))
