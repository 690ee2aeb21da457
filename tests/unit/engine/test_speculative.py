"""Drafting and its adaptation: n-gram prompt lookup, how many drafts a request takes, the seeded rewind."""

from __future__ import annotations

import pytest
import torch

from infer.engine.request import Request
from infer.engine.sampling_params import SamplingParams
from infer.engine.speculative import (
    MAX_PAUSE_STEPS,
    NgramDraft,
    SpecState,
    Speculator,
    num_accepted,
    rewind_generator,
)
from infer.engine.structured import Constraint


def test_ngram_proposes_what_followed_the_latest_longest_match() -> None:
    draft = NgramDraft(min_n=1, max_n=3)
    #            0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 4, 5, 9, 2, 3, 7, 1, 2, 3]
    # suffix [1, 2, 3] occurred at 0..2, followed by 4, 5, 9
    assert draft.propose(tokens, 3) == [4, 5, 9]
    assert draft.propose(tokens, 1) == [4]
    # no 3-gram match: the 2-gram [2, 3] latest at 6..7, followed by 7, 1, ...
    assert draft.propose([2, 3, 7, 1, 8, 2, 3], 2) == [7, 1]


def test_ngram_without_a_match_proposes_nothing() -> None:
    draft = NgramDraft(min_n=2, max_n=4)
    assert draft.propose([1, 2, 3, 4, 5], 4) == []
    assert draft.propose([7], 4) == []
    assert draft.propose([1, 2, 1, 2], 0) == []


def test_ngram_matches_whole_tokens_only() -> None:
    # 256 and 1 share bytes with a misaligned window of [1, 256]: only a whole-token match counts
    draft = NgramDraft(min_n=2, max_n=2)
    tokens = [1, 256, 65536, 8, 1, 256]
    assert draft.propose(tokens, 2) == [65536, 8]
    assert draft.propose([0x01000000, 0, 1, 5, 0, 1], 1) == [5]


def test_ngram_looks_only_inside_its_window() -> None:
    draft = NgramDraft(min_n=2, max_n=2, window_tokens=5)
    assert draft.propose([1, 2, 3, 9, 9, 9, 9, 1, 2], 2) == []
    assert NgramDraft(min_n=2, max_n=2).propose([1, 2, 3, 9, 9, 9, 9, 1, 2], 2) == [3, 9]


def test_drafts_run_to_the_end_of_the_sequence_at_most() -> None:
    assert NgramDraft(min_n=1, max_n=1).propose([5, 6, 5], 4) == [6, 5]


def test_num_accepted_is_the_matching_prefix() -> None:
    assert num_accepted([4, 5, 6], [4, 5, 6, 7]) == 3
    assert num_accepted([4, 5, 6], [4, 9, 6, 7]) == 1
    assert num_accepted([4], [8, 1]) == 0
    assert num_accepted([], [3]) == 0


def test_spec_state_grows_while_accepted_and_pauses_when_not() -> None:
    state = SpecState(max_drafts=4, num_drafts=2)
    state.record(2, 2)
    assert state.num_drafts == 3
    state.record(3, 3)
    state.record(4, 4)
    assert state.num_drafts == 4  # capped
    state.record(4, 1)
    assert state.num_drafts == 2  # what was accepted, and one more
    pauses = []
    for _ in range(12):  # nothing accepted: pauses, longer each time
        state.record(state.num_drafts, 0)
        if state.pause_steps:
            pauses.append(state.pause_steps)
            state.pause_steps = 0
    assert pauses == sorted(pauses) and pauses[0] < pauses[-1] <= MAX_PAUSE_STEPS
    assert state.num_drafts == 1


def _request(tokens: list[int], **params: object) -> Request:
    r = Request("r", tokens, SamplingParams(**params), 0.0)  # type: ignore[arg-type]
    r.num_computed_tokens = len(tokens) - 1  # a decode: only the newest token to compute
    return r


def test_speculator_drafts_for_decodes_of_a_small_batch_only() -> None:
    spec = Speculator(NgramDraft(), default_tokens=3, max_num_seqs=2, max_model_len=64)
    a, b = _request([1, 2, 3, 1, 2], max_tokens=10), _request([1, 2, 3, 1, 2], max_tokens=10)
    states = [SpecState(3, 3), SpecState(3, 3)]
    spec.draft([a, b], states)
    assert a.draft_token_ids == [3, 1, 2] and b.draft_token_ids == [3, 1, 2]
    c = _request([1, 2, 3, 1, 2], max_tokens=10)
    spec.draft([a, b, c], [*states, SpecState(3, 3)])  # three running: over the limit
    assert a.draft_token_ids == b.draft_token_ids == c.draft_token_ids == []
    prefill = _request([1, 2, 3, 1, 2], max_tokens=10)
    prefill.num_computed_tokens = 0
    spec.draft([prefill], [SpecState(3, 3)])
    assert prefill.draft_token_ids == []


def test_speculator_leaves_room_for_max_tokens_and_max_model_len() -> None:
    spec = Speculator(NgramDraft(), default_tokens=4, max_num_seqs=4, max_model_len=64)
    r = _request([1, 2, 3, 1, 2], max_tokens=3)
    spec.draft([r], [SpecState(4, 4)])
    assert r.draft_token_ids == [3, 1]  # 2 drafts + 1 token = max_tokens
    near = Speculator(NgramDraft(), default_tokens=4, max_num_seqs=4, max_model_len=7)
    r = _request([1, 2, 3, 1, 2], max_tokens=30)
    near.draft([r], [SpecState(4, 4)])
    assert r.draft_token_ids == [3]  # 5 tokens + 1 draft + 1 = max_model_len


def test_speculator_cap_is_the_request_else_the_engine_and_off_for_constraints() -> None:
    spec = Speculator(NgramDraft(), default_tokens=3, max_num_seqs=4, max_model_len=64)
    assert spec.max_drafts(_request([1])) == 3
    assert spec.max_drafts(_request([1], speculative_tokens=0)) == 0
    assert spec.max_drafts(_request([1], speculative_tokens=7)) == 7
    assert spec.max_drafts(_request([1], speculative_tokens=5, constraint=Constraint.regex("a+"))) == 0


def test_a_paused_request_drafts_nothing_until_the_pause_ends() -> None:
    spec = Speculator(NgramDraft(), default_tokens=3, max_num_seqs=4, max_model_len=64)
    r = _request([1, 2, 3, 1, 2], max_tokens=10)
    state = SpecState(3, 3, pause_steps=2)
    for expected in ([], [], [3, 1, 2]):
        spec.draft([r], [state])
        assert r.draft_token_ids == expected


@pytest.mark.parametrize("num_draws", [0, 1, 3])
def test_rewind_leaves_the_generator_where_plain_sampling_would(num_draws: int) -> None:
    vocab = 50
    plain, spec = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    state = spec.get_state()
    noise = torch.empty(4, vocab)
    for i in range(4):  # the sampler draws one row per position
        noise[i].exponential_(generator=spec)
    rewind_generator(spec, state, num_draws, vocab)
    for _ in range(num_draws):
        torch.empty(vocab).exponential_(generator=plain)
    after = [torch.empty(vocab).exponential_(generator=g) for g in (spec, plain)]
    assert torch.equal(after[0], after[1])


def test_speculative_tokens_out_of_range_name_the_field() -> None:
    with pytest.raises(ValueError, match="speculative_tokens"):
        SamplingParams(speculative_tokens=17)
    with pytest.raises(ValueError, match="speculative_tokens"):
        SamplingParams(speculative_tokens=-1)
