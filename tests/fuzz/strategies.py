"""Hostile and sloppy inputs: boundary numbers, NaN/inf, empty and long strings, unknown fields."""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

from infer.api import pb

INT32 = st.one_of(st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31), 255, 256]), st.integers(-(2**31), 2**31 - 1))
INT64 = st.one_of(st.sampled_from([0, -1, 2**63 - 1, -(2**63)]), st.integers(-(2**63), 2**63 - 1))
FLOATS = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e-300, 1e300, float("nan"), float("inf"), float("-inf")]),
    st.floats(allow_nan=True, allow_infinity=True),
)
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)  # protobuf strings are valid Unicode
LONG_TEXT = st.one_of(TEXT, st.text(st.characters(exclude_categories=["Cs"]), min_size=500, max_size=3000))
TOKEN_IDS = st.lists(st.one_of(st.integers(0, 400), INT32), max_size=40)
ROLES = st.sampled_from(["user", "user", "system", "developer", "assistant", "tool", "", "root", "USER"])


VALID = {
    "max_tokens": st.integers(1, 8), "top_k": st.integers(0, 50), "min_tokens": st.integers(0, 4),
    "logprobs": st.integers(0, 20), "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1),
    "min_p": st.floats(0, 1), "repetition_penalty": st.floats(0.5, 2), "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2), "seed": st.integers(0, 2**63 - 1), "speculative_tokens": st.integers(0, 16),
}  # fmt: skip
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
HOSTILE = {name: INT64 if name == "seed" else FLOATS if name in _FLOAT_FIELDS else INT32 for name in VALID}


@st.composite
def sampling(draw: st.DrawFn, hostile: bool) -> pb.SamplingParams:
    """Each field unset or valid, or (hostile) also out of range, NaN, infinite."""
    params = pb.SamplingParams()
    for name, valid in VALID.items():
        mode = draw(st.sampled_from(["unset", "valid", "hostile"] if hostile else ["unset", "valid"]))
        if mode != "unset":
            setattr(params, name, draw(valid if mode == "valid" else HOSTILE[name]))
    if not hostile and params.HasField("min_tokens"):
        params.min_tokens = min(params.min_tokens, params.max_tokens if params.HasField("max_tokens") else 16)
    stop_ids = st.integers(0, 300) if not hostile else st.one_of(st.integers(0, 300), INT32)
    params.stop.extend(draw(st.lists(TEXT.filter(bool), max_size=4) if not hostile else st.lists(TEXT, max_size=20)))
    params.stop_token_ids.extend(draw(st.lists(stop_ids, max_size=4)))
    params.ignore_eos = draw(st.booleans())
    if draw(st.booleans()):
        params.skip_special_tokens = draw(st.booleans())
    return params


@st.composite
def generate_requests(draw: st.DrawFn, hostile: bool) -> pb.GenerateRequest:
    """Hostile: anything. Not hostile: a request the server must serve (short prompts, valid values)."""
    ids = st.from_regex(r"[a-z0-9-]{1,20}", fullmatch=True)
    request_id = draw(st.one_of(st.just(""), ids, TEXT) if hostile else st.one_of(st.just(""), ids))
    request = pb.GenerateRequest(request_id=request_id, sampling=draw(sampling(hostile)))
    kind = draw(st.sampled_from(["prompt", "token_ids", "messages"] + (["none"] if hostile else [])))
    if kind == "prompt":
        request.prompt = draw(LONG_TEXT if hostile else TEXT.filter(bool))
    elif kind == "token_ids":
        request.token_ids.ids.extend(
            draw(TOKEN_IDS if hostile else st.lists(st.integers(0, 300), min_size=1, max_size=40))
        )
    elif kind == "messages":
        roles = ROLES if hostile else st.sampled_from(["system", "developer", "user", "assistant"])
        turns = st.lists(st.tuples(roles, LONG_TEXT if hostile else TEXT), min_size=0 if hostile else 1, max_size=4)
        for role, content in draw(turns):
            request.messages.messages.append(pb.ChatMessage(role=role, content=content))
    return request


JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), INT64, st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20)
)  # JSON has no NaN; a lone surrogate is valid JSON text, so st.text() keeps them
JSON = st.recursive(
    JSON_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
)
SAMPLING_FIELDS = ["temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                   "frequency_penalty", "seed", "min_tokens", "ignore_eos", "skip_special_tokens", "n", "stop",
                   "stop_token_ids", "stream", "stream_options", "logit_bias", "user", "max_tokens",
                   "speculative_tokens"]  # fmt: skip


@st.composite
def _fields(draw: st.DrawFn, names: list[str]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(names), max_size=4, unique=True)):
        plausible = st.one_of(st.integers(0, 4), st.sampled_from([0.0, 0.5, 1.0, True, False, None]))
        body[name] = draw(st.one_of(plausible, plausible, JSON))
    body |= draw(st.dictionaries(st.text(min_size=1, max_size=12), JSON, max_size=2))  # unknown fields
    return body


@st.composite
def completion_bodies(draw: st.DrawFn, model: str) -> dict[str, Any]:
    prompt = draw(st.one_of(TEXT, st.text(max_size=20), st.lists(TEXT, max_size=3), TOKEN_IDS, JSON))
    body = {"model": draw(st.sampled_from([model, model, "other"])), "prompt": prompt}
    return body | draw(_fields([*SAMPLING_FIELDS, "logprobs", "echo", "best_of", "suffix"]))


@st.composite
def chat_bodies(draw: st.DrawFn, model: str) -> dict[str, Any]:
    message = st.fixed_dictionaries(
        {"role": ROLES, "content": st.one_of(st.text(max_size=40), st.text(max_size=40), st.none(), JSON)},
        optional={"name": TEXT, "refusal": st.none(), "tool_calls": JSON},
    )
    body = {"model": draw(st.sampled_from([model, model, "other"])), "messages": draw(st.lists(message, max_size=4))}
    names = [*SAMPLING_FIELDS, "max_completion_tokens", "logprobs", "top_logprobs", "response_format", "tools"]
    return body | draw(_fields(names))


def examples(ci: int, fuzz: int) -> settings:
    """Examples for a costly test: `ci` in the `ci` profile (make test), growing with the profile's count up to
    `fuzz` (make fuzz: each test stays within pytest's per-test timeout on a busy 2-core machine)."""
    return settings(max_examples=min(fuzz, max(ci, settings.default.max_examples * ci // 60)))
