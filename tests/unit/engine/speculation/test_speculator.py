"""Who drafts and how many: a small batch's decodes, within max_tokens and max_model_len, paused when asked."""

from __future__ import annotations

from infer.engine.request import Request
from infer.engine.sampling_params import SamplingParams
from infer.engine.speculation.ngram import NgramProposer
from infer.engine.speculation.speculator import Speculator
from infer.engine.speculation.state import SpecState
from infer.engine.structured import Constraint


def _request(tokens: list[int], **params: object) -> Request:
    r = Request("r", tokens, SamplingParams(**params), 0.0)  # type: ignore[arg-type]
    r.num_computed_tokens = len(tokens) - 1  # a decode: only the newest token to compute
    return r


def test_speculator_drafts_for_decodes_of_a_small_batch_only() -> None:
    spec = Speculator(NgramProposer(), default_tokens=3, max_num_seqs=2, max_model_len=64)
    a, b = _request([1, 2, 3, 1, 2], max_tokens=10), _request([1, 2, 3, 1, 2], max_tokens=10)
    b.request_id = "b"
    states = [SpecState(3, 3), SpecState(3, 3)]
    assert spec.drafts([a, b], states) == {"r": [3, 1, 2], "b": [3, 1, 2]}
    c = _request([1, 2, 3, 1, 2], max_tokens=10)
    assert spec.drafts([a, b, c], [*states, SpecState(3, 3)]) == {}  # three running: over the limit
    assert spec.drafts([a, b], [states[0], None]) == {"r": [3, 1, 2]}  # b does not speculate
    prefill = _request([1, 2, 3, 1, 2], max_tokens=10)
    prefill.num_computed_tokens = 0
    assert spec.drafts([prefill], [SpecState(3, 3)]) == {}
    assert a.spec is None  # the speculator reads requests and states, and writes neither table nor request


def test_speculator_leaves_room_for_max_tokens_and_max_model_len() -> None:
    spec = Speculator(NgramProposer(), default_tokens=4, max_num_seqs=4, max_model_len=64)
    r = _request([1, 2, 3, 1, 2], max_tokens=3)
    assert spec.drafts([r], [SpecState(4, 4)]) == {"r": [3, 1]}  # 2 drafts + 1 token = max_tokens
    near = Speculator(NgramProposer(), default_tokens=4, max_num_seqs=4, max_model_len=7)
    r = _request([1, 2, 3, 1, 2], max_tokens=30)
    assert near.drafts([r], [SpecState(4, 4)]) == {"r": [3]}  # 5 tokens + 1 draft + 1 = max_model_len


def test_speculator_cap_is_the_request_else_the_engine_and_off_for_constraints() -> None:
    spec = Speculator(NgramProposer(), default_tokens=3, max_num_seqs=4, max_model_len=64)
    assert spec.max_drafts(_request([1])) == 3
    assert spec.max_drafts(_request([1], speculative_tokens=0)) == 0
    assert spec.max_drafts(_request([1], speculative_tokens=7)) == 7
    assert spec.max_drafts(_request([1], speculative_tokens=5, constraint=Constraint.regex("a+"))) == 0
    assert spec.new_state(_request([1], speculative_tokens=0)) is None
    assert spec.new_state(_request([1], speculative_tokens=7)) == SpecState(7, 7)


def test_a_paused_request_drafts_nothing_until_the_pause_ends() -> None:
    spec = Speculator(NgramProposer(), default_tokens=3, max_num_seqs=4, max_model_len=64)
    r = _request([1, 2, 3, 1, 2], max_tokens=10)
    state = SpecState(3, 3, pause_steps=2)
    for expected in ({}, {}, {"r": [3, 1, 2]}):
        assert spec.drafts([r], [state]) == expected
