"""`infer bench` end to end against an in-process fake-engine server: gRPC, and the OpenAI gateway in front of it
(completions and chat). A few requests each; seconds, not minutes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from infer.server.cli import main
from tests.integration.grpc_helpers import ServerThread, running_fake_server
from tests.unit.server.gateway.gateway_helpers import LoopThread, RunningGateway, running_gateway

MAX_TOKENS = 6
# the fake model emits eos past its text; shown as text, each is a content chunk over HTTP
SHOW_EOS = '{"skip_special_tokens": false}'


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_fake_server(max_model_len=4096, num_blocks=512, max_num_seqs=8) as s:
        s.engine.core.runner.step_s = 0.002
        yield s


@pytest.fixture(scope="module")
def gateway(server: ServerThread) -> Iterator[RunningGateway]:
    loop = LoopThread()
    try:
        with running_gateway(server.address, loop) as gw:
            yield gw
    finally:
        loop.close()


def _bench(tmp_path: Path, *args: str) -> dict[str, object]:
    common = ["--max-tokens", str(MAX_TOKENS), "--no-progress", "--out-dir", str(tmp_path), "--stem", "run"]
    assert main(["bench", *args, *common]) == 0
    return dict(json.loads((tmp_path / "run.json").read_text()))


def _check_run(run: dict[str, object], num_requests: int) -> None:
    summary, requests = run["summary"], run["requests"]
    assert isinstance(summary, dict) and isinstance(requests, list)
    assert summary["num_requests"] == summary["num_ok"] == num_requests and summary["errors"] == {}
    for r in requests:
        assert r["status"] == "OK" and r["output_tokens"] == MAX_TOKENS
        assert 0 < r["ttft_s"] <= r["e2e_s"]
        assert len(r["gaps_s"]) == MAX_TOKENS - 1  # one token per message on either front door
    assert summary["output_tokens_per_s"] == pytest.approx(num_requests * MAX_TOKENS / summary["duration_s"])


def test_grpc_fixed_concurrency(server: ServerThread, tmp_path: Path) -> None:
    out = _bench(tmp_path, "--target", server.address, "--workload", "baseline", "--num-requests", "4",
                 "--concurrency", "2")  # fmt: skip
    (run,) = out["runs"]  # type: ignore[misc]
    _check_run(run, 4)
    assert run["summary"]["max_concurrent_decoding"] <= 2
    assert {p.name for p in tmp_path.iterdir()} == {"run.json", "run.md", "run-latency-cdf.png"}
    assert "| grpc, 2 concurrent | 4/4 |" in (tmp_path / "run.md").read_text()
    server.wait_idle()


@pytest.mark.parametrize("protocol", ["completions", "chat"])
def test_http_poisson_rate(protocol: str, gateway: RunningGateway, server: ServerThread, tmp_path: Path) -> None:
    out = _bench(tmp_path, "--protocol", protocol, "--target", gateway.base_url, "--workload", "baseline",
                 "--num-requests", "3", "--rate", "50", "--vocab-size", "300", "--http-extra", SHOW_EOS)  # fmt: skip
    (run,) = out["runs"]  # type: ignore[misc]
    _check_run(run, 3)
    assert run["load"] == "Poisson 50 req/s"
    server.wait_idle()


def test_rate_sweep_writes_the_sweep_plot(server: ServerThread, tmp_path: Path) -> None:
    out = _bench(tmp_path, "--target", server.address, "--workload", "baseline", "--num-requests", "2",
                 "--rate", "20,40", "--slo-ttft-ms", "60000")  # fmt: skip
    runs = out["runs"]
    assert isinstance(runs, list) and [r["rate"] for r in runs] == [20, 40]
    for run in runs:
        _check_run(run, 2)
        assert run["summary"]["slo_attainment"] == 1.0
    assert (tmp_path / "run-rate-sweep.png").stat().st_size > 0


def test_refused_requests_are_counted_by_status(server: ServerThread, tmp_path: Path) -> None:
    """Token ids past the fake model's vocabulary: every request fails INVALID_ARGUMENT, and the exit code is 1."""
    args = ["bench", "--target", server.address, "--workload", "baseline", "--num-requests", "2", "--vocab-size",
            "5000", "--no-progress", "--out-dir", str(tmp_path), "--no-plots"]  # fmt: skip
    assert main(args) == 1
    (run,) = json.loads((tmp_path / "bench.json").read_text())["runs"]
    assert run["summary"]["errors"] == {"INVALID_ARGUMENT": 2} and run["summary"]["num_ok"] == 0
