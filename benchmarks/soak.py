"""Soak (`make soak`, not in CI): N mixed streams for T minutes against a real `infer serve`, then the verdict.

The traffic, over both front doors: whole streams, slow readers, clients that disconnect mid-stream,
deadlines too short to finish, invalid requests; the KV pool is small enough that requests get preempted.
From --hostile-from of the run on, a share of the requests are hostile (`soak_hostile.py`: deep JSON, key
floods, bad header bytes, cross-site posts, underflowing floats, huge chats, stalled headers, idle sockets; and
issue 27's: schemas that take minutes to compile from callers that leave, JSON under length-bounded and pattern
strings, refused schemas and tools, request ids, scrapes beside idle sockets). Every window of the run records
outcomes, P99 time to first token and RSS (the server's and its grammar worker's, sampled every --rss-interval-s).
At the end the server must be idle with every KV block free and no grammar compile pending, no remote `$ref`
fetched, and its RSS flat after warm-up: within a tolerance of its first sample after warm-up, and its least-squares
slope over the rest of the phase worth less than the tolerance. Writes docs/reliability.md and docs/reliability.json.
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
import soak_hostile
from soak_hostile import Doors, hostile_client

from infer.api import pb, pb_grpc

DOCS = Path(__file__).resolve().parent.parent / "docs"
KINDS = ("whole", "slow", "disconnect", "deadline", "invalid", "http", "http_disconnect")
EXPECTED = {  # outcomes that are right for each kind of client
    "whole": {"OK"}, "slow": {"OK"}, "disconnect": {"CANCELLED"},
    "deadline": {"OK", "DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED (predicted)"},
    "invalid": {"INVALID_ARGUMENT"}, "http": {"200"}, "http_disconnect": {"disconnected"},
    **soak_hostile.EXPECTED,
}  # fmt: skip
RSS_TOLERANCE_MIB = 64.0  # RSS may move this much (or 5%) after warm-up and still count as flat


@dataclass
class Window:
    """What one slice of the run saw."""

    start_s: float
    phase: str = "normal"
    outcomes: Counter[str] = field(default_factory=Counter)
    ttfts_s: list[float] = field(default_factory=list)
    rss_mib: float = 0.0  # the server's, at the window's start
    worker_rss_mib: float = 0.0  # its grammar worker's (0 before it starts)
    samples: list[tuple[float, float, float]] = field(default_factory=list)  # (s since start, server, worker) MiB

    def p99_ttft_s(self) -> float:
        ttfts = sorted(self.ttfts_s)
        return ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else float("nan")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mib(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else float("nan")


def _worker_rss_mib(pid: int) -> float:
    """RSS of the server's grammar trial worker (`python -m infer.engine.structured.grammar_worker`), 0 when it has
    none."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            try:
                if b"grammar_worker" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return _rss_mib(int(child))
            except OSError:
                continue
    return 0.0


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
        # NOTE: refused at admission because the queue predicts a first token past the deadline (servicer.py),
        # told apart from a deadline that passed
        predicted = str(e.details() or "").startswith("predicted time to first token")
        return str(e.code().name) + (" (predicted)" if predicted else "")


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
    doors = Doors("127.0.0.1", ports["http"], ports["metrics"], listener_port=ports["listener"])
    options = [("grpc.max_send_message_length", 8 << 20)]
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{ports['grpc']}", options=options) as channel,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports['http']}", timeout=300) as http,
    ):
        stub = pb_grpc.InferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        while time.monotonic() < deadline:
            window = windows[-1]
            if window.phase == "hostile" and rng.random() < args.hostile_share:
                kind = rng.choice(soak_hostile.KINDS)
                outcome = await hostile_client(http, stub, doors, kind, rng)
            else:
                kind = rng.choice(KINDS)
                if kind.startswith("http"):
                    outcome = await _http_client(http, kind, rng)
                else:
                    outcome = await _grpc_client(stub, kind, rng, window)
            window.outcomes[f"{kind}:{outcome}"] += 1


def _record_rss(pid: int, windows: list[Window]) -> None:
    window = windows[-1]
    server, worker = _rss_mib(pid), _worker_rss_mib(pid)
    if not window.samples:
        window.rss_mib, window.worker_rss_mib = server, worker
    window.samples.append((time.monotonic() - windows[0].start_s, server, worker))


async def _sample(pid: int, windows: list[Window], args: argparse.Namespace, stop: asyncio.Event) -> None:
    hostile_from_s = windows[0].start_s + args.hostile_from * args.minutes * 60
    next_window_s = windows[0].start_s + args.window_s
    while not stop.is_set():
        _record_rss(pid, windows)
        try:
            await asyncio.wait_for(stop.wait(), min(args.rss_interval_s, max(0.0, next_window_s - time.monotonic())))
        except TimeoutError:
            now = time.monotonic()
            if now >= next_window_s - 1e-3:
                windows.append(Window(now, "hostile" if now >= hostile_from_s - 1e-3 else "normal"))
                next_window_s += args.window_s
    _record_rss(pid, windows)


def _gauges(metrics_port: int, names: tuple[str, ...]) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    found = {}
    for name in names:
        match = re.search(rf"^{name}(\{{[^}}]*\}})?\s+(\S+)$", text, re.M)
        found[name] = float(match.group(2)) if match else float("nan")
    return found


def _num_fetches(listener: socket.socket) -> int:
    """Connections to the listener the remote $refs point at: a server that fetched one made one."""
    num = 0
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return num
        conn.close()
        num += 1


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


AFTER_NAMES = ("infer_kv_blocks_used", "infer_grammar_compiles_pending", "infer_requests_running",
               "infer_requests_waiting")  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    listener = socket.create_server(("127.0.0.1", 0))  # where the refused schemas' remote $refs point
    listener.setblocking(False)
    ports = {"grpc": _free_port(), "http": _free_port(), "metrics": _free_port(),
             "listener": listener.getsockname()[1]}  # fmt: skip
    server = _start_server(args, ports)
    windows = [Window(time.monotonic(), "hostile" if args.hostile_from <= 0 else "normal")]
    try:

        async def main() -> None:
            stop = asyncio.Event()
            sampler = asyncio.create_task(_sample(server.pid, windows, args, stop))
            await asyncio.gather(*(_worker(args, ports, windows, seed) for seed in range(args.streams)))
            stop.set()
            await sampler

        asyncio.run(main())
        time.sleep(2)  # aborts land at the next engine step; a dropped compile's trial is killed within 50 ms
        after = _gauges(ports["metrics"], AFTER_NAMES)
    finally:
        server.send_signal(signal.SIGTERM)
        exit_code = server.wait(60)
        num_fetches = _num_fetches(listener)
        listener.close()
    return _report(args, windows, after, num_fetches, exit_code)


def slope_mib_per_min(samples: list[tuple[float, float]]) -> float:
    """The least-squares slope of (seconds, MiB) samples, in MiB a minute."""
    n = len(samples)
    mean_t, mean_x = sum(t for t, _ in samples) / n, sum(x for _, x in samples) / n
    var_t = sum((t - mean_t) ** 2 for t, _ in samples)
    return 60 * sum((t - mean_t) * (x - mean_x) for t, x in samples) / var_t if var_t > 0 else 0.0


def _phase_verdict(
    phase: str, windows: list[list[tuple[float, float]]], warmup_windows: int, absent_ok: bool
) -> tuple[bool, str]:
    """One phase's windows of (seconds, MiB) samples: flat when, after its warm-up windows, no sample is more
    than the tolerance above the first, and the slope over them is worth less than the tolerance. With
    absent_ok, a phase where the process never ran (every sample 0) is no failure."""
    if absent_ok and not any(x > 0 for samples in windows for _, x in samples):
        return True, f"{phase}: not running"
    after = [(t, x) for samples in windows[warmup_windows:] for t, x in samples if x > 0]
    if len(windows) - warmup_windows < 2 or len(after) < 3:
        return False, f"{phase}: too few windows after its {warmup_windows} warm-up windows to tell"
    base, peak = after[0][1], max(x for _, x in after)
    tolerance = max(RSS_TOLERANCE_MIB, 0.05 * base)
    slope = slope_mib_per_min(after)
    minutes = (after[-1][0] - after[0][0]) / 60
    is_flat = peak - base <= tolerance and abs(slope) * minutes <= tolerance
    verdict = "flat" if is_flat else "GROWING"
    return is_flat, (f"{phase}: {base:.0f} MiB after warm-up, peak {peak:.0f} MiB ({peak - base:+.0f}), slope "
                     f"{slope:+.2f} MiB/min over {minutes:.1f} min ({len(after)} samples): {verdict}")  # fmt: skip


def rss_verdict(
    windows: list[list[tuple[float, float]]], phases: list[str], warmup_windows: int, absent_ok: bool = False
) -> tuple[bool, str]:
    """Flat: in each phase, after its first warmup_windows windows, RSS stays within RSS_TOLERANCE_MIB (or 5%)
    of its first sample, and its least-squares slope times the time left is within it too (absent_ok: a phase
    where the process never ran passes; the grammar worker starts on the first compile).

    NOTE: each phase warms up on its own: the hostile one's 50,000-key bodies and 5,000-message chats raise the
    allocator's high-water mark once; a leak grows in every window.
    """
    verdicts = [_phase_verdict(phase, [w for w, p in zip(windows, phases, strict=True) if p == phase],
                               warmup_windows, absent_ok) for phase in dict.fromkeys(phases)]  # fmt: skip
    is_flat = all(flat for flat, _ in verdicts)
    sampled = [x for samples in windows for _, x in samples if x > 0]
    whole = f"whole run {sampled[0]:.0f} → {sampled[-1]:.0f} MiB" if sampled else "not sampled"
    return is_flat, "; ".join([*(text for _, text in verdicts), whole])


def _report(
    args: argparse.Namespace, windows: list[Window], after: dict[str, float], num_fetches: int, exit_code: int
) -> dict[str, Any]:
    total: Counter[str] = sum((w.outcomes for w in windows), Counter())
    unexpected = {k: n for k, n in total.items() if k.split(":", 1)[1] not in EXPECTED[k.split(":", 1)[0]]}
    phases = [w.phase for w in windows]
    is_flat, rss_text = rss_verdict([[(t, x) for t, x, _ in w.samples] for w in windows], phases, args.warmup_windows)
    worker_windows = [[(t, y) for t, _, y in w.samples] for w in windows]
    is_worker_flat, worker_text = rss_verdict(worker_windows, phases, args.warmup_windows, absent_ok=True)
    hostile = [w for w in windows if w.phase == "hostile"]
    return {
        "streams": args.streams, "minutes": args.minutes, "num_blocks": args.num_blocks,
        "hostile_from_s": round(hostile[0].start_s - windows[0].start_s, 1) if hostile else None,
        "hostile_share": args.hostile_share, "warmup_windows": args.warmup_windows, "window_s": args.window_s,
        "rss_interval_s": args.rss_interval_s,
        "outcomes": dict(sorted(total.items())), "unexpected": unexpected,
        "kv_blocks_used_after": after["infer_kv_blocks_used"],
        "grammar_compiles_pending_after": after["infer_grammar_compiles_pending"],
        "requests_after": after["infer_requests_running"] + after["infer_requests_waiting"],
        "remote_ref_fetches": num_fetches,
        "rss_flat": is_flat, "rss_verdict": rss_text,
        "worker_rss_flat": is_worker_flat, "worker_rss_verdict": worker_text,
        "server_exit_code": exit_code, "cpu": os.cpu_count(),
        "windows": [{"t_s": round(w.start_s - windows[0].start_s, 1), "phase": w.phase,
                     "requests": sum(w.outcomes.values()), "p99_ttft_s": round(w.p99_ttft_s(), 3),
                     "rss_mib": round(w.rss_mib, 1), "worker_rss_mib": round(w.worker_rss_mib, 1)} for w in windows],
    }  # fmt: skip


def _markdown(result: dict[str, Any]) -> str:
    w = result["windows"]
    hostile = (f"From {result['hostile_from_s']} s on (the hostile phase), {result['hostile_share']:.0%} of the "
               "requests are hostile (`benchmarks/soak_hostile.py`): JSON nested 10,000 deep, 50,000 unknown keys, "
               "header bytes gRPC cannot carry, cross-site text/plain posts, sampling values that underflow "
               "float32 (with logprobs), chats of 5,000 messages over HTTP and gRPC, request headers that never "
               "finish, idle sockets on the metrics port. Each kind has its expected answer (400, 200, 200, 403, "
               "200 or 422 without NaN, 400 or 422 / INVALID_ARGUMENT, 408, closed); docs/security.md lists "
               "the bounds behind them. And issue 27's: JSON schemas of 1,800 properties (about a minute to "
               "compile; a pool of 4, so refusals and compiles under way are met again) from callers that leave "
               "after 0.2-3 s (gone, or refused for time, or 429 when max_pending_grammars compiles are under "
               "way); JSON schemas with length-bounded, pattern, enum and date strings at temperature 1.5 under "
               "prompts that invite tabs, NULs and escapes (every finished output parses and validates with "
               "jsonschema; none holds a raw control character); schemas with `not`, `if`, `uniqueItems` or a "
               "remote `$ref` (400 naming the place and keyword; the remote `$ref`s point at a listener of the "
               "soak's own), as a response format and as one of three tools under every tool_choice (400 naming "
               "`tools[i].function.parameters`); `n` = 3 beside another client's `<id>-1` (both 200), "
               "X-Request-Id sent twice (400) or empty (200, a random id); three scrapes while 40 idle sockets sit "
               "on the metrics port (all answered)."
               if result["hostile_from_s"] is not None else "No hostile phase in this run.")  # fmt: skip
    lines = [
        "# Reliability: soak run", "",
        f"`make soak`: {result['streams']} concurrent clients for {result['minutes']} min against `infer serve` "
        f"(KV pool of {result['num_blocks']} blocks, so requests are preempted), mixing whole streams, slow "
        "readers, mid-stream disconnects (gRPC and HTTP), too-short deadlines and invalid requests.", "", hostile, "",
        f"- unexpected outcomes: {result['unexpected'] or 'none'}",
        f"- KV blocks in use after the run: {result['kv_blocks_used_after']:g} (must be 0); requests left: "
        f"{result['requests_after']:g}; grammar compiles pending: {result['grammar_compiles_pending_after']:g} "
        "(must be 0: a compile whose callers all left is dropped)",
        f"- remote `$ref`s fetched: {result['remote_ref_fetches']} (must be 0)",
        f"- server RSS: {result['rss_verdict']}",
        f"- grammar worker RSS (its own process): {result['worker_rss_verdict']}",
        f"- SIGTERM at the end: exit code {result['server_exit_code']}", "",
        "The verdict lines must hold on any machine; the TTFT column depends on the machine's load (a window "
        "that admits a burst of long prompts behind a preemption shows it), the RSS column on the allocator: "
        f"growth that flattens after the first {result['warmup_windows']} windows of a phase is warm-up (flat: "
        f"within {RSS_TOLERANCE_MIB:.0f} MiB or 5% of the first sample after it, and the least-squares slope over "
        f"the rest of the phase worth less than that), growth in every window a leak. RSS is sampled every "
        f"{result['rss_interval_s']:g} s; the table shows each window's first sample.", "",
        "| outcome | count |", "|---|---|", *(f"| {k} | {n} |" for k, n in result["outcomes"].items()), "",
        "| window start (s) | phase | requests | P99 TTFT (s) | RSS (MiB) | grammar worker RSS (MiB) |",
        "|---|---|---|---|---|---|",
        *(f"| {x['t_s']} | {x['phase']} | {x['requests']} | {x['p99_ttft_s']} | {x['rss_mib']} | "
          f"{x['worker_rss_mib']} |" for x in w), "",
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
    parser.add_argument(
        "--hostile-from",
        type=float,
        default=0.5,
        help="hostile requests join from the first window past this share of the run (1 = never)",
    )
    parser.add_argument("--hostile-share", type=float, default=0.25, help="share of hostile requests in that phase")
    parser.add_argument("--warmup-windows", type=int, default=2, help="windows of each phase before RSS must stay flat")
    parser.add_argument("--rss-interval-s", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--out-dir", type=Path, default=DOCS)
    args = parser.parse_args()
    result = run(args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "reliability.json").write_text(json.dumps(result, indent=2) + "\n")
    report = args.out_dir / "reliability.md"
    kept = _kept(report)
    report.write_text(_markdown(result) + kept)
    print(_markdown(result))
    print(f"RSS after warm-up: {result['rss_verdict']}\ngrammar worker: {result['worker_rss_verdict']}")
    ok = not result["unexpected"] and result["kv_blocks_used_after"] == 0 and result["server_exit_code"] == 0
    ok = ok and result["grammar_compiles_pending_after"] == 0 and result["remote_ref_fetches"] == 0
    ok = ok and result["rss_flat"] and result["worker_rss_flat"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
