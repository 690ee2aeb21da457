"""Structured output and tool calls over gRPC: regex, choice and JSON schema on the default model, field names
in the errors, and tool calls parsed out of a streamed output."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import pytest

from infer.api import pb, pb_grpc
from infer.engine.structured import compiler as structured
from tests.integration.grpc_helpers import ServerThread, running_fake_server

PHONE = r"\d{3}-\d{4}"
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}  # fmt: skip
SMALL = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]}
WEATHER = pb.Tool(name="get_weather", description="The weather in a city", parameters=json.dumps(
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
     "additionalProperties": False}))  # fmt: skip


def chat(text: str) -> pb.ChatMessages:
    return pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=text)])


def generate(stub: pb_grpc.InferenceServiceStub, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    return list(stub.Generate(request, timeout=120))


def text_of(responses: list[pb.GenerateResponse]) -> str:
    return "".join(r.text for r in responses)


def invalid_argument(stub: pb_grpc.InferenceServiceStub, request: pb.GenerateRequest) -> str:
    with pytest.raises(grpc.RpcError) as info:
        generate(stub, request)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    return str(info.value.details())


def test_regex_and_choice(grpc_server: ServerThread, stub: pb_grpc.InferenceServiceStub) -> None:
    sampling = pb.SamplingParams(max_tokens=24, temperature=1.0, seed=1, regex=PHONE)
    responses = generate(stub, pb.GenerateRequest(messages=chat("Give me a phone number."), sampling=sampling))
    assert re.fullmatch(PHONE, text_of(responses))
    assert responses[-1].finish_reason == pb.FINISH_REASON_STOP
    choices = ["yes", "no", "maybe"]
    sampling = pb.SamplingParams(max_tokens=8, temperature=0.0, choice=pb.Choices(choices=choices))
    responses = generate(stub, pb.GenerateRequest(messages=chat("Is Paris in France?"), sampling=sampling))
    assert text_of(responses) in choices
    assert responses[-1].finish_reason == pb.FINISH_REASON_STOP
    grpc_server.wait_idle()


def test_json_schema(grpc_server: ServerThread, stub: pb_grpc.InferenceServiceStub) -> None:
    sampling = pb.SamplingParams(max_tokens=40, temperature=1.0, seed=3, json_schema=json.dumps(PERSON))
    responses = generate(stub, pb.GenerateRequest(messages=chat("Describe a person as JSON."), sampling=sampling))
    jsonschema.validate(json.loads(text_of(responses)), PERSON)
    assert responses[-1].finish_reason == pb.FINISH_REASON_STOP
    grpc_server.wait_idle()


@pytest.fixture(scope="module")
def fake_server() -> Iterator[ServerThread]:
    """Where the model does not matter: the fake engine (tests/helpers/fake_engine.py)."""
    with running_fake_server(max_model_len=1024, num_blocks=128) as server:
        yield server


@pytest.fixture
def fake_stub(fake_server: ServerThread) -> Iterator[pb_grpc.InferenceServiceStub]:
    with grpc.insecure_channel(fake_server.address) as channel:
        yield pb_grpc.InferenceServiceStub(channel)


@pytest.mark.parametrize(
    "sampling",
    [
        pb.SamplingParams(max_tokens=1, json_object=pb.JsonObject()),
        pb.SamplingParams(max_tokens=30, regex="[A-Za-z ]{1,20}", stop=["H"]),  # the fake model says "Hello"
    ],
)
def test_a_constrained_request_that_ends_on_its_first_token_leaves_the_server_serving(
    fake_server: ServerThread, fake_stub: pb_grpc.InferenceServiceStub, sampling: pb.SamplingParams
) -> None:
    ended = generate(fake_stub, pb.GenerateRequest(prompt="Hi", sampling=sampling))
    assert ended[-1].finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)
    after = generate(fake_stub, pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(max_tokens=2)))
    assert after[-1].finish_reason == pb.FINISH_REASON_LENGTH  # every later step raised KeyError: "engine step failed"


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        (pb.SamplingParams(regex="(("), "sampling.regex: does not compile: Regex parsing error"),
        (pb.SamplingParams(json_schema='{"type": "objekt"}'), "sampling.json_schema: does not compile: Unsupported"),
        (pb.SamplingParams(json_schema="{"), "sampling.json_schema: not valid JSON"),
        (pb.SamplingParams(grammar="root ::= b"), "sampling.grammar: does not compile: EBNF parser error"),
        (pb.SamplingParams(choice=pb.Choices(choices=["a", ""])), "sampling.choice: must be non-empty strings"),
    ],
)
def test_a_constraint_that_does_not_compile_is_invalid_argument(
    fake_server: ServerThread, fake_stub: pb_grpc.InferenceServiceStub, sampling: pb.SamplingParams, message: str
) -> None:
    assert invalid_argument(fake_stub, pb.GenerateRequest(prompt="Hi", sampling=sampling)).startswith(message)
    fake_server.wait_idle()


def test_tool_errors_name_the_field(fake_stub: pb_grpc.InferenceServiceStub) -> None:
    stub = fake_stub

    def request(**kw: object) -> pb.GenerateRequest:
        return pb.GenerateRequest(messages=chat("Weather in Paris?"), **kw)  # type: ignore[arg-type]

    bad_schema = pb.Tool(name="f", parameters='{"type": "objekt"}')
    assert invalid_argument(stub, request(tools=[bad_schema], tool_choice=pb.ToolChoice(function="f"))).startswith(
        "tools[0].parameters: does not compile: Unsupported type"
    )
    assert invalid_argument(stub, request(tools=[pb.Tool(name="a b")])).startswith("tools[0].name: ")
    assert invalid_argument(stub, request(tools=[WEATHER], tool_choice=pb.ToolChoice(function="nope"))).startswith(
        "tool_choice: 'nope' is not one of the tools"
    )
    assert invalid_argument(stub, pb.GenerateRequest(prompt="x", tools=[WEATHER])).startswith("tools: only a chat")
    both = request(tools=[WEATHER], tool_choice=pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED),
                   sampling=pb.SamplingParams(regex="a"))  # fmt: skip
    assert invalid_argument(stub, both).startswith("tool_choice: required constrains the output")


@pytest.mark.parametrize(
    "choice",
    [pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_AUTO), pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_NONE),
     pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED), pb.ToolChoice(function="get_weather"),
     pb.ToolChoice(function="f")],
    ids=["auto", "none", "required", "named-other", "named-it"],
)  # fmt: skip
@pytest.mark.parametrize(
    ("parameters", "message"),
    [({"type": "objekt"}, "does not compile: Unsupported type"),
     ({"type": "object", "properties": {"a": {"not": {}}}}, "does not compile: #/properties/a: not is not enforced"),
     ({"$ref": "http://169.254.169.254/s"}, "does not compile: #: $ref 'http://169.254.169.254/s' is a remote")],
    ids=["unsupported-type", "not", "remote-ref"],
)  # fmt: skip
def test_every_tools_parameters_are_checked_whatever_the_tool_choice(
    fake_server: ServerThread, fake_stub: pb_grpc.InferenceServiceStub, choice: pb.ToolChoice,
    parameters: dict[str, Any], message: str,
) -> None:  # fmt: skip
    tools = [WEATHER, pb.Tool(name="f", parameters=json.dumps(parameters))]
    request = pb.GenerateRequest(messages=chat("Weather in Paris?"), tools=tools, tool_choice=choice,
                                 sampling=pb.SamplingParams(max_tokens=2))  # fmt: skip
    assert invalid_argument(fake_stub, request).startswith(f"tools[1].parameters: {message}")
    fake_server.wait_idle()


def calls_of(responses: list[pb.GenerateResponse]) -> list[tuple[str, str, dict[str, object]]]:
    """(id, name, arguments) per call, merged from the deltas."""
    merged: dict[int, list[str]] = {}
    for r in responses:
        for d in r.tool_calls:
            merged.setdefault(d.index, [d.id, d.name, ""])[2] += d.arguments
    return [(i, n, json.loads(a)) for i, n, a in (merged[k] for k in sorted(merged))]


def test_required_and_named_tool_calls(grpc_server: ServerThread, stub: pb_grpc.InferenceServiceStub) -> None:
    for choice in (pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED), pb.ToolChoice(function="get_weather")):
        sampling = pb.SamplingParams(max_tokens=40, temperature=0.0)
        messages = chat("What is the weather in Paris?")
        request = pb.GenerateRequest(messages=messages, tools=[WEATHER], tool_choice=choice, sampling=sampling)
        responses = generate(stub, request)
        calls = calls_of(responses)
        assert calls and all(name == "get_weather" and call_id.startswith("call_") for call_id, name, _ in calls)
        jsonschema.validate(calls[0][2], json.loads(WEATHER.parameters))
        assert text_of(responses) == ""
        assert responses[-1].finish_reason == pb.FINISH_REASON_TOOL_CALLS
    grpc_server.wait_idle()


def test_auto_tool_calls_are_parsed_from_the_streamed_output(
    fake_server: ServerThread, fake_stub: pb_grpc.InferenceServiceStub
) -> None:
    """The fake model writes a call in the format of templates without tools (json_list): it comes out as one."""
    tools = [WEATHER]
    messages = chat("Weather in Paris?")
    num_prompt = len(fake_stub.Tokenize(pb.TokenizeRequest(messages=messages, tools=tools)).token_ids)
    reply = 'Let me look.\n<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>'
    runner = fake_server.engine.core.runner
    text_ids = runner.text_ids  # type: ignore[attr-defined]
    runner.text_ids = [0] * num_prompt + fake_server.engine.tokenizer.encode(reply)  # type: ignore[attr-defined]
    try:
        sampling = pb.SamplingParams(max_tokens=200, temperature=0.0)
        responses = generate(fake_stub, pb.GenerateRequest(messages=messages, tools=tools, sampling=sampling))
    finally:
        runner.text_ids = text_ids  # type: ignore[attr-defined]
    assert text_of(responses) == "Let me look."
    assert [(n, a) for _, n, a in calls_of(responses)] == [("get_weather", {"city": "Paris"})]
    assert responses[-1].finish_reason == pb.FINISH_REASON_TOOL_CALLS
    assert sum(len(r.token_ids) for r in responses) == responses[-1].usage.completion_tokens  # every token counted


def test_infer_client_generate_takes_a_schema_file_or_a_regex(fake_server: ServerThread, tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SMALL))
    cmd = [sys.executable, "-m", "infer", "client", "--address", fake_server.address, "generate", "Hello"]
    for flags, check in [
        (["--json-schema", str(schema)], lambda out: jsonschema.validate(json.loads(out), SMALL) is None),
        (["--regex", "[0-9]{3}"], lambda out: re.fullmatch("[0-9]{3}", out)),
    ]:
        result = subprocess.run([*cmd, "--max-tokens", "30", *flags], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert check(result.stdout.removesuffix("\n")), result.stdout
    missing = subprocess.run([*cmd, "--json-schema", str(tmp_path / "nope.json")], capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    assert missing.returncode == 1 and "--json-schema: cannot read" in missing.stderr


def test_a_slow_compile_does_not_stall_other_streams(
    fake_server: ServerThread, fake_stub: pb_grpc.InferenceServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    compile_one = structured._compile

    def slow(backend: Any, constraint: Any) -> Any:
        assert gate.wait(30)
        return compile_one(backend, constraint)

    monkeypatch.setattr(structured, "_compile", slow)
    slow_request = pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(max_tokens=8, regex="[0-9]{4}"))
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(generate, fake_stub, slow_request)
        free = generate(fake_stub, pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(max_tokens=8)))
        assert free[-1].finish_reason == pb.FINISH_REASON_LENGTH
        assert not waiting.done()  # still compiling while the other stream came and went
        gate.set()
        assert re.fullmatch("[0-9]{4}", text_of(waiting.result(timeout=60)))
    fake_server.wait_idle()


def test_a_full_compile_queue_is_resource_exhausted_and_callers_that_left_drop_their_compiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str] = []
    gate = threading.Event()
    compile_one = structured._compile

    def gated(backend: Any, constraint: Any) -> Any:
        seen.append(constraint.text)
        assert gate.wait(30)
        return compile_one(backend, constraint)

    def request(pattern: str) -> pb.GenerateRequest:
        return pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(max_tokens=4, regex=pattern))

    monkeypatch.setattr(structured, "_compile", gated)
    with (
        running_fake_server(max_pending_grammars=3) as server,
        grpc.insecure_channel(server.address) as channel,
        ThreadPoolExecutor(3) as pool,
    ):
        stub = pb_grpc.InferenceServiceStub(channel)
        compiler = server.engine.core.structured.compiler
        busy = [pool.submit(generate, stub, request(f"[0-9]{{{i + 1}}}")) for i in range(2)]
        while len(seen) < 2:  # both compile threads are taken
            gate.wait(0.01)
        slow = " ".join('("a" | "bc" | [0-9])' for _ in range(3000))  # ~1.5 s of CPU on the fake model's vocabulary
        late = pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(max_tokens=4, grammar=f"root ::= {slow}"))
        with pytest.raises(grpc.RpcError) as left:
            list(stub.Generate(late, timeout=0.5))  # its caller leaves while its trial runs
        assert left.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        while compiler.stats.num_pending > 2:  # given up: its trial killed
            gate.wait(0.01)
        queued = pool.submit(generate, stub, request("y+"))
        while compiler.stats.num_pending < 3:
            gate.wait(0.01)
        with pytest.raises(grpc.RpcError) as full:
            generate(stub, request("z+"))
        assert full.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_pending_grammars" in str(full.value.details())
        gate.set()
        ended = {pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH}
        assert all(f.result(timeout=60)[-1].finish_reason in ended for f in [*busy, queued])
        assert not any(text.startswith("root ::=") for text in seen)  # dropped when its only caller left
        server.wait_idle()
