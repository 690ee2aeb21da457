"""Request ids (issue 27, finding 5), on the fake engine, stalled while a burst is in flight so every request of it
overlaps every other:

- an `n` > 1 request with an X-Request-Id runs beside other clients' requests whose ids look like its choices'
  (`<id>-1`, `<id>1`, ...; over HTTP or gRPC, some with a choice_index of their own): every one is served, the n
  choices answer as one response (`cmpl-<id>`, X-Request-Id echoed, choices 0..n-1);
- the same X-Request-Id again while it is in flight, asking for as many choices (one, or several), is 409
  duplicate_request_id; a gRPC request_id shaped like an engine key (`<id> (choice 1)`) is INVALID_ARGUMENT;
- X-Request-Id sent 2 to 4 times (raw header lists: a dict cannot repeat a header), empty or not, is 400 naming it,
  and never reaches the engine; sent once empty, it counts as absent (a random id, echoed).

After each example the engine holds no request and no KV block. `make test` runs a short pass, `make fuzz` a long one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from infer.api import pb, pb_grpc
from infer.engine.core import EngineCore
from tests.fuzz.strategies import examples
from tests.helpers.fake_engine import FakeRunner
from tests.integration.grpc_helpers import ServerThread, running_fake_server
from tests.unit.server.gateway.gateway_helpers import wait_for

pytestmark = pytest.mark.fuzz
MODEL = "fake"
IDS = st.from_regex(r"[\x21-\x7e]{1,24}", fullmatch=True)  # what X-Request-Id takes (1 to 128 visible ASCII)
WAIT_S = 30.0  # for the engine to see a burst's requests: a bound, not a timing


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_fake_server(max_model_len=256, max_num_seqs=16, max_waiting_requests=64) as s:
        yield s


@dataclass(frozen=True)
class Other:
    """Another client's request, in flight beside the n choices."""

    suffix: str  # its id is the n request's id plus this
    door: str  # http, grpc, or grpc_choice (a gRPC request with a choice_index of its own)


@dataclass(frozen=True)
class Burst:
    request_id: str
    n: int
    is_chat: bool
    others: list[Other]
    again: bool  # the same id again, as many choices, while the first is in flight: 409


SUFFIXES = st.sampled_from(["-0", "-1", "-2", "-3", "0", "1", "2", "#1", "-x"])
BURSTS = st.builds(
    Burst, IDS, st.integers(1, 4), st.booleans(),
    st.lists(st.builds(Other, SUFFIXES, st.sampled_from(["http", "grpc", "grpc_choice"])), max_size=4,
             unique_by=lambda o: o.suffix),
    st.booleans(),
)  # fmt: skip


def _num_in_flight(core: EngineCore) -> int:
    stats = core.stats()
    return stats.num_waiting + stats.num_running


def _body(is_chat: bool, n: int) -> dict[str, Any]:
    if is_chat:
        return {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3, "n": n}
    return {"model": MODEL, "prompt": "Hello", "max_tokens": 3, "n": n}


def _post(http: httpx.Client, is_chat: bool, n: int, headers: list[tuple[str, str]]) -> httpx.Response:
    return http.post("/v1/chat/completions" if is_chat else "/v1/completions", json=_body(is_chat, n), headers=headers)


def _grpc_other(stub: pb_grpc.InferenceServiceStub, request_id: str, with_choice: bool) -> set[str]:
    request = pb.GenerateRequest(request_id=request_id, prompt="Hello", sampling=pb.SamplingParams(max_tokens=3))
    if with_choice:
        request.choice_index = 1
    responses = list(stub.Generate(request, timeout=60))
    assert responses[-1].finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
    return {r.request_id for r in responses}


def _check_served(response: httpx.Response, request_id: str, n: int, is_chat: bool) -> None:
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"] == request_id
    body = response.json()
    assert body["id"] == ("chatcmpl-" if is_chat else "cmpl-") + request_id
    assert sorted(c["index"] for c in body["choices"]) == list(range(n))


@examples(ci=15, fuzz=600)
@given(burst=BURSTS)
def test_the_choices_of_n_never_collide_and_a_duplicate_in_flight_is_409(
    server: ServerThread, stub: pb_grpc.InferenceServiceStub, http: httpx.Client, burst: Burst
) -> None:
    core = server.engine.core
    runner = core.runner
    assert isinstance(runner, FakeRunner)
    event(f"n={burst.n}")
    runner.gate.clear()
    try:
        with ThreadPoolExecutor(1 + len(burst.others)) as pool:
            main = pool.submit(_post, http, burst.is_chat, burst.n, [("X-Request-Id", burst.request_id)])
            wait_for(lambda: main.done() or _num_in_flight(core) == burst.n, WAIT_S)
            others = [_send_other(pool, stub, http, burst, other) for other in burst.others]
            wait_for(lambda: main.done() or _num_in_flight(core) == burst.n + len(others), WAIT_S)
            if burst.again:
                again = _post(http, not burst.is_chat, burst.n, [("X-Request-Id", burst.request_id)])
                error = again.json()["error"]
                assert again.status_code == 409 and error["code"] == "duplicate_request_id", again.text
                assert error["param"] == "X-Request-Id" and "already in flight" in error["message"], error
            _spoof(stub, burst.request_id)
            runner.gate.set()
            _check_served(main.result(60), burst.request_id, burst.n, burst.is_chat)
            for other, check in zip(burst.others, others, strict=True):
                event(f"beside: {other.door}")
                check()
    finally:
        runner.gate.set()
    server.wait_idle()


def _send_other(
    pool: ThreadPoolExecutor, stub: pb_grpc.InferenceServiceStub, http: httpx.Client, burst: Burst, other: Other
) -> Callable[[], None]:
    """Sends it; what checks its answer."""
    request_id = burst.request_id + other.suffix
    if other.door == "http":
        response = pool.submit(_post, http, False, 1, [("X-Request-Id", request_id)])
        return lambda: _check_served(response.result(60), request_id, 1, False)
    ids: Future[set[str]] = pool.submit(_grpc_other, stub, request_id, other.door == "grpc_choice")

    def check() -> None:
        assert ids.result(60) == {request_id}  # the client's id is echoed, whatever the engine keys it by

    return check


def _spoof(stub: pb_grpc.InferenceServiceStub, request_id: str) -> None:
    """A request id shaped like a choice's engine key is refused, naming request_id."""
    request = pb.GenerateRequest(request_id=f"{request_id} (choice 1)", prompt="Hello",
                                 sampling=pb.SamplingParams(max_tokens=2))  # fmt: skip
    with pytest.raises(grpc.RpcError) as error:
        list(stub.Generate(request, timeout=60))
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "request_id" in str(error.value.details())


@examples(ci=15, fuzz=1500)
@given(values=st.lists(IDS | st.just(""), min_size=1, max_size=4), is_chat=st.booleans(), n=st.integers(1, 3))
def test_x_request_id_sent_twice_is_400_and_empty_is_absent(
    server: ServerThread, http: httpx.Client, values: list[str], is_chat: bool, n: int
) -> None:
    runner = server.engine.core.runner
    assert isinstance(runner, FakeRunner)
    num_passes = len(runner.calls)
    response = _post(http, is_chat, n, [("X-Request-Id", value) for value in values])
    event(f"sent {len(values)} times" + (", empty" if "" in values else ""))
    if len(values) > 1:
        error = response.json()["error"]
        assert response.status_code == 400, response.text
        assert error == {"message": f"X-Request-Id: sent {len(values)} times; send it once",
                         "type": "invalid_request_error", "param": "X-Request-Id", "code": "invalid_value"}  # fmt: skip
        server.wait_idle()
        assert len(runner.calls) == num_passes, "it reached the engine"
    elif values == [""]:
        random_id = response.headers["x-request-id"]
        assert re.fullmatch(r"[0-9a-f]{32}", random_id), random_id
        _check_served(response, random_id, n, is_chat)
    else:
        _check_served(response, values[0], n, is_chat)
    server.wait_idle()
