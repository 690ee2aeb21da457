"""`make bench-tenants`: its figures, goals and report on made-up results, and its stoppable target on a fake one
(the real run takes minutes and the model)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from infer.clients.bench.targets import Clock, RequestResult
from infer.clients.bench.workloads import RequestSpec

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import tenants  # noqa: E402
import tenants_report as report  # noqa: E402
from tenants_report import HEAVY, HTTP_PHASE, LIGHT, PROBE  # noqa: E402


def _req(sent_s: float, ttft_s: float, tokens: int, gap_s: float = 0.1, status: str = "OK") -> RequestResult:
    gaps = [gap_s] * (tokens - 1)
    return RequestResult(0, "", 128, tokens, sent_s, status, "", ttft_s, ttft_s + sum(gaps), tokens, gaps)


def test_token_times_follow_the_messages_and_spread_a_messages_tokens() -> None:
    assert report.token_times(_req(1.0, 0.5, 3), offset_s=2.0) == pytest.approx([3.5, 3.6, 3.7])
    two_per_message = RequestResult(0, "", 8, 4, 0.0, "OK", "", 1.0, 2.0, 4, [1.0])
    assert report.token_times(two_per_message) == [1.0, 1.0, 2.0, 2.0]
    assert report.token_times(RequestResult(0, "", 8, 4, 0.0, "stopped")) == []  # stopped before its first token
    assert report.series([0.1, 0.2, 1.5, 9.0], end_s=2.0, bin_s=1.0) == [2.0, 1.0]  # past the end: not counted


def _phase(
    heavy_tokens: int, light_tokens: int, light_ttft: float, probes: tuple[float, ...] = (), busy_s: float = 9.0
) -> dict[str, Any]:
    """10 s of load: each tenant's tokens spread evenly over [0, 10), one request each, plus light requests; the
    engine's counters: a step per heavy token, `busy_s` of steps in all."""
    heavy = [_req(0.0, 0.0, heavy_tokens, 10 / heavy_tokens)]
    light = [_req(0.0, 0.0, light_tokens, 10 / light_tokens)] + [_req(t, light_ttft, 1) for t in (2.0, 4.0)]
    tenants_: dict[str, Any] = {HEAVY: (0.0, heavy), LIGHT: (0.0, light)}
    if probes:
        tenants_[PROBE] = (1.0, [_req(t, ttft, 1) for t, ttft in enumerate(probes)])
    out = report.phase_figures(tenants_, (0.0, 10.0), 10.0)
    out["engine"] = {"preemptions": 0.0, "prompt_tokens": 128.0 * 4, "cached_tokens": 0.0,
                     "generation_tokens": float(heavy_tokens + light_tokens + 2), "steps": float(heavy_tokens),
                     "step_s": busy_s}  # fmt: skip
    return out


def test_a_phase_counts_tokens_in_its_window_and_the_shares_leave_the_probes_out() -> None:
    p = _phase(300, 98, 0.5, probes=(0.2, 0.3))
    assert p["tenants"][HEAVY]["tokens"] == 300 and p["tenants"][LIGHT]["tokens"] == 100
    assert p["tenants"][HEAVY]["share"] == pytest.approx(0.75) and "share" not in p["tenants"][PROBE]
    assert p["total_tok_s"] == pytest.approx(40.0)
    assert p["tenants"][HEAVY]["step_s"] == pytest.approx(10 / 300)
    assert p["tenants"][PROBE]["sent_s"] == [1.0, 2.0] and p["tenants"][PROBE]["ttft_s"] == [0.2, 0.3]
    assert len(p["tenants"][LIGHT]["series"]) == 10 / report.BIN_S


def _rounds(
    fair_light_ttft: float, fair_shares: tuple[int, int], probe_ttft: float, fair_busy_s: float = 9.0
) -> list[dict[str, Any]]:
    """`fair_busy_s`: the engine's busy time in fair 1:1's contention phase (fcfs's: 9 s for as many tokens)."""
    setups = {
        "fcfs": {"contention": _phase(300, 30, 3.0), "shares": _phase(300, 150, 3.0), "alone_ttft_s": [0.2] * 8},
        "priority": {"contention": _phase(300, 30, 3.0, (probe_ttft,) * 3), "probe_solo_ttft_s": [0.1, 0.1, 0.1]},
        "fair 1:1": {"contention": _phase(300, 30, fair_light_ttft, busy_s=fair_busy_s),
                     "shares": _phase(225, 225, 0.2),
                     "alone_ttft_s": [0.1] * 7 + [1.0]},  # an outlier alone: P99 would hide the goal
        "fair 1:2": {"shares": _phase(*fair_shares, 0.2)},
    }  # fmt: skip
    return [{"order": list(setups), "setups": setups}]


def test_goals_met_and_missed_say_so_with_the_measured_figures(tmp_path: Path) -> None:
    # a step: 10 s / 300 heavy tokens; the light tenant's bound: 0.1 alone + 2 x 0.033 = 0.167 s (the probes' too)
    good = report.summarize(_rounds(0.16, (150, 300), 0.15), tenants.SETUPS)  # 1.6x its TTFT alone: within
    assert all(g["met"] is True for g in report.goals(good)), report.goals(good)
    assert good["contention"]["fair 1:1"]["light_bound_s"] == pytest.approx(0.1 + 2 * 10 / 300)
    assert good["shares"]["fair 1:2"]["weight_share"][LIGHT] == pytest.approx(2 / 3)
    assert good["contention"]["fcfs"]["heavy_per_light"] == pytest.approx(1 / 3)  # 1 heavy done, 3 light sent
    # fair 1:1's engine 10 s busy for the tokens fcfs's made in 9: 0.9x, though the clock saw as many tokens
    bad = report.goals(report.summarize(_rounds(0.17, (300, 150), 0.5, fair_busy_s=10.0), tenants.SETUPS))
    missed = [g for g in bad if not g["met"]]
    assert [g["goal"].split(":")[0] for g in missed] == ["fair", "fair 1", "fair 1", "priority"], missed
    assert missed[0]["measured"] == "170 ms (alone P50 100 ms, mean step 33 ms)" and "(167 ms)" in missed[0]["target"]
    assert "1:2: output shares" in missed[1]["goal"]
    assert missed[2]["goal"] == "fair 1:1: output tokens per busy second of the engine / fcfs (contention)"
    assert missed[2]["measured"] == "0.900x (33.2 tok per busy s; by the clock 1.000x)"
    assert "0 of 3 within" in missed[3]["measured"]


def test_the_report_writes_json_and_markdown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "plot", lambda result, path: None)  # NOTE: matplotlib takes seconds; the run plots
    rounds = _rounds(0.14, (150, 300), 0.15)
    table = report.summarize(rounds, tenants.SETUPS)
    result = {"date": "today", "cpu": "a CPU", "cpus": 2, "load_before": "load average: 0.10", "wall_s": 300.0,
              "config": vars(tenants.Config()), "workload": "w.", "rounds": rounds, "table": table,
              "goals": report.goals(table), "notes": ["a note"]}  # fmt: skip
    assert report.write_report(result, tmp_path) == [tmp_path / "tenants.json", tmp_path / "tenants.md"]
    assert json.loads((tmp_path / "tenants.json").read_text())["goals"] == result["goals"]
    text = (tmp_path / "tenants.md").read_text()
    assert "load average: 0.10" in text and "| fair 1:2 | 0.332 (0.333) | 0.668 (0.667) | 0.4% |" in text
    assert "| fcfs | 200 ms / 200 ms | 3000 ms | 3000 ms | 267 ms |" in text and "- a note" in text
    assert (
        "| fair: light tenant's TTFT P99 at saturation | ≤ its TTFT alone + 2 mean steps (167 ms) | 140 ms (alone "
        "P50 100 ms, mean step 33 ms) | yes |" in text
    )
    assert "| 1 | 100 ms | 33 ms / 33 ms | 167 ms | 167 ms | 150 ms, 150 ms, 150 ms |" in text


class _SlowTarget:
    name = "slow"

    def __init__(self) -> None:
        self.sent = 0

    async def send(self, spec: RequestSpec, result: RequestResult) -> None:
        self.sent += 1
        clock = Clock(result)
        for _ in range(spec.max_tokens):
            await asyncio.sleep(0.01)
            clock.tokens(1)
        clock.done()

    async def close(self) -> None:
        pass


def test_a_stopped_request_keeps_its_tokens_and_later_ones_are_not_sent() -> None:
    async def scenario() -> tuple[RequestResult, RequestResult, int]:
        stop, slow = asyncio.Event(), _SlowTarget()
        target = tenants.Stoppable(slow, stop)
        first, later = RequestResult(0, "", 1, 1000, 0.0), RequestResult(1, "", 1, 1000, 0.0)
        task = asyncio.ensure_future(target.send(RequestSpec((1,), 1000), first))
        await asyncio.sleep(0.1)
        stop.set()
        await task
        await target.send(RequestSpec((1,), 1000), later)
        return first, later, slow.sent

    first, later, sent = asyncio.run(scenario())
    assert first.status == "stopped" and 3 <= first.output_tokens < 1000 and first.ttft_s is not None
    assert later.status == "stopped" and later.output_tokens == 0 and sent == 1


def test_the_servers_counters_are_read_from_its_metrics_text() -> None:
    text = (
        "# HELP infer_preemptions_total requests preempted\n# TYPE infer_preemptions_total counter\n"
        "infer_preemptions_total 7.0\ninfer_preemptions_created 1.7e9\n"
        'infer_tenant_requests_total{tenant="light"} 3.0\ninfer_prompt_tokens_total 1280.0\n'
    )
    assert tenants.metric_value(text, "infer_preemptions_total") == 7.0
    assert tenants.metric_value(text, "infer_prompt_tokens_total") == 1280.0
    with pytest.raises(ValueError, match="infer_generation_tokens_total is not in"):
        tenants.metric_value(text, "infer_generation_tokens_total")


def test_the_report_shows_each_policys_work_and_each_rounds_ratio(tmp_path: Path) -> None:
    rounds = _rounds(0.14, (150, 300), 0.15) + _rounds(0.14, (150, 300), 0.15)  # two rounds
    for i, r in enumerate(rounds):
        for name, setup in r["setups"].items():
            for phase in ("contention", "shares"):
                if phase in setup:
                    setup[phase] = dict(setup[phase], engine={
                        "preemptions": 3.0 if name.startswith("fair") else 0.0, "prompt_tokens": 1000.0 + i,
                        "cached_tokens": 16.0, "generation_tokens": 500.0, "steps": 250.0, "step_s": 10.0})  # fmt: skip
    # the client's clock saw fcfs at half its speed in round 2 (the machine busy, say): its engine did not
    rounds[1]["setups"]["fcfs"]["contention"] = dict(rounds[1]["setups"]["fcfs"]["contention"], total_tok_s=66.4)
    table = report.summarize(rounds, tenants.SETUPS)
    fair = table["contention"]["fair 1:1"]
    assert fair["engine"] == {"preemptions": 6.0, "prompt_tokens": 2001.0, "cached_tokens": 32.0,
                              "generation_tokens": 1000.0, "steps": 500.0, "step_s": 20.0}  # fmt: skip
    assert fair["vs_fcfs_rounds"] == pytest.approx([1.0, 0.5]) and fair["engine_vs_fcfs_rounds"] == [1.0, 1.0]
    goal = {g["goal"]: g for g in report.goals(table)}
    assert goal["fair 1:1: output tokens per busy second of the engine / fcfs (contention)"]["met"]  # the engine's
    text = "\n".join(report.work_table(table))
    assert "| contention | fair 1:1 | 6 | 2.001 | 2.0 | 50.0 | 1.000x, 1.000x | 1.000x, 0.500x |" in text
    for r in rounds:  # a run from before the step counters: the goal not measured, not met or missed
        for setup in r["setups"].values():
            for phase in ("contention", "shares"):
                if phase in setup:
                    del setup[phase]["engine"]["steps"], setup[phase]["engine"]["step_s"]
    old = report.summarize(rounds, tenants.SETUPS)
    goal = {g["goal"]: g for g in report.goals(old)}[
        "fair 1:1: output tokens per busy second of the engine / fcfs (contention)"
    ]
    assert goal["met"] is None and goal["measured"].startswith("not measured")
    assert "| contention | fair 1:1 | 6 | 2.001 | — | — | — | 1.000x, 0.500x |" in "\n".join(report.work_table(old))
    del rounds[0]["setups"]["fcfs"]["contention"]["engine"]  # a run from before the counters: no table
    assert report.summarize(rounds, tenants.SETUPS)["contention"]["fcfs"]["engine"] is None


def _with_http(rounds: list[dict[str, Any]], fair_light_ttft: float, probe_ttft: float) -> list[dict[str, Any]]:
    """The contention phase over HTTP beside the gRPC one (its own alone and probe-prefill TTFTs)."""
    setups = rounds[0]["setups"]
    setups["fcfs"] |= {HTTP_PHASE: _phase(300, 30, 3.0), "alone_http_ttft_s": [0.25] * 8}
    setups["priority"] |= {HTTP_PHASE: _phase(300, 30, 3.0, (probe_ttft,) * 3), "probe_solo_http_ttft_s": [0.12] * 3}
    setups["fair 1:1"] |= {HTTP_PHASE: _phase(300, 30, fair_light_ttft), "alone_http_ttft_s": [0.12] * 8}
    return rounds


def test_the_http_flood_has_its_own_rows_and_goals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = report.summarize(_with_http(_rounds(0.14, (150, 300), 0.15), 0.17, 0.16), tenants.SETUPS)
    assert good[HTTP_PHASE]["fair 1:1"]["alone"]["p50_s"] == pytest.approx(0.12)  # its HTTP alone, not gRPC's
    named = {g["goal"]: g for g in report.goals(good)}
    assert named["fair over HTTP: light tenant's TTFT P99 at saturation"]["met"]
    assert named["priority over HTTP: TTFT of a priority -10 request at saturation"]["met"]
    assert named["fair 1:1: output tokens per busy second of the engine / fcfs (contention_http)"]["met"]
    bad = report.goals(report.summarize(_with_http(_rounds(0.14, (150, 300), 0.15), 284.0, 286.0), tenants.SETUPS))
    assert [g["goal"].split(":")[0] for g in bad if not g["met"]] == ["fair over HTTP", "priority over HTTP"]
    monkeypatch.setattr(report, "plot", lambda result, path: None)
    config = vars(tenants.Config()) | {"streams_per_connection": tenants.STREAMS_PER_CONNECTION}
    result = {"date": "today", "cpu": "a CPU", "cpus": 2, "load_before": "load average: 0.10", "wall_s": 300.0,
              "config": config, "workload": "w.", "rounds": [], "table": good,
              "goals": report.goals(good), "notes": []}  # fmt: skip
    report.write_report(result, tmp_path)
    text = (tmp_path / "tenants.md").read_text()
    assert "## The same over HTTP (32 heavy streams through the gateway, more than the server's 24 streams" in text
    assert "| fair 1:1 | 120 ms / 120 ms | 170 ms | 170 ms | 187 ms |" in text
    assert "| 1 (HTTP) | 120 ms |" in text


def test_the_http_targets_carry_the_tenant_header_and_the_priority() -> None:
    server = tenants.Running("s", "127.0.0.1:1", "http://127.0.0.1:1/v1", Path("log"))
    tenants._MODELS[server.http] = "m"  # NOTE: else asked of the server once
    target = tenants.target(server, LIGHT, -10, "http")
    assert isinstance(target, tenants.OpenAITarget)
    assert target.http.headers[tenants.TENANT_HEADER] == LIGHT
    assert target.body(RequestSpec((1, 2), 4), "m")["priority"] == -10 and target.url.endswith("/v1/completions")
    heavy = tenants.target(server, HEAVY, door="http")
    assert isinstance(heavy, tenants.OpenAITarget) and "priority" not in heavy.body(RequestSpec((1,), 4), "m")
    grpc_target = tenants.target(server, HEAVY)
    assert isinstance(grpc_target, tenants.GrpcTarget)  # a connection per 24 streams, as the server allows
    assert grpc_target.client.channels.max_calls == tenants.STREAMS_PER_CONNECTION < tenants.Config().heavy_streams
    assert [tenants.door_of(p) for p in tenants.SETUPS["fair 1:1"]["phases"]] == ["grpc", "http", "grpc"]
