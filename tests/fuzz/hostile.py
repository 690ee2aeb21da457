"""Inputs of the classes issue 18 found: JSON nested thousands deep, header bytes gRPC cannot carry, extreme floats,
huge message lists, floods of unknown keys. HTTP bodies come as raw bytes: json.dumps cannot write most of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from infer.api import pb

FLOAT_FIELDS = ["temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"]
# finite but numerically meaningless: subnormals, past float32's range, float64's ends
EXTREME_FLOATS = st.sampled_from([1e-300, -1e-300, 5e-324, -5e-324, 1e-320, 1.4e-45, 1e-45, 1.17e-38, 1e-38, 3.4e38,
                                  3.5e38, 1e300, 1.7976931348623157e308, -1.7976931348623157e308, -0.0])  # fmt: skip
# number tokens json.dumps never writes: Python's json reads the first five, the rest are no JSON at all
RAW_NUMBERS = st.sampled_from(["1e999", "-1e999", "NaN", "Infinity", "-Infinity", "1e-400", "1" + "0" * 400, "-0",
                               "0." + "0" * 50 + "1", "1.5e+308", "nan", "+1", ".5"])  # fmt: skip
DEPTHS = st.sampled_from([64, 500, 998, 999, 1000, 1001, 3000, 10_000, 100_000])
FLOOD_SIZES = st.sampled_from([100, 1000, 10_000, 50_000])
MESSAGE_COUNTS = st.sampled_from([500, 5000, 30_000])
# what h11 lets through in a header value: visible ASCII, obs-text (bytes 0x80-0xff), inner spaces and tabs
HEADER_BYTES = st.lists(
    st.one_of(st.integers(0x21, 0x7E), st.integers(0x80, 0xFF), st.sampled_from([0x20, 0x09])), min_size=0, max_size=80
).map(lambda b: bytes(b).strip(b" \t") or b"x")
HEADER_NAMES = ["authorization", "traceparent", "tracestate", "x-request-id", "content-type", "origin", "host",
                "user-agent", "accept"]  # fmt: skip
METADATA_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=200)  # what gRPC carries


@dataclass(frozen=True)
class RawBody:
    """An HTTP body that JSON encoders would not write; `kind` labels the class for hypothesis' statistics."""

    path: str
    body: bytes
    kind: str
    stream: bool


def _raw(body: dict[str, Any], holes: dict[str, str]) -> bytes:
    """`body` as JSON with each `"<hole:NAME>"` string replaced by the raw text holes[NAME]."""
    text = json.dumps(body)
    for name, raw in holes.items():
        text = text.replace(json.dumps(f"<hole:{name}>"), raw)
    return text.encode()


def _nested(draw: st.DrawFn) -> str:
    depth = draw(DEPTHS)
    if draw(st.booleans()):
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def _base(draw: st.DrawFn, model: str) -> tuple[str, dict[str, Any]]:
    stream = draw(st.booleans())
    if draw(st.booleans()):
        return "/v1/completions", {"model": model, "prompt": "Hello", "max_tokens": 3, "stream": stream}
    messages = [{"role": "user", "content": "Hello"}]
    return "/v1/chat/completions", {"model": model, "messages": messages, "max_tokens": 3, "stream": stream}


@st.composite
def raw_bodies(draw: st.DrawFn, model: str) -> RawBody:
    """One hostile class per body, on either endpoint, streamed or not."""
    path, body = _base(draw, model)
    kind = draw(st.sampled_from(["deep", "flood", "huge_messages", "extreme_floats", "raw_numbers"]))
    holes: dict[str, str] = {}
    if kind == "deep":
        where = draw(st.sampled_from(["extra", "prompt", "stop", "temperature", "content", "body"]))
        if where == "body":
            return RawBody(path, _nested(draw).encode(), f"deep:{where}", bool(body["stream"]))
        target = body["messages"][0] if where == "content" and "messages" in body else body
        target["content" if target is not body else where] = "<hole:deep>"
        holes["deep"] = _nested(draw)
    elif kind == "flood":
        num_keys = draw(FLOOD_SIZES)
        inside_message = "messages" in body and draw(st.booleans())
        target = body["messages"][0] if inside_message else body
        target.update({f"f{draw(st.integers(0, 10**6))}-{i}": i for i in range(num_keys)})
    elif kind == "huge_messages":
        num = draw(MESSAGE_COUNTS)
        content = draw(st.sampled_from(["", "x", "Hello there"]))
        path = "/v1/chat/completions"
        messages = [{"role": "user", "content": content}] * num
        body = {k: v for k, v in body.items() if k != "prompt"} | {"messages": messages}
        if draw(st.booleans()):
            del body["max_tokens"]  # the model server fills in what the context leaves
    elif kind == "extreme_floats":
        body["logprobs"] = 1 if path == "/v1/completions" else True
        for name in draw(st.lists(st.sampled_from(FLOAT_FIELDS), min_size=1, unique=True)):
            body[name] = draw(EXTREME_FLOATS)
    else:
        names = st.lists(st.sampled_from([*FLOAT_FIELDS, "max_tokens", "n", "seed"]), min_size=1, unique=True)
        for name in draw(names):
            body[name] = f"<hole:{name}>"
            holes[name] = draw(RAW_NUMBERS)
    return RawBody(path, _raw(body, holes), kind, bool(body.get("stream")))


@st.composite
def hostile_headers(draw: st.DrawFn) -> dict[bytes, bytes]:
    """A few headers with bytes gRPC metadata cannot carry (tabs, bytes past ASCII) or values that make no sense."""
    names = draw(st.lists(st.sampled_from(HEADER_NAMES), min_size=1, max_size=4, unique=True))
    return {name.encode(): draw(HEADER_BYTES) for name in names}


@st.composite
def grpc_metadata(draw: st.DrawFn) -> list[tuple[str, str]]:
    """Trace context and keys gRPC can carry but that mean nothing: the server must ignore or refuse them."""
    names = draw(st.lists(st.sampled_from(["traceparent", "tracestate", "authorization", "x-request-id"]), unique=True))
    return [(name, draw(METADATA_TEXT).strip() or "x") for name in names]


@st.composite
def huge_message_requests(draw: st.DrawFn) -> pb.GenerateRequest:
    """A chat of thousands of (mostly empty) messages."""
    num = draw(MESSAGE_COUNTS)
    content = draw(st.sampled_from(["", "x", "Hello there"]))
    messages = [pb.ChatMessage(role=draw(st.sampled_from(["user", "assistant"])), content=content)] * num
    sampling = pb.SamplingParams(max_tokens=draw(st.integers(1, 4)))
    return pb.GenerateRequest(messages=pb.ChatMessages(messages=messages), sampling=sampling)


@st.composite
def extreme_float_requests(draw: st.DrawFn) -> pb.GenerateRequest:
    """Sampling floats that are finite but underflow (or overflow) float32, with logprobs asked for."""
    sampling = pb.SamplingParams(max_tokens=draw(st.integers(1, 6)), logprobs=draw(st.integers(0, 3)))
    for name in draw(st.lists(st.sampled_from(FLOAT_FIELDS), min_size=1, unique=True)):
        setattr(sampling, name, draw(EXTREME_FLOATS))
    return pb.GenerateRequest(prompt=draw(st.sampled_from(["Hello", "The capital of France is"])), sampling=sampling)
