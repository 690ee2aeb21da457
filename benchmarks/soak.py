"""Soak (`make soak`, not in CI): N mixed streams for T minutes against a real `infer serve`, then the verdict.

The traffic, over both front doors: whole streams, slow readers, clients that disconnect mid-stream,
deadlines too short to finish, invalid requests; the KV pool is small enough that requests get preempted.
Every window of the run records outcomes, P99 time to first token and the server's RSS. At the end the
server must be idle with every KV block free. Writes docs/reliability.md and docs/reliability.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx

from infer.clients.proto.v1 import inference_pb2 as pb
from infer.clients.proto.v1 import inference_pb2_grpc as pb_grpc

DOCS = Path(__file__).resolve().parent.parent / "docs"
KINDS = ("whole", "slow", "disconnect", "deadline", "invalid", "http", "http_disconnect")
EXPECTED = {  # outcomes that are right for each kind of client
    "whole": {"OK"}, "slow": {"OK"}, "disconnect": {"CANCELLED"}, "deadline": {"OK", "DEADLINE_EXCEEDED"},
    "invalid": {"INVALID_ARGUMENT"}, "http": {"200"}, "http_disconnect": {"disconnected"},
}  # fmt: skip


@dataclass
class Window:
    """What one slice of the run saw."""

    start_s: float
    outcomes: Counter[str] = field(default_factory=Counter)
    ttfts_s: list[float] = field(default_factory=list)
    rss_mib: float = 0.0

    def p99_ttft_s(self) -> float:
        ttfts = sorted(self.ttfts_s)
        return ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else float("nan")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else float("nan")


def _prompt(rng: random.Random) -> list[int]:
    return [rng.randrange(100, 40000) for _ in range(rng.randint(8, 300))]


async def _grpc_client(stub: pb_grpc.InferenceServiceStub, kind: str, rng: random.Random, window: Window) -> str:
    sampling = pb.SamplingParams(max_tokens=rng.randint(8, 48), temperature=0.7, ignore_eos=True)
    if kind == "invalid":
        sampling.top_p = 7.0
    timeout = 0.3 if kind == "deadline" else 300
    started = time.monotonic()
    call = stub.Generate(
        pb.GenerateRequest(token_ids=pb.TokenIds(ids=_prompt(rng)), sampling=sampling), timeout=timeout
    )
    try:
        num = 0
        async for _ in call:
            if num == 0:
                window.ttfts_s.append(time.monotonic() - started)
            num += 1
            if kind == "slow":
                await asyncio.sleep(0.2)
            if kind == "disconnect" and num == 3:
                call.cancel()
        return "OK"
    except asyncio.CancelledError:
        return "CANCELLED"
    except grpc.aio.AioRpcError as e:
        return str(e.code().name)


async def _http_client(http: httpx.AsyncClient, kind: str, rng: random.Random) -> str:
    body = {"model": "SmolLM2-135M-Instruct", "prompt": _prompt(rng), "max_tokens": rng.randint(8, 48),
            "stream": True, "ignore_eos": True}  # fmt: skip
    async with http.stream("POST", "/v1/completions", json=body) as response:
        num = 0
        async for _ in response.aiter_lines():
            num += 1
            if kind == "http_disconnect" and num == 4:
                return "disconnected"  # leaving the block closes the connection
        return str(response.status_code)


async def _worker(args: argparse.Namespace, ports: dict[str, int], windows: list[Window], seed: int) -> None:
    rng = random.Random(seed)
    deadline = time.monotonic() + args.minutes * 60
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{ports['grpc']}") as channel,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports['http']}", timeout=300) as http,
    ):
        stub = pb_grpc.InferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        while time.monotonic() < deadline:
            kind = rng.choice(KINDS)
            window = windows[-1]
            if kind.startswith("http"):
                outcome = await _http_client(http, kind, rng)
            else:
                outcome = await _grpc_client(stub, kind, rng, window)
            window.outcomes[f"{kind}:{outcome}"] += 1


async def _sample(pid: int, windows: list[Window], window_s: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        windows[-1].rss_mib = _rss_mib(pid)
        try:
            await asyncio.wait_for(stop.wait(), window_s)
        except TimeoutError:
            windows.append(Window(time.monotonic()))


def _kv_blocks_used(metrics_port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    match = re.search(r"^infer_kv_blocks_used\S*\s+(\S+)$", text, re.M)
    return float(match.group(1)) if match else float("nan")


def _start_server(args: argparse.Namespace, ports: dict[str, int]) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "infer", "serve", "--grpc-port", str(ports["grpc"]), "--http-port",
               str(ports["http"]), "--metrics-port", str(ports["metrics"]), "--num-blocks", str(args.num_blocks),
               "--max-model-len", "512"]  # fmt: skip
    server = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{ports['http']}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.kill()
    raise RuntimeError("the server did not become healthy in 5 minutes")


def run(args: argparse.Namespace) -> dict[str, Any]:
    ports = {"grpc": _free_port(), "http": _free_port(), "metrics": _free_port()}
    server = _start_server(args, ports)
    windows = [Window(time.monotonic())]
    try:

        async def main() -> None:
            stop = asyncio.Event()
            sampler = asyncio.create_task(_sample(server.pid, windows, args.window_s, stop))
            await asyncio.gather(*(_worker(args, ports, windows, seed) for seed in range(args.streams)))
            stop.set()
            await sampler

        asyncio.run(main())
        time.sleep(2)  # aborts land at the next engine step
        blocks_used = _kv_blocks_used(ports["metrics"])
    finally:
        server.send_signal(signal.SIGTERM)
        exit_code = server.wait(60)
    return _report(args, windows, blocks_used, exit_code)


def _report(args: argparse.Namespace, windows: list[Window], blocks_used: float, exit_code: int) -> dict[str, Any]:
    total: Counter[str] = sum((w.outcomes for w in windows), Counter())
    unexpected = {k: n for k, n in total.items() if k.split(":", 1)[1] not in EXPECTED[k.split(":", 1)[0]]}
    return {
        "streams": args.streams, "minutes": args.minutes, "num_blocks": args.num_blocks,
        "outcomes": dict(sorted(total.items())), "unexpected": unexpected, "kv_blocks_used_after": blocks_used,
        "server_exit_code": exit_code, "cpu": os.cpu_count(),
        "windows": [{"t_s": round(w.start_s - windows[0].start_s, 1), "requests": sum(w.outcomes.values()),
                     "p99_ttft_s": round(w.p99_ttft_s(), 3), "rss_mib": round(w.rss_mib, 1)} for w in windows],
    }  # fmt: skip


def _markdown(result: dict[str, Any]) -> str:
    w = result["windows"]
    rss = [x["rss_mib"] for x in w if x["rss_mib"]]
    lines = [
        "# Reliability: soak run", "",
        f"`make soak`: {result['streams']} concurrent clients for {result['minutes']} min against `infer serve` "
        f"(KV pool of {result['num_blocks']} blocks, so requests are preempted), mixing whole streams, slow "
        "readers, mid-stream disconnects (gRPC and HTTP), too-short deadlines and invalid requests.", "",
        f"- unexpected outcomes: {result['unexpected'] or 'none'}",
        f"- KV blocks in use after the run: {result['kv_blocks_used_after']:g} (must be 0)",
        f"- server RSS: {rss[0]:.0f} MiB in the first window, {rss[-1]:.0f} MiB in the last "
        f"({rss[-1] - rss[0]:+.0f} MiB)" if rss else "- server RSS: not sampled",
        f"- SIGTERM at the end: exit code {result['server_exit_code']}", "",
        "The verdict lines must hold on any machine; the TTFT column depends on the machine's load (a window "
        "that admits a burst of long prompts behind a preemption shows it), the RSS column on the allocator: "
        "growth that flattens after the first windows is warm-up, growth in every window a leak.", "",
        "| outcome | count |", "|---|---|", *(f"| {k} | {n} |" for k, n in result["outcomes"].items()), "",
        "| window start (s) | requests | P99 TTFT (s) | RSS (MiB) |", "|---|---|---|---|",
        *(f"| {x['t_s']} | {x['requests']} | {x['p99_ttft_s']} | {x['rss_mib']} |" for x in w), "",
    ]  # fmt: skip
    return "\n".join(lines)


KEPT_MARKER = "<!-- written by hand: make soak keeps what follows -->"


def _kept(report: Path) -> str:
    """The hand-written part of an existing report (from KEPT_MARKER on), which a new run keeps."""
    text = report.read_text() if report.is_file() else ""
    at = text.find(KEPT_MARKER)
    return "\n" + text[at:] if at >= 0 else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=24, help="concurrent clients")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--window-s", type=float, default=60.0, help="seconds per reported window")
    parser.add_argument("--num-blocks", type=int, default=160, help="KV pool: small, to force preemption")
    parser.add_argument("--out-dir", type=Path, default=DOCS)
    args = parser.parse_args()
    result = run(args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "reliability.json").write_text(json.dumps(result, indent=2) + "\n")
    report = args.out_dir / "reliability.md"
    kept = _kept(report)
    report.write_text(_markdown(result) + kept)
    print(_markdown(result))
    ok = not result["unexpected"] and result["kv_blocks_used_after"] == 0 and result["server_exit_code"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
