"""A request's drafting state (how many drafts, pauses at low acceptance) and the bound on drafts."""

from __future__ import annotations

import pytest

from infer.engine.sampling_params import SamplingParams
from infer.engine.speculation.state import MAX_PAUSE_STEPS, SpecState


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


def test_speculative_tokens_out_of_range_name_the_field() -> None:
    with pytest.raises(ValueError, match="speculative_tokens"):
        SamplingParams(speculative_tokens=17)
    with pytest.raises(ValueError, match="speculative_tokens"):
        SamplingParams(speculative_tokens=-1)
