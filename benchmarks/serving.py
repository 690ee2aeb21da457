"""Online serving: the seeds' workloads against every engine configuration, side by side with llama.cpp.

`make bench-serving` runs this. It starts each server itself (`infer serve` in a subprocess on free
127.0.0.1 ports, one at a time), drives it with `infer bench`'s load generator, stops it, then runs
offline `LLM.generate` on the same prompts, then the peer comparison (serving_peers.py): every precision,
speculation on and off, and llama.cpp's `llama-server` (when `make peers` has built it) in alternating rounds.
Writes docs/benchmarks/serving.md, serving.json and the plots; every figure comes from one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_matrix import MatrixWork, find_speculation, precisions
from serving_peers import PeerOptions, run_peers
from serving_report import write_report
from serving_servers import LLAMA_SERVER, Running, infer_server, llama_version

from infer.clients.bench.load import LoadPlan, run_load
from infer.clients.bench.metrics import BenchRun, Slo
from infer.clients.bench.targets import make_target
from infer.clients.bench.workloads import Workload, WorkloadOptions, make_workload

OUT_DIR = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
NUM_BLOCKS = 512  # every infer configuration gets the same KV bytes: 512 blocks x 16 tokens
MAX_MODEL_LEN = 2048
COMMON = ("--num-blocks", str(NUM_BLOCKS), "--max-model-len", str(MAX_MODEL_LEN))
SERVERS: dict[str, tuple[str, ...]] = {
    "continuous": COMMON,
    "static": (*COMMON, "--batching", "static"),
    "full": (*COMMON, "--kv-reserve", "full"),
    "unchunked": (*COMMON, "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(MAX_MODEL_LEN)),
    "no_prefix": (*COMMON, "--no-enable-prefix-caching"),
}
SLO = Slo(ttft_s=2.0, tpot_s=0.25)  # for goodput: first token within 2 s, then 4 tokens/s per stream
PEER_SLOTS = 16


@dataclass(frozen=True)
class Experiment:
    key: str  # the run's name in the report
    server: str  # a SERVERS key
    workload: str
    protocol: str = "grpc"
    concurrency: int | None = None
    rates: tuple[float, ...] = ()
    seed: int = 0  # another seed, other prompts: a second run on one server must not hit the first's prefix cache


EXPERIMENTS = (
    Experiment("baseline", "continuous", "baseline"),
    Experiment("continuous_batching/continuous", "continuous", "continuous_batching"),
    Experiment("saturation/grpc", "continuous", "saturation", concurrency=PEER_SLOTS),
    Experiment("saturation/http", "continuous", "saturation", "completions", concurrency=PEER_SLOTS, seed=1),
    Experiment("paged_attention/paged", "continuous", "paged_attention"),
    Experiment("chunked_prefill/chunked", "continuous", "chunked_prefill"),
    Experiment("prefix_caching/on", "continuous", "prefix_caching"),
    Experiment("mixed", "continuous", "mixed", rates=(0.5, 1.0, 2.0)),
    Experiment("continuous_batching/static", "static", "continuous_batching"),
    Experiment("paged_attention/full", "full", "paged_attention"),
    Experiment("chunked_prefill/unchunked", "unchunked", "chunked_prefill"),
    Experiment("prefix_caching/off", "no_prefix", "prefix_caching"),
)  # the peer comparison (precisions, speculation, llama-server) is serving_peers.py: the "peers" server


@dataclass(frozen=True)
class Options:
    scale: float  # request counts x this
    max_tokens: int | None
    servers: tuple[str, ...]
    progress: bool
    out_dir: Path
    peers: PeerOptions | None = None  # the "peers" comparison


def workload(name: str, opts: Options, seed: int = 0) -> Workload:
    default = len(make_workload(name).requests)
    count = max(2, round(default * opts.scale)) if opts.scale != 1 and name != "paged_attention" else None
    if name == "chunked_prefill" and count is not None:
        count = max(2, round(4 * opts.scale))  # the long prompts; the decoding streams stay
    return make_workload(name, WorkloadOptions(seed=seed, num_requests=count, max_tokens=opts.max_tokens))


async def run_experiment(exp: Experiment, server: Running, opts: Options) -> list[BenchRun]:
    """One run, or one per rate of a sweep; each rate gets its own prompts (seed + i): no prefix-cache carry-over."""
    address = server.grpc if exp.protocol == "grpc" and server.grpc else server.http
    target = make_target(exp.protocol, address)
    plans = [LoadPlan(rate=r, seed=i, progress=opts.progress) for i, r in enumerate(exp.rates)] or [
        LoadPlan(concurrency=exp.concurrency, warmup=1, progress=opts.progress)
    ]
    runs = []
    try:
        for plan in plans:
            work = workload(exp.workload, opts, exp.seed + plan.seed)
            label = exp.key if plan.rate is None else f"{exp.key} @ {plan.rate:g} req/s"
            results = await run_load(target, work, plan, label)
            runs.append(BenchRun(label, f"{exp.server} ({exp.protocol})", work.name, plan.describe(work), plan.rate,
                                 SLO, tuple(results)))  # fmt: skip
    finally:
        await target.close()
    for run in runs:
        s = run.summary
        print(f"  {run.label}: {s.num_ok}/{s.num_requests} ok, {s.output_tokens_per_s:.1f} out tok/s, "
              f"TTFT P99 {s.ttft_s.p99:.2f} s, ITL P99 {s.itl_s.p99:.3f} s, errors {s.errors}", flush=True)  # fmt: skip
    return runs


def offline_throughput(opts: Options, log_dir: Path) -> dict[str, Any]:
    """LLM.generate on the saturation prompts, at most PEER_SLOTS running, in its own process."""
    work = workload("saturation", opts)
    path = log_dir / "saturation.json"
    path.write_text(json.dumps({"prompts": [list(r.prompt) for r in work.requests],
                                "max_tokens": [r.max_tokens for r in work.requests]}))  # fmt: skip
    settings = {"num_blocks": NUM_BLOCKS, "max_model_len": MAX_MODEL_LEN, "max_num_seqs": PEER_SLOTS}
    script = Path(__file__).with_name("serving_offline.py")
    out = subprocess.run([sys.executable, str(script), str(path), json.dumps(settings)], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run_all(opts: Options, log_dir: Path) -> dict[str, Any]:
    """Each server in turn: start, run its experiments, stop. Offline and the peer run on the same prompts."""
    runs: dict[str, list[BenchRun]] = {}
    notes: list[str] = []
    offline, peers = None, None
    for name in opts.servers:
        start, load = time.monotonic(), os.getloadavg()[0]
        if name == "peers" and opts.peers is not None:
            print("infer (every precision, speculation on/off) vs llama-server, in rounds", flush=True)
            peers = run_peers(opts.peers, log_dir)
            notes.append(f"peers: {time.monotonic() - start:.0f} s, load average {load:.1f} → {os.getloadavg()[0]:.1f}")
            continue
        if name == "offline":
            print("offline LLM.generate on the saturation prompts", flush=True)
            offline = offline_throughput(opts, log_dir)
            notes.append(
                f"offline: {time.monotonic() - start:.0f} s, load average {load:.1f} → {os.getloadavg()[0]:.1f}"
            )
            continue
        exps = [e for e in EXPERIMENTS if e.server == name]
        print(f"server {name}: {len(exps)} experiment(s)", flush=True)
        try:
            with infer_server(name, SERVERS[name], log_dir) as server:
                for exp in exps:
                    runs[exp.key] = asyncio.run(run_experiment(exp, server, opts))
        except Exception as e:  # NOTE: one server failing must not lose the others' figures
            notes.append(f"{name} failed: {type(e).__name__}: {e}")
            print(notes[-1], flush=True)
            continue
        notes.append(f"{name}: {time.monotonic() - start:.0f} s, load average {load:.1f} → {os.getloadavg()[0]:.1f}")
        print(notes[-1], flush=True)
    return {"runs": runs, "offline": offline, "peers": peers, "notes": notes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0,
                    help="request counts x this (0.25 for a quick run); the burst of 48 stays")  # fmt: skip
    ap.add_argument("--max-tokens", type=int, default=None, help="cap every request's new tokens")
    ap.add_argument("--servers", default=",".join([*SERVERS, "offline", "peers"]),
                    help="which, comma-separated; peers: every precision and llama-server, in rounds")  # fmt: skip
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    ap.add_argument("--no-progress", action="store_true")
    add_peer_arguments(ap)
    args = ap.parse_args()
    servers = tuple(args.servers.split(","))
    unknown = set(servers) - {*SERVERS, "offline", "peers"}
    if unknown:
        ap.error(f"unknown server(s): {', '.join(sorted(unknown))}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: every started server is stopped
    try:
        peers = peer_options(args)
    except ValueError as e:
        ap.error(str(e))
    opts = Options(args.scale, args.max_tokens, servers, not args.no_progress, args.out_dir, peers)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="infer-serving-") as tmp:
        result = run_all(opts, Path(tmp))
    meta = {
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, {_cpu_name()}",
        "command": "make bench-serving" + (f" ARGS='{' '.join(sys.argv[1:])}'" if sys.argv[1:] else ""),
        "scale": args.scale, "max_tokens": args.max_tokens, "num_blocks": NUM_BLOCKS,
        "max_model_len": MAX_MODEL_LEN, "servers": {k: list(v) for k, v in SERVERS.items()},
        "llama": llama_version() if "peers" in servers and LLAMA_SERVER.exists() else "",
        "wall_s": time.monotonic() - started, "slo": {"ttft_s": SLO.ttft_s, "tpot_s": SLO.tpot_s},
    }  # fmt: skip
    for path in write_report(result, meta, opts.out_dir):
        print(f"wrote {path}")


def add_peer_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=2, help="peers: rounds over every server (medians)")
    ap.add_argument("--precisions", default=",".join(precisions()), help="peers: which, comma-separated")
    ap.add_argument(
        "--speculation-setting",
        default=None,
        help="peers: the server setting that turns speculation on (default: the first named specul*)",
    )
    ap.add_argument("--speculation-on", default=None, help="peers: its value for on (default: true / ngram / 4)")
    ap.add_argument("--no-llama", action="store_true", help="peers: infer only")  # fmt: skip


def peer_options(args: argparse.Namespace) -> PeerOptions:
    """The peers comparison's options; --scale scales its request counts, --max-tokens caps its new tokens."""
    scale, cap = args.scale, args.max_tokens or 10**9
    work = MatrixWork(batch1_requests=max(1, round(4 * scale)), concurrent_requests=max(2, round(32 * scale)),
                      grounded_tokens=min(128, cap), random_tokens=min(128, cap))  # fmt: skip
    spec = find_speculation(args.speculation_setting, args.speculation_on)
    if args.speculation_setting and spec is None:
        raise ValueError(f"--speculation-setting {args.speculation_setting}: no such server setting")
    flags = ("--max-model-len", str(MAX_MODEL_LEN))
    return PeerOptions(args.rounds, work, tuple(args.precisions.split(",")), spec, flags, not args.no_progress,
                       not args.no_llama)  # fmt: skip


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    main()
