"""A replay burst against the KV-cache events publisher: how late live events arrive meanwhile.

No model: a `KVEventPublisher` whose replay ring is filled with --ring batches, then a live batch every
--step-ms (an engine step's), read by a subscriber in another process that notes each live batch's delay
(arrival minus the step's timestamp in the payload). An attacker in a third process sends --requests replay
requests, all for batch 0 (the whole ring), from --dealers DEALER sockets at once, and reads every answer. The
run ends when every request got its end marker, or after --window seconds. Prints one JSON object: the live
delay during the burst (p50, p99, max), the end markers received, how many answers were refused (the end marker
alone), the publisher process's CPU seconds and the load average. A live batch that has not arrived by the end
counts as late by at least the time it waited.

    .venv/bin/python benchmarks/kv_events_replay.py --ring 10000 --requests 10000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import Any

import zmq

from infer.engine.kv_events import KVEventPublisher

LOCAL = "tcp://127.0.0.1:*"
END_SEQ = (1 << 64) - 1


def subscriber(endpoint: str, ready: Event, stop: Event, out: Connection) -> None:
    """Read live batches; send back when each arrived (seq -> time.time())."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.connect(endpoint)
    arrived: dict[int, float] = {}
    while not stop.is_set():
        if sub.poll(50):
            _, seq_bytes, _ = sub.recv_multipart()
            arrived[int.from_bytes(seq_bytes, "big")] = time.time()
            ready.set()
    out.send(arrived)
    ctx.destroy(linger=0)


def attacker(endpoint: str, num_requests: int, num_dealers: int, window_s: float, out: Connection) -> None:
    """Send every request at once, spread over the dealers, then read answers until each got its end marker."""
    ctx = zmq.Context()
    dealers = [ctx.socket(zmq.DEALER) for _ in range(num_dealers)]
    poller = zmq.Poller()
    for dealer in dealers:
        dealer.setsockopt(zmq.SNDHWM, 0)  # queue every request: the burst leaves at once
        dealer.connect(endpoint)
        poller.register(dealer, zmq.POLLIN)
    started = time.monotonic()
    for i in range(num_requests):
        dealers[i % num_dealers].send_multipart([b"", (0).to_bytes(8, "big")])
    num_ends = num_batches = 0
    while num_ends < num_requests and time.monotonic() - started < window_s:
        for dealer, _ in poller.poll(100):
            while True:
                try:
                    frames = dealer.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if int.from_bytes(frames[2], "big") == END_SEQ:
                    num_ends += 1
                else:
                    num_batches += 1
    out.send({"end_markers": num_ends, "batches_replayed": num_batches,
              "attack_s": round(time.monotonic() - started, 2)})  # fmt: skip
    ctx.destroy(linger=0)


def fill(pub: KVEventPublisher, num_batches: int, num_blocks: int) -> None:
    """Publish num_batches steps' worth of events and wait until the last is replayable."""
    for i in range(num_batches):
        step(pub, i, num_blocks)
        if i % 1000 == 999:
            time.sleep(0.5)  # the publisher thread keeps up: its queue holds 4,096 batches
    probe: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    assert pub.replay_endpoint is not None
    probe.connect(pub.replay_endpoint)
    seqs: list[int] = []
    while seqs != [pub.last_seq]:
        time.sleep(0.05)
        probe.send_multipart([b"", pub.last_seq.to_bytes(8, "big")])
        seqs = []
        while probe.poll(10_000) and (seq := int.from_bytes(probe.recv_multipart()[2], "big")) != END_SEQ:
            seqs.append(seq)
    probe.close(linger=0)


def step(pub: KVEventPublisher, i: int, num_blocks: int) -> float:
    """One step's events: num_blocks chained blocks stored and the previous step's removed; when it ended."""
    base = 1 + i * num_blocks
    for b in range(num_blocks):
        pub.block_stored(base + b, base + b - 1 if b else None, [i % 30_000 + b] * pub.block_size)
    for b in range(num_blocks if i else 0):
        pub.block_removed(base - num_blocks + b)
    pub.end_step()
    return time.time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ring", type=int, default=10_000, help="batches published before the burst")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--dealers", type=int, default=10)
    parser.add_argument("--blocks", type=int, default=4, help="blocks of 16 tokens stored per step")
    parser.add_argument("--step-ms", type=float, default=10.0, help="a live batch every so often")
    parser.add_argument("--window", type=float, default=60.0, help="seconds the burst may run")
    args = parser.parse_args()
    mp_ctx = mp.get_context("spawn")
    pub = KVEventPublisher(LOCAL, LOCAL, "kv@bench@model", 16)
    assert pub.replay_endpoint is not None
    fill(pub, args.ring, args.blocks)
    ready, stop = mp_ctx.Event(), mp_ctx.Event()
    sub_out, sub_in = mp_ctx.Pipe(duplex=False)
    att_out, att_in = mp_ctx.Pipe(duplex=False)
    sub = mp_ctx.Process(target=subscriber, args=(pub.endpoint, ready, stop, sub_in))
    sub.start()
    i = args.ring
    while not ready.is_set():  # until the subscription is in
        step(pub, i, args.blocks)
        i += 1
        time.sleep(0.05)
    load_before, published, dropped_before = os.getloadavg(), dict[int, float](), pub.num_dropped
    cpu_before, started = time.process_time(), time.monotonic()
    att = mp_ctx.Process(target=attacker, args=(pub.replay_endpoint, args.requests, args.dealers, args.window, att_in))
    att.start()
    while att.is_alive() and time.monotonic() - started < args.window + 5:
        published[pub.last_seq + 1] = step(pub, i, args.blocks)
        i += 1
        time.sleep(args.step_ms / 1000)
    burst_s, cpu_s = time.monotonic() - started, time.process_time() - cpu_before
    for _ in range(100):  # a second of quiet: the last live batches arrive
        step(pub, i, args.blocks)
        i += 1
        time.sleep(0.01)
    stop.set()
    arrived, stopped = sub_out.recv(), time.time()  # a batch not arrived: late by at least until now
    delays = [arrived.get(seq, stopped) - ts for seq, ts in published.items()]
    attack = att_out.recv() if att_out.poll(10) else {}
    quantiles = statistics.quantiles(delays, n=100) if len(delays) > 1 else [float("nan")] * 99
    result: dict[str, Any] = {
        "ring": args.ring, "requests": args.requests, "dealers": args.dealers, "step_ms": args.step_ms,
        "burst_s": round(burst_s, 2), "live_published": len(published),
        "live_not_arrived": len(published.keys() - arrived.keys()),
        "live_delay_ms": {"p50": round(1000 * quantiles[49], 2), "p99": round(1000 * quantiles[98], 2),
                          "max": round(1000 * max(delays, default=float("nan")), 2)},
        **attack, "refused": getattr(pub, "num_replays_refused", None), "dropped": pub.num_dropped - dropped_before,
        "publisher_cpu_s": round(cpu_s, 2), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
    }  # fmt: skip
    print(json.dumps(result), flush=True)
    os._exit(0)  # NOTE: a publisher thread still busy with the burst (the old code) would not stop in time


if __name__ == "__main__":
    main()
