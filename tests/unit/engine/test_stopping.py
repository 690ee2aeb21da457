"""The stop decision on a request's newest token: stop tokens, eos, stop strings, lengths, min_tokens."""

from __future__ import annotations

import pytest

from infer.engine.request import FinishReason, Request
from infer.engine.sampling_params import SamplingParams
from infer.engine.stopping import banned_token_ids, finish_reason, is_stop_token

EOS = frozenset({2})


def _request(num_prompt: int, outputs: list[int], **params: object) -> Request:
    r = Request("r", list(range(10, 10 + num_prompt)), SamplingParams(**params), 0.0)  # type: ignore[arg-type]
    r.output_token_ids = outputs
    return r


@pytest.mark.parametrize(
    ("token_id", "params", "expected"),
    [
        (2, {}, True),  # eos
        (2, {"ignore_eos": True}, False),
        (7, {"stop_token_ids": (7,)}, True),
        (7, {"stop_token_ids": (7,), "ignore_eos": True}, True),  # ignore_eos never ignores stop_token_ids
        (5, {}, False),
    ],
)
def test_is_stop_token(token_id: int, params: dict[str, object], expected: bool) -> None:
    assert is_stop_token(token_id, SamplingParams(**params), EOS) is expected  # type: ignore[arg-type]


def test_a_stop_wins_over_length_on_the_same_token() -> None:
    r = _request(3, [5, 2], max_tokens=2)
    assert finish_reason(r, 2, False, EOS, 100) is FinishReason.STOP


def test_a_stop_string_stops() -> None:
    assert finish_reason(_request(3, [5], max_tokens=9), 5, True, EOS, 100) is FinishReason.STOP


@pytest.mark.parametrize(
    ("num_prompt", "outputs", "max_tokens", "max_model_len", "expected"),
    [
        (3, [5, 6], 2, 100, FinishReason.LENGTH),  # max_tokens reached
        (3, [5], 2, 100, None),
        (8, [5, 6], 9, 10, FinishReason.LENGTH),  # the context is full
        (8, [5], 9, 10, None),
    ],
)
def test_lengths(
    num_prompt: int, outputs: list[int], max_tokens: int, max_model_len: int, expected: FinishReason | None
) -> None:
    r = _request(num_prompt, outputs, max_tokens=max_tokens)
    assert finish_reason(r, outputs[-1], False, EOS, max_model_len) is expected


def test_min_tokens_bans_every_stop_token_until_reached() -> None:
    assert banned_token_ids(_request(3, [5], min_tokens=2, stop_token_ids=(7,)), EOS) == (2, 7)
    assert banned_token_ids(_request(3, [5, 6], min_tokens=2, stop_token_ids=(7,)), EOS) == ()
    assert banned_token_ids(_request(3, [], stop_token_ids=(7,)), EOS) == ()
