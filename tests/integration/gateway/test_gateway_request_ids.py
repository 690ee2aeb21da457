"""Request ids across the gateway and the gRPC door, on the fake engine: the `n` choices of one request never
collide with another client's id, and a duplicate in flight is refused at both doors.

The engine is stalled (its runner's gate closed) while requests are sent, so every one is in flight at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
import httpx
import pytest

from infer.api import pb, pb_grpc
from infer.engine.core import EngineCore
from tests.helpers.fake_engine import FakeRunner
from tests.integration.grpc_helpers import ServerThread, running_fake_server
from tests.unit.server.gateway.gateway_helpers import error_of, wait_for

COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_fake_server(max_model_len=256) as s:
        yield s


@pytest.fixture
def stub(server: ServerThread) -> Iterator[pb_grpc.InferenceServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.InferenceServiceStub(channel)


def _num_in_flight(core: EngineCore) -> int:
    stats = core.stats()
    return stats.num_waiting + stats.num_running


def _completion(http: httpx.Client, request_id: str, n: int = 1) -> httpx.Response:
    body = {"model": http.get("/v1/models").json()["data"][0]["id"], "prompt": "Hello", "max_tokens": 3, "n": n}
    return http.post(COMPLETIONS, json=body, headers={"X-Request-Id": request_id})


def _release(core: EngineCore, *calls: Future[httpx.Response]) -> list[httpx.Response]:
    runner = core.runner
    assert isinstance(runner, FakeRunner)
    runner.gate.set()
    return [call.result(30) for call in calls]


def test_the_choices_of_n_never_collide_with_another_clients_id(http: httpx.Client, stalled: EngineCore) -> None:
    with ThreadPoolExecutor(2) as pool:
        other = pool.submit(_completion, http, "nn-1")  # an unrelated client's id, in flight
        wait_for(lambda: _num_in_flight(stalled) == 1)
        choices = pool.submit(_completion, http, "nn", 3)
        wait_for(lambda: choices.done() or _num_in_flight(stalled) == 4)
        other_response, choices_response = _release(stalled, other, choices)
    assert other_response.status_code == 200 and other_response.json()["id"] == "cmpl-nn-1"
    assert choices_response.status_code == 200, choices_response.text
    assert choices_response.json()["id"] == "cmpl-nn" and choices_response.headers["x-request-id"] == "nn"
    assert [c["index"] for c in choices_response.json()["choices"]] == [0, 1, 2]


def test_the_same_id_twice_in_flight_is_409_also_for_choices(http: httpx.Client, stalled: EngineCore) -> None:
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(_completion, http, "twice", 2)
        wait_for(lambda: _num_in_flight(stalled) == 2)
        error = error_of(_completion(http, "twice", 2), 409)
        assert error["code"] == "duplicate_request_id"
        assert re.search(r"'twice \(choice [01]\)' is already in flight", error["message"])  # whichever starts first
        (response,) = _release(stalled, first)
    assert response.status_code == 200


def test_the_grpc_door_keys_choices_apart_from_request_ids(
    stub: pb_grpc.InferenceServiceStub, stalled: EngineCore
) -> None:
    sampling = pb.SamplingParams(max_tokens=2, ignore_eos=True)
    plain = stub.Generate(pb.GenerateRequest(request_id="g-1", prompt="Hello", sampling=sampling))
    choice = stub.Generate(pb.GenerateRequest(request_id="g", choice_index=1, prompt="Hello", sampling=sampling))
    wait_for(lambda: _num_in_flight(stalled) == 2)
    again = stub.Generate(pb.GenerateRequest(request_id="g", choice_index=1, prompt="Hello", sampling=sampling))
    with pytest.raises(grpc.RpcError) as e:
        list(again)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "already in flight" in str(e.value.details())
    # a request id cannot be a choice's engine id: it has no space
    spoof = stub.Generate(pb.GenerateRequest(request_id="g (choice 1)", prompt="Hello", sampling=sampling))
    with pytest.raises(grpc.RpcError) as e:
        list(spoof)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in str(e.value.details())
    _release(stalled)
    assert {r.request_id for r in plain} == {"g-1"}
    assert {r.request_id for r in choice} == {"g"}  # the client's id is echoed, not the engine's
