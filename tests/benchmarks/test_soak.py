"""`make soak`: its RSS verdict on made-up series, and each hostile client's outcome against the fake engine's server
and a gateway in front of it (the real run takes minutes and the model)."""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from prometheus_client import CollectorRegistry

from infer.api import pb_grpc
from infer.server.gateway.guard import HttpLimits
from infer.server.metrics_http import start_metrics_server
from tests.integration.grpc_helpers import ServerThread, running_fake_server
from tests.unit.server.gateway.gateway_helpers import LoopThread, running_gateway

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import soak  # noqa: E402
import soak_hostile  # noqa: E402


def _windows(*rss_mib: list[float]) -> list[list[tuple[float, float]]]:
    """Windows of 60 s, each with its samples 20 s apart."""
    return [[(60 * i + 20 * j, x) for j, x in enumerate(samples)] for i, samples in enumerate(rss_mib)]


def test_rss_that_settles_after_each_phases_warm_up_is_flat_and_rss_that_climbs_is_not() -> None:
    phases = ["normal"] * 4 + ["hostile"] * 4
    settling = _windows([900, 920, 940], [950, 952, 951], [955, 954, 956], [952, 955, 953],
                        [960, 1000, 1030], [1040, 1041, 1045], [1045, 1043, 1044], [1042, 1046, 1044])  # fmt: skip
    is_flat, text = soak.rss_verdict(settling, phases, warmup_windows=2)
    assert is_flat and "normal: 955 MiB after warm-up" in text and "hostile: 1045 MiB after warm-up" in text
    assert "slope +" in text or "slope -" in text
    climbing = [[(t, 900 + t * 100 / 60) for t in range(60 * i, 60 * i + 60, 20)] for i in range(8)]  # 100 MiB/min
    is_flat, text = soak.rss_verdict(climbing, phases, warmup_windows=2)
    assert not is_flat and "GROWING" in text and "slope +100.00 MiB/min" in text
    assert soak.rss_verdict(_windows([900], [1000]), ["normal"] * 2, warmup_windows=2)[0] is False  # none after


def test_a_process_that_never_ran_in_a_phase_passes_only_when_absence_is_allowed() -> None:
    """The grammar worker starts on the first compile: in a phase without one it is not running, not failing."""
    windows = _windows([0], [0], [0], [0], [280, 281], [282, 282], [282, 281], [281, 282])
    phases = ["normal"] * 4 + ["hostile"] * 4
    is_flat, text = soak.rss_verdict(windows, phases, warmup_windows=2, absent_ok=True)
    assert is_flat and "normal: not running" in text and "hostile: 282 MiB after warm-up" in text
    assert soak.rss_verdict(windows, phases, warmup_windows=2)[0] is False


def test_the_slope_is_least_squares_in_mib_a_minute() -> None:
    assert soak.slope_mib_per_min([(0, 100), (60, 110), (120, 120)]) == pytest.approx(10)
    assert soak.slope_mib_per_min([(0, 100), (30, 100)]) == 0


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_fake_server(max_model_len=256, max_num_seqs=8, max_waiting_requests=16) as s:
        yield s


@pytest.fixture(scope="module")
def doors(server: ServerThread) -> Iterator[soak_hostile.Doors]:
    loop = LoopThread()
    metrics = start_metrics_server(CollectorRegistry(), "127.0.0.1", 0, header_timeout_s=0.5)
    limits = HttpLimits(header_timeout_s=0.5)
    with running_gateway(server.address, loop, limits=limits) as gateway:
        yield soak_hostile.Doors("127.0.0.1", gateway.server.port, metrics.server_port, model="fake")
    metrics.shutdown()
    metrics.server_close()
    loop.close()


async def _outcome(server: ServerThread, doors: soak_hostile.Doors, kind: str) -> str:
    options = [("grpc.max_send_message_length", 8 << 20)]
    async with (
        grpc.aio.insecure_channel(server.address, options=options) as channel,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{doors.http_port}", timeout=60) as http,
    ):
        stub = pb_grpc.InferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        return await soak_hostile.hostile_client(http, stub, doors, kind, random.Random(0))


@pytest.mark.parametrize("kind", soak_hostile.KINDS)
def test_each_hostile_client_gets_its_expected_answer(
    server: ServerThread, doors: soak_hostile.Doors, kind: str
) -> None:
    assert asyncio.run(_outcome(server, doors, kind)) in soak_hostile.EXPECTED[kind]
    server.wait_idle()


def test_the_hand_written_part_of_the_report_is_kept(tmp_path: Path) -> None:
    report = tmp_path / "reliability.md"
    assert soak._kept(report) == ""  # no report yet
    by_hand = f"{soak.KEPT_MARKER}\n\n## Memory\n\nmeasured by hand\n"
    report.write_text(f"# Reliability: soak run\n\nold figures\n\n{by_hand}")
    assert soak._kept(report) == f"\n{by_hand}"
    report.write_text("# Reliability: soak run\n\nno hand-written part\n")
    assert soak._kept(report) == ""


def test_the_docs_report_has_its_hand_written_part() -> None:
    assert soak.KEPT_MARKER in (BENCHMARKS.parent / "docs" / "reliability.md").read_text()
