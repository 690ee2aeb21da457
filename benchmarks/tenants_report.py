"""`make bench-tenants`: the figures of a phase (from the client's per-request results), the goals, the report and
the plot. No server here: benchmarks/tenants.py runs the loads; tests feed this module made-up results."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from infer.clients.bench.metrics import percentile
from infer.clients.bench.targets import RequestResult

HEAVY, LIGHT, PROBE = "heavy", "light", "probe"
HTTP_PHASE = "contention_http"  # the contention phase through the server's OpenAI gateway
PHASES = ("contention", HTTP_PHASE, "shares")
ALONE = {"contention": "alone_ttft_s", HTTP_PHASE: "alone_http_ttft_s", "shares": "alone_ttft_s"}  # its solo TTFTs
BIN_S = 2.0  # the plot's time step
# the goals (issue 30, restated by issue 40): a step is the mean of the heavy requests' inter-token gaps in the phase
GOAL_STEPS = 2  # fair: light TTFT P99 <= its TTFT alone (P50) + 2 steps; priority: a probe's TTFT <= prefill + 2
GOAL_SHARE = 0.10  # fair: each share within 10% (relative) of its weight share
GOAL_TOTAL = 0.95  # output tokens per busy second of the engine (its counters) >= 0.95x fcfs's


# one phase
def token_times(r: RequestResult, offset_s: float = 0.0) -> list[float]:
    """When each output token reached the client, from the phase's start (a message's tokens share its time)."""
    if r.ttft_s is None or r.output_tokens <= 0:
        return []
    at = [offset_s + r.sent_s + r.ttft_s]
    for gap in r.gaps_s:
        at.append(at[-1] + gap)
    per_message = r.output_tokens / len(at)
    return [t for i, t in enumerate(at) for _ in range(_share(i, per_message))]


def _share(i: int, per_message: float) -> int:
    return round((i + 1) * per_message) - round(i * per_message)


def in_window(times: Iterable[float], window: tuple[float, float]) -> int:
    return sum(window[0] <= t < window[1] for t in times)


def series(times: Sequence[float], end_s: float, bin_s: float = BIN_S) -> list[float]:
    """Output tok/s in consecutive bins of `bin_s` from 0 to `end_s`."""
    bins = [0] * max(1, math.ceil(end_s / bin_s))
    for t in times:
        if 0 <= t < end_s:
            bins[int(t // bin_s)] += 1
    return [n / bin_s for n in bins]


def phase_figures(tenants: dict[str, tuple[float, Sequence[RequestResult]]], window: tuple[float, float],
                  end_s: float) -> dict[str, Any]:  # fmt: skip
    """One phase: `tenants` maps a tenant to (its load's start offset in the phase, its results); `window` is
    when every tenant was backlogged (or the light tenant's load ran); `end_s` when the load stopped."""
    length_s = window[1] - window[0]
    out: dict[str, Any] = {"window_s": list(window), "end_s": end_s, "tenants": {}}
    for tenant, (offset_s, results) in tenants.items():
        times = sorted(t for r in results for t in token_times(r, offset_s))
        gaps = [g for r in results for g, at in zip(r.gaps_s, token_times(r, offset_s)[1:], strict=False)
                if window[0] <= at < window[1]]  # fmt: skip
        out["tenants"][tenant] = {
            "tokens": in_window(times, window),
            "tok_s": in_window(times, window) / length_s if length_s > 0 else math.nan,
            "ttft_s": [r.ttft_s for r in results if r.ttft_s is not None and r.ok],
            "num_sent": len(results),
            "num_done": sum(r.ok for r in results),
            "num_failed": sum(not r.ok and r.status != "stopped" for r in results),
            "step_s": statistics.median(gaps) if gaps else math.nan,
            "step_mean_s": statistics.fmean(gaps) if gaps else math.nan,
            "series": series(times, end_s),
        }
        if tenant == PROBE:
            out["tenants"][tenant]["sent_s"] = [offset_s + r.sent_s for r in results]
    counted = [v for k, v in out["tenants"].items() if k != PROBE]
    total = sum(v["tokens"] for v in counted)
    out["total_tok_s"] = total / length_s if length_s > 0 else math.nan
    for v in counted:
        v["share"] = v["tokens"] / total if total else math.nan
    return out


# over rounds
def pooled(rounds: list[dict[str, Any]], setup: str, phase: str, tenant: str, key: str) -> list[float]:
    return [x for r in rounds if phase in r["setups"].get(setup, {})
            for x in r["setups"][setup][phase]["tenants"].get(tenant, {}).get(key, [])]  # fmt: skip


def _phases(rounds: list[dict[str, Any]], setup: str, phase: str) -> list[dict[str, Any]]:
    return [r["setups"][setup][phase] for r in rounds if phase in r["setups"].get(setup, {})]


def ttft_row(values: Sequence[float]) -> dict[str, float]:
    return {"p50_s": percentile(values, 50), "p99_s": percentile(values, 99), "count": len(values)}


def summarize(rounds: list[dict[str, Any]], setups: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The tables: light TTFT alone and per policy, shares per setup, throughput ratios to fcfs, the probes."""
    alone = [x for r in rounds for setup in r["setups"].values() for x in setup.get("alone_ttft_s", [])]
    table: dict[str, Any] = {"alone": ttft_row(alone), **{phase: {} for phase in PHASES}}
    for phase in PHASES:
        fcfs = {i: r["setups"]["fcfs"][phase] for i, r in enumerate(rounds) if phase in r["setups"].get("fcfs", {})}
        for name, setup in setups.items():
            done = [(i, r["setups"][name][phase]) for i, r in enumerate(rounds) if phase in r["setups"].get(name, {})]
            if done:
                table[phase][name] = setup_row(rounds, name, setup["weights"], phase, done, fcfs)
    table["probes"] = probe_bounds(rounds)
    table["probes_http"] = probe_bounds(rounds, HTTP_PHASE, "probe_solo_http_ttft_s")
    return table


def setup_row(rounds: list[dict[str, Any]], name: str, weights: dict[str, float], phase: str,
              done: list[tuple[int, dict[str, Any]]], fcfs: dict[int, dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """One setup's phase over the rounds (`done`: the round and its phase); `fcfs`: fcfs's phase in each round."""
    tokens = {t: sum(p["tenants"][t]["tokens"] for _, p in done) for t in (HEAVY, LIGHT)}
    total = sum(tokens.values())
    vs_fcfs = [p["total_tok_s"] / fcfs[i]["total_tok_s"] for i, p in done if i in fcfs]
    by_engine = [_ratio(busy_rate(p), busy_rate(fcfs[i])) for i, p in done if i in fcfs]
    row = {
        "total_tok_s": statistics.median(p["total_tok_s"] for _, p in done),
        "vs_fcfs": statistics.median(vs_fcfs) if vs_fcfs else math.nan,
        "share": {t: n / total if total else math.nan for t, n in tokens.items()},
        "weight_share": weight_shares(weights),
        "light": ttft_row(pooled(rounds, name, phase, LIGHT, "ttft_s")),
        "alone": ttft_row([x for r in rounds for x in r["setups"].get(name, {}).get(ALONE[phase], [])]),
        "probe": ttft_row(pooled(rounds, name, phase, PROBE, "ttft_s")),
        "heavy_per_light": _ratio(sum(p["tenants"][HEAVY]["num_done"] for _, p in done),
                                  sum(p["tenants"][LIGHT]["num_sent"] for _, p in done)),
        "vs_fcfs_rounds": vs_fcfs,
        "engine": engine_work([p.get("engine") for _, p in done]),
        "engine_vs_fcfs_rounds": by_engine,
        "engine_vs_fcfs": statistics.median(by_engine) if by_engine and not any(map(math.isnan, by_engine))
        else math.nan,
        "step_s": statistics.median(p["tenants"][HEAVY]["step_s"] for _, p in done),
        "step_mean_s": statistics.median(p["tenants"][HEAVY]["step_mean_s"] for _, p in done),
        "failed": sum(p["tenants"][t]["num_failed"] for _, p in done for t in p["tenants"]),
    }  # fmt: skip
    row["deviation"] = max(abs(row["share"][t] / row["weight_share"][t] - 1) for t in (HEAVY, LIGHT))
    row["light_bound_s"] = row["alone"]["p50_s"] + GOAL_STEPS * row["step_mean_s"]
    row["busy_tok_s"] = busy_rate(row)
    return row


def busy_rate(phase: dict[str, Any]) -> float:
    """Output tokens per second of the engine's steps over a phase (or a row's rounds), from its own counters:
    its idle time and the load generator's do not count; NaN where the phase did not read them (an older run)."""
    work = phase.get("engine") or {}
    return _ratio(work["generation_tokens"], work["step_s"]) if "step_s" in work else math.nan


def engine_work(phases: Sequence[dict[str, float] | None]) -> dict[str, float] | None:
    """The server's counters summed over the rounds (None when a phase did not read them: an older run)."""
    if not phases or any(p is None for p in phases):
        return None
    return {key: sum(p[key] for p in phases if p is not None) for key in phases[0] or {}}


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def weight_shares(weights: dict[str, float]) -> dict[str, float]:
    w = {t: weights.get(t, 1.0) for t in (HEAVY, LIGHT)}
    return {t: v / sum(w.values()) for t, v in w.items()}


def probe_bounds(
    rounds: list[dict[str, Any]], phase: str = "contention", solo_key: str = "probe_solo_ttft_s"
) -> dict[str, Any]:
    """The priority setup's high-priority probes against their round's prefill (solo TTFT, `solo_key`) plus two
    steps, in `phase`."""
    bounds, ttfts, within, within_mean = [], [], 0, 0
    for r in rounds:
        setup = r["setups"].get("priority", {})
        if phase not in setup or not setup.get(solo_key):
            continue
        prefill_s = statistics.median(setup[solo_key])
        step_s = setup[phase]["tenants"][HEAVY]["step_s"]
        mean_s = setup[phase]["tenants"][HEAVY]["step_mean_s"]
        bound, bound_mean = prefill_s + GOAL_STEPS * step_s, prefill_s + GOAL_STEPS * mean_s
        probes = setup[phase]["tenants"].get(PROBE, {}).get("ttft_s", [])
        bounds.append({"prefill_s": prefill_s, "step_s": step_s, "bound_s": bound, "step_mean_s": mean_s,
                       "bound_mean_s": bound_mean, "ttft_s": probes})  # fmt: skip
        ttfts += probes
        within += sum(t <= bound for t in probes)
        within_mean += sum(t <= bound_mean for t in probes)
    return {"rounds": bounds, "ttft": ttft_row(ttfts), "max_s": max(ttfts, default=math.nan),
            "within": within, "within_mean": within_mean, "count": len(ttfts)}  # fmt: skip


# goals
def goals(table: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for phase, over in (("contention", ""), (HTTP_PHASE, " over HTTP")):
        fair = table.get(phase, {}).get("fair 1:1")
        if fair:
            rows.append(_goal(
                f"fair{over}: light tenant's TTFT P99 at saturation",
                f"≤ its TTFT alone + {GOAL_STEPS} mean steps ({_ms(fair['light_bound_s'])})",
                f"{_ms(fair['light']['p99_s'])} (alone P50 {_ms(fair['alone']['p50_s'])}, mean step "
                f"{_ms(fair['step_mean_s'])})",
                fair["light"]["p99_s"] <= fair["light_bound_s"],
            ))  # fmt: skip
    for name, row in table["shares"].items():
        if name.startswith("fair"):
            got = " / ".join(f"{row['share'][t]:.3f} ({row['weight_share'][t]:.3f})" for t in (HEAVY, LIGHT))
            rows.append(_goal(f"{name}: output shares heavy / light (weight share), both backlogged",
                              f"each within {GOAL_SHARE:.0%}", f"{got}: off by {row['deviation']:.1%}",
                              row["deviation"] <= GOAL_SHARE))  # fmt: skip
    for phase in PHASES:
        for name, row in table.get(phase, {}).items():
            if name == "fcfs":
                continue
            target = f"≥ {GOAL_TOTAL}x"
            name_ = f"{name}: output tokens per busy second of the engine / fcfs ({phase})"
            if math.isnan(row["engine_vs_fcfs"]):
                rows.append(_goal(name_, target, "not measured: the run predates the engine's step counters", None))
                continue
            rows.append(_goal(name_, target, f"{row['engine_vs_fcfs']:.3f}x ({row['busy_tok_s']:.1f} tok per busy s; "
                              f"by the clock {row['vs_fcfs']:.3f}x)", row["engine_vs_fcfs"] >= GOAL_TOTAL))  # fmt: skip
    for key, over in (("probes", ""), ("probes_http", " over HTTP")):
        probes = table.get(key)
        if not probes or not probes["count"]:
            continue
        # NOTE: a step at saturation is the mean of the heavy requests' inter-token gaps: most steps there carry
        # a prefill beside the decodes (the median gap is a decode-only step; its bound is in the table below)
        bound = statistics.median(b["bound_mean_s"] for b in probes["rounds"])
        rows.append(
            _goal(
                f"priority{over}: TTFT of a priority -10 request at saturation",
                f"≤ prefill + {GOAL_STEPS} mean steps ({_ms(bound)})",
                f"P50 {_ms(probes['ttft']['p50_s'])}, max {_ms(probes['max_s'])}; "
                f"{probes['within_mean']} of {probes['count']} within",
                probes["within_mean"] == probes["count"],
            )
        )
    return rows


def _goal(name: str, target: str, measured: str, met: bool | None) -> dict[str, Any]:
    """A goal's row; `met` None: not measured."""
    return {"goal": name, "target": target, "measured": measured, "met": None if met is None else bool(met)}


def _met(met: bool | None) -> str:
    return "—" if met is None else "yes" if met else "**no**"


def _ms(s: float) -> str:
    return "—" if math.isnan(s) else f"{1000 * s:.0f} ms"


# report
def write_report(result: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tenants.json").write_text(json.dumps(result, indent=1) + "\n")
    (out_dir / "tenants.md").write_text("\n".join(markdown(result)) + "\n")
    written = [out_dir / "tenants.json", out_dir / "tenants.md"]
    image = plot(result, out_dir / "tenants.png")
    return written + ([image] if image else [])


def markdown(result: dict[str, Any]) -> list[str]:
    table, cfg = result["table"], result["config"]
    lines = ["# Many tenants, one server: fcfs, priority and fair side by side", "",
             f"`make bench-tenants` (benchmarks/tenants.py), {result['date']}, on {result['cpu']} "
             f"({result['cpus']} CPUs); load before the run (`uptime`): {result['load_before']}. "
             f"{len(result['rounds'])} round(s), {result['wall_s']:.0f} s in all. {result['workload']}", "",
             "## Goals (issue 30, restated by issue 40)", "", "A step: the mean of the heavy requests' inter-token "
             "gaps in the phase, on the same server. Throughput: output tokens per second of the engine's steps "
             "(its counters `infer_generation_tokens_total` and `infer_step_time_seconds_total` over the phase) "
             "against fcfs's in the same round; by the clock (the client's output tok/s) in the tables below.", "",
             "| goal | target | measured | met |", "|---|---|---|---|"]  # fmt: skip
    lines += [f"| {g['goal']} | {g['target']} | {g['measured']} | {_met(g['met'])} |" for g in result["goals"]]
    lines += ["", f"## The light tenant under a heavy one ({cfg['heavy_streams']} heavy streams, light at "
              f"{cfg['light_rate']:g} req/s)", "", "Alone: the same server, idle, just before its load.", "",
              "| policy | alone TTFT P50 / P99 | light TTFT P50 | light TTFT P99 | alone P50 + 2 mean steps | "
              "priority -10 TTFT P50 | heavy : light requests | total output tok/s | / fcfs |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    lines += contention_rows(table["contention"])
    if table.get(HTTP_PHASE):
        lines += ["", f"## The same over HTTP ({cfg['heavy_streams']} heavy streams through the gateway, more than "
                  f"the server's {cfg.get('streams_per_connection', '?')} streams per gRPC connection)", "",
                  "The server's OpenAI gateway, streamed /v1/completions; alone: over HTTP too.", "",
                  "| policy | alone TTFT P50 / P99 | light TTFT P50 | light TTFT P99 | alone P50 + 2 mean steps | "
                  "priority -10 TTFT P50 | heavy : light requests | total output tok/s | / fcfs |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        lines += contention_rows(table[HTTP_PHASE])
    lines += ["", f"## Shares while both are backlogged ({cfg['heavy_streams']} heavy streams, "
              f"{cfg['light_streams']} light streams)", "",
              "| setup | heavy share (weight share) | light share (weight share) | off by | total output tok/s | "
              "/ fcfs |", "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, row in table["shares"].items():
        cells = " | ".join(f"{row['share'][t]:.3f} ({row['weight_share'][t]:.3f})" for t in (HEAVY, LIGHT))
        lines.append(
            f"| {name} | {cells} | {row['deviation']:.1%} | {row['total_tok_s']:.1f} | {row['vs_fcfs']:.3f}x |"
        )
    lines += work_table(table)
    lines += ["", "## Priority at saturation", "", "| round | prefill (solo TTFT) | step: median / mean heavy "
              "inter-token gap | bound: prefill + 2 median steps | prefill + 2 mean steps | probes' TTFT |",
              "|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for key, over in (("probes", ""), ("probes_http", " (HTTP)")):
        for i, b in enumerate(table.get(key, {}).get("rounds", [])):
            ttfts = ", ".join(_ms(t) for t in b["ttft_s"])
            lines.append(f"| {i + 1}{over} | {_ms(b['prefill_s'])} | {_ms(b['step_s'])} / {_ms(b['step_mean_s'])} | "
                         f"{_ms(b['bound_s'])} | {_ms(b['bound_mean_s'])} | {ttfts} |")  # fmt: skip
    lines += ["", "![per-tenant output tok/s over time](tenants.png)", "", "## Notes", ""]
    return lines + [f"- {note}" for note in result["notes"]]


def contention_rows(rows: dict[str, Any]) -> list[str]:
    lines = []
    for name, row in rows.items():
        alone = row["alone"]
        lines.append(
            f"| {name} | {_ms(alone['p50_s'])} / {_ms(alone['p99_s'])} | {_ms(row['light']['p50_s'])} | "
            f"{_ms(row['light']['p99_s'])} | {_ms(row['light_bound_s'])} | "
            f"{_ms(row['probe']['p50_s'])} | {row['heavy_per_light']:.1f} | {row['total_tok_s']:.1f} | "
            f"{row['vs_fcfs']:.3f}x |"
        )
    return lines


def work_table(table: dict[str, Any]) -> list[str]:
    """What each policy cost the engine (its own counters over the phase, all rounds) beside the throughput ratio
    of each round: a policy that preempts pays in recomputed prompt tokens, one that fills fewer seats in output
    tokens per step, and both in output tokens per busy second; the client's clock sees the machine's drift too."""
    rows = [(phase, name, row) for phase in PHASES for name, row in table.get(phase, {}).items()
            if row.get("engine")]  # fmt: skip
    if not rows:
        return []
    lines = ["", "## What each policy cost the engine", "",
             "The server's counters over each phase (all rounds): requests preempted, prompt tokens computed per "
             "output token (every request's prompt, plus what a preempted one recomputes: the part of its prompt and "
             "output the prefix cache no longer holds), output tokens per step and per busy second (the steps' time, "
             "idle time not counted); then each round's ratio to fcfs in the same round, by the engine's counters "
             "(output tokens per busy second: the throughput goal) and by the clock (the client's output tok/s).", "",
             "| phase | setup | preemptions | prompt tokens computed / output token | output tokens / step | "
             "output tokens / busy s | / fcfs by the engine, each round | / fcfs by the clock, each round |",
             "|---|---|---:|---:|---:|---:|---|---|"]  # fmt: skip
    for phase, name, row in rows:
        work = row["engine"]
        per_token = _ratio(work["prompt_tokens"], work["generation_tokens"])
        per_step = _ratio(work["generation_tokens"], work.get("steps", math.nan))
        by_engine = ", ".join(f"{r:.3f}x" for r in row.get("engine_vs_fcfs_rounds", []) if not math.isnan(r)) or "—"
        by_clock = ", ".join(f"{r:.3f}x" for r in row.get("vs_fcfs_rounds", []))
        lines.append(f"| {phase} | {name} | {work['preemptions']:.0f} | {per_token:.3f} | {_num(per_step)} | "
                     f"{_num(busy_rate(row))} | {by_engine} | {by_clock} |")  # fmt: skip
    return lines


def _num(x: float) -> str:
    return "—" if math.isnan(x) else f"{x:.1f}"


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Per-tenant output tok/s over time, one panel per setup and phase (the first round); None without
    matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(name, phase, p) for name, setup in result["rounds"][0]["setups"].items()
              for phase, p in setup.items() if phase in PHASES]  # fmt: skip
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
    for ax, (name, phase, p) in zip(axes.flat, panels, strict=False):
        for tenant, v in p["tenants"].items():
            if tenant != PROBE:
                ax.plot([BIN_S * (i + 0.5) for i in range(len(v["series"]))], v["series"], label=tenant)
        for t in p["tenants"].get(PROBE, {}).get("sent_s", []):
            ax.axvline(t, color="grey", lw=0.6, ls=":")
        ax.axvspan(*p["window_s"], color="grey", alpha=0.08)
        ax.set_title(f"{name}: {phase}", fontsize=9)
        ax.set_xlabel("s")
        ax.set_ylabel("output tok/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle("per-tenant output tok/s over time (shaded: the measured window; dotted: priority probes)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
