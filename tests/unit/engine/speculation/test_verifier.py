"""Verifying drafts: the accepted prefix and the seeded generator's rewind."""

from __future__ import annotations

import pytest
import torch

from infer.engine.speculation.verifier import num_accepted, rewind_generator


def test_num_accepted_is_the_matching_prefix() -> None:
    assert num_accepted([4, 5, 6], [4, 5, 6, 7]) == 3
    assert num_accepted([4, 5, 6], [4, 9, 6, 7]) == 1
    assert num_accepted([4], [8, 1]) == 0
    assert num_accepted([], [3]) == 0


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
