"""Soak (`make test-slow`): a bounded storm of mixed gRPC traffic, then the server must be whole.

Normal streams, streams cancelled after their first token, deadlines too short to finish, invalid
requests and a full queue, all at once, on a KV pool small enough to preempt. Afterwards every normal
stream has all its tokens, no request or KV block is left in the engine, and the server still serves.
"""

from __future__ import annotations

import concurrent.futures
import random
from collections import Counter
from pathlib import Path

import grpc
import pytest

from infer.api import pb, pb_grpc
from tests.integration.grpc_helpers import running_server

pytestmark = pytest.mark.slow

NUM_REQUESTS = 96


EXPECTED = {
    "normal": {grpc.StatusCode.OK},
    "cancel": {grpc.StatusCode.CANCELLED},
    "deadline": {grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED},  # a short request may finish in time
    "invalid": {grpc.StatusCode.INVALID_ARGUMENT},
}


def _one(stub: pb_grpc.InferenceServiceStub, i: int) -> tuple[str, grpc.StatusCode, str]:
    """Send request i (its kind and size drawn from i); its kind, status code, and details."""
    rng = random.Random(i)
    kind = ("normal", "cancel", "deadline", "invalid")[i % 4]
    words = " ".join(rng.choice(["red", "fox", "sky", "tree", "blue", "river"]) for _ in range(rng.randint(3, 200)))
    max_tokens = rng.randint(16, 64)
    sampling = pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=rng.choice([0.0, 0.8]), seed=i)
    if kind == "invalid":
        sampling.top_p = 2.0
    call = stub.Generate(
        pb.GenerateRequest(request_id=f"soak-{i}", prompt=words, sampling=sampling),
        timeout=0.3 if kind == "deadline" else 120,
    )
    tokens = 0
    try:
        for response in call:
            tokens += len(response.token_ids)
            if kind == "cancel":
                call.cancel()
    except grpc.RpcError as e:
        return kind, e.code(), e.details() or ""
    return kind, grpc.StatusCode.OK, f"{tokens} of {max_tokens} tokens"


def test_mixed_traffic_leaves_the_server_whole(default_model_dir: Path) -> None:
    # a small pool (preemption happens) and a short queue (some requests are refused at once)
    with (
        running_server(default_model_dir, num_blocks=48, max_num_seqs=16, max_waiting_requests=20) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.InferenceServiceStub(channel)
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            results = list(pool.map(lambda i: _one(stub, i), range(NUM_REQUESTS)))
        server.wait_idle(timeout_s=60)  # no request and no KV block left behind
        for kind, code, details in results:
            assert code in EXPECTED[kind] | {grpc.StatusCode.RESOURCE_EXHAUSTED}, (kind, code, details)
            if kind == "normal" and code is grpc.StatusCode.OK:
                done, _, wanted, _ = details.split(maxsplit=3)
                assert done == wanted, details  # every token of a request that was not cut short
        outcomes = Counter(code.name for _, code, _ in results)
        assert outcomes["OK"] > 0 and outcomes["CANCELLED"] > 0, outcomes
        stats = server.engine.core.stats()
        assert stats.num_preemptions_total > 0, (outcomes, stats)  # the pool was meant to be too small
        response = list(stub.Generate(pb.GenerateRequest(prompt="Hello", sampling=pb.SamplingParams(max_tokens=4))))
        assert sum(len(r.token_ids) for r in response) == 4  # still serving
