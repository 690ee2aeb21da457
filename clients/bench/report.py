"""A bench run's outputs: JSON (summary and every request), a Markdown table, PNG plots."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from infer.clients.bench.metrics import BenchRun, Slo, Summary


def _ms(x: float) -> str:
    return "–" if math.isnan(x) else f"{1000 * x:.0f}"


def _num(x: float, digits: int = 1) -> str:
    return "–" if math.isnan(x) else f"{x:.{digits}f}"


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{k} ×{v}" for k, v in sorted(errors.items())) or "none"


TABLE_HEAD = [
    "| run | ok/sent | req/s | output tok/s | TTFT mean / P50 / P90 / P99 ms | ITL P50 / P90 / P99 ms "
    "| TPOT mean ms | E2E P50 / P99 s | goodput req/s (SLO met) | errors |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
]


def table_row(label: str, s: Summary) -> str:
    t, i = s.ttft_s, s.itl_s
    return (
        f"| {label} | {s.num_ok}/{s.num_requests} | {_num(s.requests_per_s, 2)} | {_num(s.output_tokens_per_s)} "
        f"| {_ms(t.mean)} / {_ms(t.p50)} / {_ms(t.p90)} / {_ms(t.p99)} | {_ms(i.p50)} / {_ms(i.p90)} / {_ms(i.p99)} "
        f"| {_ms(s.tpot_s.mean)} | {_num(s.e2e_s.p50, 2)} / {_num(s.e2e_s.p99, 2)} "
        f"| {_num(s.goodput_requests_per_s, 2)} ({_num(100 * s.slo_attainment, 0)}%) | {_errors(s.errors)} |"
    )


def markdown_table(runs: Sequence[BenchRun]) -> list[str]:
    lines = list(TABLE_HEAD)
    for run in runs:
        lines.append(table_row(run.label, run.summary))
        lines += [table_row(f"{run.label} — `{tag}` requests", s) for tag, s in run.by_tag().items()]
    return lines


def slo_text(slo: Slo) -> str:
    parts = [f"{name} ≤ {1000 * v:.0f} ms" for name, v in (("TTFT", slo.ttft_s), ("TPOT", slo.tpot_s),
             ("E2E", slo.e2e_s)) if v is not None]  # fmt: skip
    return ", ".join(parts) or "none (every successful request counts)"


def markdown(runs: Sequence[BenchRun], title: str = "infer bench") -> str:
    first = runs[0]
    lines = [
        f"# {title}",
        "",
        f"Target {first.target}; workload `{first.workload}`; SLOs: {slo_text(first.slo)}. Times are measured "
        "by the client: TTFT from sending to the first output, ITL between output messages (gRPC) or content "
        "chunks (HTTP), TPOT = (E2E − TTFT) / (tokens − 1).",
        "",
        *markdown_table(runs),
        "",
    ]
    return "\n".join(lines)


def write_outputs(runs: Sequence[BenchRun], out_dir: Path, stem: str = "bench", plots: bool = True) -> list[Path]:
    """`stem`.json and `stem`.md, and with `plots` the latency CDFs (and the rate sweep) as PNG."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    written[0].write_text(json.dumps({"runs": [r.to_json() for r in runs]}, indent=1) + "\n")
    written[1].write_text(markdown(runs))
    if plots:
        from infer.clients.bench.plots import plot_cdfs, plot_sweep

        written.append(plot_cdfs(runs, out_dir / f"{stem}-latency-cdf.png"))
        if sum(r.rate is not None for r in runs) > 1:
            written.append(plot_sweep(runs, out_dir / f"{stem}-rate-sweep.png"))
    return written
