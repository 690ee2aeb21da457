"""Grammar compiles that would starve everyone (issue 27, finding 1), at both front doors, on the fake engine with
a compile budget of BUDGET_S: bursts of up to 6 constraints, cheap ones (a regex) and slow ones
(tests/helpers/slow_grammar.py, ~1.5 s of CPU, so past the budget), some repeating another of the burst, sent
together by callers that stay, that leave at a short deadline, or that cancel.

Each caller gets its documented answer: a cheap constraint's output (matching it) or, when max_pending_grammars
compiles are under way, RESOURCE_EXHAUSTED / 429 with Retry-After; a slow one is refused for time (INVALID_ARGUMENT
/ 400 naming grammar_compile_budget_s); a caller that leaves may also just be gone. Then: no compile is left
pending, no slow constraint was ever compiled in the server (only one whose trial finished is), a slow constraint
is refused again (from memory: no new trial), a cheap one whose callers all left compiles when asked again (a
dropped compile is not remembered), and the engine holds no request and no KV block.

`make test` runs a short pass, `make fuzz` a long one.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import httpx
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from infer.api import pb, pb_grpc
from infer.engine.structured import GrammarCompiler
from tests.fuzz.strategies import examples
from tests.helpers.slow_grammar import SLOW_GRAMMAR, record_compiles
from tests.integration.grpc_helpers import ServerThread, running_fake_server
from tests.unit.server.gateway.gateway_helpers import LoopThread, RunningGateway, running_gateway, wait_for

pytestmark = pytest.mark.fuzz
BUDGET_S = 0.25
MAX_PENDING = 3
REFUSED_FOR_TIME = f"does not compile within {BUDGET_S:g} s of CPU time (grammar_compile_budget_s)"
_nonces = itertools.count()  # every burst compiles constraints of its own


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    engine = {"grammar_compile_budget_s": BUDGET_S, "max_pending_grammars": MAX_PENDING, "max_model_len": 256}
    with running_fake_server(**engine) as s:
        yield s


@pytest.fixture(scope="module")
def gateway(server: ServerThread) -> Iterator[RunningGateway]:
    loop = LoopThread()
    with running_gateway(server.address, loop) as gateway:
        yield gateway
    loop.close()


@dataclass(frozen=True)
class Job:
    """One caller of a burst."""

    is_slow: bool
    repeats: int | None  # the index of an earlier job of the burst whose constraint this one sends again
    leave: str  # stay, deadline (a short one) or cancel (after wait_s)
    wait_s: float
    door: str  # grpc or http


JOBS = st.lists(
    st.builds(Job, st.booleans(), st.none() | st.integers(0, 5), st.sampled_from(["stay", "deadline", "cancel"]),
              st.floats(0.02, 0.5), st.sampled_from(["grpc", "http"])),
    min_size=1, max_size=6,
)  # fmt: skip


@dataclass(frozen=True)
class Wanted:
    """A job's constraint, as both doors send it."""

    is_slow: bool
    text: str = field(repr=False)  # the grammar, or the regex of a cheap one

    @property
    def kind(self) -> str:
        return "grammar" if self.is_slow else "regex"


def _constraints(jobs: list[Job]) -> list[Wanted]:
    wanted: list[Wanted] = []
    for job in jobs:
        if job.repeats is not None and job.repeats < len(wanted):
            wanted.append(wanted[job.repeats])
            continue
        nonce = next(_nonces)
        if job.is_slow:
            # NOTE: at the end: a literal first makes the compile ~10x cheaper
            wanted.append(Wanted(True, f'{SLOW_GRAMMAR.text} "s{nonce}"'))
        else:
            wanted.append(Wanted(False, f"c{nonce}[0-9]{{1,3}}"))
    return wanted


def _grpc(stub: pb_grpc.InferenceServiceStub, wanted: Wanted, leave: str, wait_s: float) -> str:
    sampling = pb.SamplingParams(max_tokens=32, **{wanted.kind: wanted.text})  # type: ignore[arg-type]
    timeout_s = wait_s if leave == "deadline" else 60
    call = stub.Generate(pb.GenerateRequest(prompt="Hi", sampling=sampling), timeout=timeout_s)
    if leave == "cancel":
        time.sleep(wait_s)
        call.cancel()
    try:
        responses = list(call)
    except grpc.RpcError as e:
        return _grpc_refusal(e)
    text = "".join(r.text for r in responses)
    assert responses[-1].finish_reason == pb.FINISH_REASON_STOP and re.fullmatch(wanted.text, text), text
    return "OK"


def _grpc_refusal(error: grpc.RpcError) -> str:
    code, details = error.code(), str(error.details())
    if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return "LEFT"
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        assert "(max_pending_grammars)" in details, details
        return "FULL"
    assert code is grpc.StatusCode.INVALID_ARGUMENT and details == f"sampling.grammar: {REFUSED_FOR_TIME}", error
    return "REFUSED"


def _http(url: str, wanted: Wanted, leave: str, wait_s: float) -> str:
    field = f"guided_{wanted.kind}"
    body = {"model": "fake", "prompt": "Hi", "max_tokens": 32, field: wanted.text}
    with httpx.Client(base_url=url, timeout=60 if leave == "stay" else wait_s) as client:
        try:
            response = client.post("/v1/completions", json=body)
        except httpx.TimeoutException:
            return "LEFT"  # the connection closes: the gateway cancels its upstream call
    if response.status_code == 200:
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] == "stop" and re.fullmatch(wanted.text, choice["text"]), choice
        return "OK"
    error = response.json()["error"]
    if response.status_code == 429:
        assert "(max_pending_grammars)" in error["message"] and response.headers["retry-after"], error
        return "FULL"
    assert response.status_code == 400 and error["param"] == field, (response.status_code, error)
    assert error["message"] == f"{field}: {REFUSED_FOR_TIME}", error
    return "REFUSED"


def _send(stub: pb_grpc.InferenceServiceStub, url: str, job: Job, wanted: Wanted) -> str:
    if job.door == "grpc":
        return _grpc(stub, wanted, job.leave, job.wait_s)
    return _http(url, wanted, job.leave, job.wait_s)


class Compiled:
    """The constraints compiled in the server process (not the trials), with a short repr for hypothesis' report."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.constraints = record_compiles(monkeypatch)

    def __repr__(self) -> str:
        return f"<{len(self.constraints)} compiled>"


@pytest.fixture
def compiled_here(monkeypatch: pytest.MonkeyPatch) -> Compiled:
    return Compiled(monkeypatch)


@examples(ci=4, fuzz=150)
@given(jobs=JOBS)
def test_compiles_stay_bounded_whoever_leaves(
    server: ServerThread, stub: pb_grpc.InferenceServiceStub, gateway: RunningGateway,
    compiled_here: Compiled, jobs: list[Job],
) -> None:  # fmt: skip
    wanted = _constraints(jobs)
    with ThreadPoolExecutor(len(jobs)) as pool:
        outcomes = list(pool.map(lambda j, w: _send(stub, gateway.url, j, w), jobs, wanted))
    for job, want, outcome in zip(jobs, wanted, outcomes, strict=True):
        event(f"{'slow' if want.is_slow else 'cheap'} {job.leave}: {outcome}")
        allowed = {"REFUSED" if want.is_slow else "OK", "FULL"} | ({"LEFT"} if job.leave != "stay" else set())
        assert outcome in allowed, (job, outcome)
    compiler = server.engine.core.structured.compiler
    wait_for(lambda: compiler.stats.num_pending == 0, timeout_s=60)
    slow_texts = {w.text for w in wanted if w.is_slow}
    compiled_texts = {c.text for c in compiled_here.constraints}
    assert not slow_texts & compiled_texts, "a constraint over its budget was compiled in the server"
    _asked_again(stub, compiler, wanted)
    server.wait_idle()


def _asked_again(stub: pb_grpc.InferenceServiceStub, compiler: GrammarCompiler, wanted: list[Wanted]) -> None:
    """Whatever happened in the burst, a caller that stays now gets the constraint's own answer: slow ones refused
    (the second time from memory: no compile runs), cheap ones served."""
    for want in dict.fromkeys(wanted):
        assert _grpc(stub, want, "stay", 0) == ("REFUSED" if want.is_slow else "OK")
        if want.is_slow:
            num_compiled = compiler.stats.num_compiled_total
            assert _grpc(stub, want, "stay", 0) == "REFUSED"
            assert compiler.stats.num_compiled_total == num_compiled, "a remembered refusal ran a compile"


def test_the_server_still_serves(server: ServerThread, stub: pb_grpc.InferenceServiceStub) -> None:
    request = pb.GenerateRequest(prompt="Hello", sampling=pb.SamplingParams(max_tokens=3, ignore_eos=True))
    assert list(stub.Generate(request, timeout=30))[-1].finish_reason == pb.FINISH_REASON_LENGTH
    server.wait_idle()
