"""Many tenants, bounded memory (`make soak-tenants`, not in CI): N requests, each from a tenant never seen before,
against a real `infer serve` under the fair policy, and the server's RSS as they pass.

A tenant header value per request (x-tenant: t0, t1, ...), tiny prompts and one output token, --concurrency
at once over gRPC; beside them an anchor tenant keeps long requests in the engine all along, so the engine never
empties (an empty engine forgets every tenant: the worst case for the tables is a busy one). Every --every
requests it samples the server's RSS (VmRSS) and its `infer_tenants_tracked` gauges. The verdict: from the
first sample past the table's limit (--max-tenants; by then every table is full), RSS grows by less than
--tolerance-mib to the end. Prints a table and the verdict; exit 1 when RSS is not bounded. --one-tenant sends
the same requests from one tenant: the control, what the requests alone do to RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from infer.api import pb, pb_grpc

TENANT_HEADER = "x-tenant"


@dataclass(frozen=True)
class Sample:
    num_requests: int  # finished so far (each a new tenant)
    elapsed_s: float
    rss_mib: float
    tracked: dict[str, float]  # infer_tenants_tracked by table


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mib(pid: int) -> float:
    match = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(match.group(1)) / 1024 if match else float("nan")


def _tracked(metrics_port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    found = re.findall(r'^infer_tenants_tracked\{table="([a-z]+)"\} ([0-9.e+]+)$', text, re.MULTILINE)
    return {table: float(value) for table, value in found}


def _start_server(args: argparse.Namespace, grpc_port: int, metrics_port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "infer", "serve", "--grpc-port", str(grpc_port), "--http-port", "off",
               "--metrics-port", str(metrics_port), "--scheduling-policy", "fair", "--tenant-header", TENANT_HEADER,
               "--max-tenants", str(args.max_tenants), "--max-model-len", "512", "--max-waiting-requests", "4096",
               "--max-num-seqs", "256", "--max-num-batched-tokens", "1024",
               "--tenant-tokens-per-minute", "1000000"]  # fmt: skip
    server = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    serving = health_pb2.HealthCheckResponse.SERVING
    for _ in range(600):
        try:
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                if (
                    health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    == serving
                ):
                    return server
        except grpc.RpcError:
            pass
        time.sleep(0.5)
    server.kill()
    raise RuntimeError("the server did not start in 5 minutes")


async def _generate(stub: pb_grpc.InferenceServiceStub, tenant: str, prompt: list[int], max_tokens: int) -> None:
    sampling = pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    request = pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt), sampling=sampling)
    async for _ in stub.Generate(request, metadata=((TENANT_HEADER, tenant),), timeout=600):
        pass


async def _flood(args: argparse.Namespace, grpc_port: int, metrics_port: int, pid: int) -> list[Sample]:
    rng = random.Random(0)
    started = time.monotonic()
    samples = [Sample(0, 0.0, _rss_mib(pid), _tracked(metrics_port))]
    next_id, done = 0, 0
    anchors_on = True

    options = [("grpc.use_local_subchannel_pool", 1)]  # a connection each
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}", options) for _ in range(-(-args.concurrency // 32))]
    stubs = [pb_grpc.InferenceServiceStub(channel) for channel in channels]  # NOTE: 32 streams a connection

    async def anchor() -> None:  # long requests from one tenant: the engine never empties
        while anchors_on:
            await _generate(stubs[0], "anchor", [rng.randrange(100, 40000) for _ in range(16)], 200)

    async def worker(stub: pb_grpc.InferenceServiceStub) -> None:
        nonlocal next_id, done
        while next_id < args.requests:
            tenant, next_id = ("t" if args.one_tenant else f"t{next_id}"), next_id + 1
            await _generate(stub, tenant, [rng.randrange(100, 40000) for _ in range(4)], 1)
            done += 1
            if done % args.every == 0:
                samples.append(Sample(done, time.monotonic() - started, _rss_mib(pid), _tracked(metrics_port)))
                print(_row(samples[-1]), flush=True)

    anchors = [asyncio.create_task(anchor()) for _ in range(2)]
    await asyncio.gather(*(worker(stubs[i % len(stubs)]) for i in range(args.concurrency)))
    anchors_on = False
    await asyncio.gather(*anchors)
    for channel in channels:
        await channel.close()
    return samples


def _row(s: Sample) -> str:
    tracked = ", ".join(f"{table} {value:.0f}" for table, value in sorted(s.tracked.items()))
    return f"| {s.num_requests:,} | {s.elapsed_s:.0f} | {s.rss_mib:.1f} | {tracked} |"


def verdict(samples: list[Sample], max_tenants: int, tolerance_mib: float) -> tuple[bool, float, int]:
    """(bounded, growth in MiB, the baseline's requests): RSS from the first sample with the tables full (past
    `max_tenants` tenants) to the highest after it."""
    full = [s for s in samples if s.num_requests >= max_tenants]
    if len(full) < 2:
        raise ValueError(f"need at least two samples past {max_tenants} requests: raise --requests")
    growth = max(s.rss_mib for s in full[1:]) - full[0].rss_mib
    return growth < tolerance_mib, growth, full[0].num_requests


def slope_mib_per_10k(points: list[tuple[int, float]]) -> float:
    """The least-squares slope of (requests, RSS MiB), per 10,000 requests."""
    n = len(points)
    mean_x, mean_y = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    return 10_000 * sum((x - mean_x) * (y - mean_y) for x, y in points) / var if var else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000, help="requests, each from a new tenant")
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--every", type=int, default=10_000, help="requests between samples")
    parser.add_argument("--max-tenants", type=int, default=10_000, help="the server's --max-tenants")
    parser.add_argument(
        "--tolerance-mib",
        type=float,
        default=64.0,  # make soak's: RSS moves some 30 MiB either way between samples (the allocator), not per tenant
        help="RSS growth past the limit still bounded (issue 38's leak: 66 MiB over 40,000 tenants)",
    )
    parser.add_argument("--out", type=Path, help="also write the samples and the verdict here (JSON)")
    parser.add_argument(
        "--one-tenant", action="store_true", help="the control: the same requests from one tenant (what they cost)"
    )
    args = parser.parse_args()
    grpc_port, metrics_port = _free_port(), _free_port()
    server = _start_server(args, grpc_port, metrics_port)
    try:
        print("| requests (new tenants) | s | server RSS MiB | infer_tenants_tracked |\n|---|---|---|---|")
        samples = asyncio.run(_flood(args, grpc_port, metrics_port, server.pid))
        print(_row(samples[0]).replace(f"| {0:,} |", "| 0 (started) |"))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    bounded, growth, baseline = verdict(samples, args.max_tenants, args.tolerance_mib)
    full = [(s.num_requests, s.rss_mib) for s in samples if s.num_requests >= baseline]
    print(f"RSS from {baseline:,} to {samples[-1].num_requests:,} tenants: +{growth:.1f} MiB at most, "
          f"{slope_mib_per_10k(full):+.2f} MiB per 10,000 tenants (least squares) "
          f"({'bounded' if bounded else 'NOT bounded'}: tolerance {args.tolerance_mib} MiB)")  # fmt: skip
    if args.out is not None:
        result = {"samples": [asdict(s) for s in samples], "growth_mib": growth, "bounded": bounded, **vars(args)}
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0 if bounded else 1


if __name__ == "__main__":
    sys.exit(main())
