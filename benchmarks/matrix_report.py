"""The Markdown and the goals of a bench_matrix run (offline.md and serving.md each get this section)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from bench_matrix import LLAMA, WORKLOADS, Round, median_figure, median_ratio

# (key, metric, column title)
COLUMNS = tuple(
    (f"{w}/{load}", metric, title)
    for w in WORKLOADS
    for load, metric, title in (
        ("batch1", "decode_tok_s", f"{w}: batch-1 decode tok/s"),
        ("batch1", "output_tok_s", f"{w}: batch-1 output tok/s"),
        ("batch1", "ttft_p50_s", f"{w}: batch-1 TTFT P50 ms"),
        ("c16", "output_tok_s", f"{w}: 16 concurrent output tok/s"),
    )
)


def _cell(rounds: Sequence[Round], system: str, key: str, metric: str, against: str | None) -> str:
    value = median_figure(rounds, system, key, metric)
    if value is None:
        return "–"
    if metric == "ttft_p50_s":  # NOTE: a time (lower is better): no ratio beside it
        return f"{1000 * value:.0f}"
    text = f"{value:.1f}"
    ratio = median_ratio(rounds, system, against, key, metric) if against else None
    return f"{text} ({ratio:.2f}×)" if ratio is not None else text


def systems_table(rounds: Sequence[Round], systems: Sequence[str]) -> list[str]:
    """One row a system, one column a figure: the median over rounds, and (x) the median per-round ratio of a
    tok/s to llama-server's where it ran."""
    against = LLAMA if any(LLAMA in r for r in rounds) else None
    lines = ["| system | " + " | ".join(title for _, _, title in COLUMNS) + " |",
             "|---|" + "---:|" * len(COLUMNS)]  # fmt: skip
    for system in systems:
        other = None if system == LLAMA else against
        cells = [_cell(rounds, system, key, metric, other) for key, metric, _ in COLUMNS]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    return lines


def speculation_table(rounds: Sequence[Round], precisions: Sequence[str]) -> list[str]:
    """Speculation on / off for each precision: the median per-round ratio of each figure."""
    shown = [c for c in COLUMNS if c[1] != "ttft_p50_s"]
    lines = ["| precision: on / off | " + " | ".join(title for _, _, title in shown) + " |",
             "|---|" + "---:|" * len(shown)]  # fmt: skip
    for p in precisions:
        cells = []
        for key, metric, _ in shown:
            r = median_ratio(rounds, f"{p}+spec", p, key, metric)
            cells.append("–" if r is None else f"{r:.2f}×")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return lines


def _best(rounds: Sequence[Round], candidates: Sequence[str], key: str, metric: str) -> str | None:
    scored = [(v, s) for s in candidates if (v := median_figure(rounds, s, key, metric)) is not None]
    return max(scored)[1] if scored else None


def _goal(name: str, target: float, ratio: float | None, detail: str) -> dict[str, Any]:
    measured = ratio is not None and not math.isnan(ratio)
    return {"name": name, "target": f"≥ {target:g}×", "ratio": ratio if measured else None,
            "met": (ratio >= target) if measured and ratio is not None else None,
            "detail": detail if measured else "not run"}  # fmt: skip


def goals(rounds: Sequence[Round], precisions: Sequence[str], where: str) -> list[dict[str, Any]]:
    """Issue 21's goals from this run: infer's best precision (speculation off) against llama-server on random
    tokens, and speculation on / off for that precision on both workloads."""
    out = []
    for key, metric, what, target in (
        ("random/batch1", "decode_tok_s", "batch-1 decode tok/s", 1.5),
        ("random/c16", "output_tok_s", "output tok/s, 16 concurrent", 3.5),
    ):
        best = _best(rounds, precisions, key, metric)
        ratio = median_ratio(rounds, best, LLAMA, key, metric) if best else None
        ours, theirs = (median_figure(rounds, s, key, metric) if s else None for s in (best, LLAMA))
        detail = f"{ours:.1f} ({best}) vs {theirs:.1f}" if ours is not None and theirs is not None else ""
        out.append(_goal(f"best precision / llama-server, {what} ({where})", target, ratio, detail))
    best = _best(rounds, precisions, "grounded/batch1", "output_tok_s")
    for key, target in (("grounded/batch1", 1.8), ("random/batch1", 0.95)):
        ratio = median_ratio(rounds, f"{best}+spec", best, key, "output_tok_s") if best else None
        on, off = (median_figure(rounds, s, key, "output_tok_s") for s in (f"{best}+spec", str(best)))
        detail = f"{on:.1f} vs {off:.1f} tok/s ({best})" if on is not None and off is not None else ""
        out.append(_goal(f"speculation on / off, batch-1 output tok/s, {key.split('/')[0]} ({where})", target,
                         ratio, detail))  # fmt: skip
    return out


def goals_table(gs: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["| goal | target | measured | figures | met |", "|---|---|---:|---|---|"]
    for g in gs:
        met = "not measured" if g["met"] is None else ("**yes**" if g["met"] else "**no**")
        ratio = "–" if g["ratio"] is None else f"{g['ratio']:.2f}"
        lines.append(f"| {g['name']} | {g['target']} | {ratio} | {g['detail']} | {met} |")
    return lines


def markdown(result: dict[str, Any], where: str) -> list[str]:
    """The section: goals, every system, speculation on / off, how it ran."""
    rounds, precisions, systems = result["rounds"], result["precisions"], result["systems"]
    lines = [f"## infer against llama-server: every precision, two workloads, batch 1 and 16 concurrent ({where})",
             "", *result["intro"], "", *goals_table(goals(rounds, precisions, where)), "",
             *systems_table(rounds, systems), ""]  # fmt: skip
    if any(s.endswith("+spec") for s in systems):
        lines += ["Speculation on / off (median of the per-round ratios):", "",
                  *speculation_table(rounds, precisions), ""]  # fmt: skip
    lines += [f"- {note}" for note in result["notes"]] + [""]
    return lines
