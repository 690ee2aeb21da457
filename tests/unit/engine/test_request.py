"""Request: slices of prompt + output tokens."""

from __future__ import annotations

from infer.engine.request import Request
from infer.engine.sampling_params import SamplingParams


def test_token_slice_equals_slicing_all_tokens() -> None:
    req = Request("r", [1, 2, 3, 4], SamplingParams(), 0.0, output_token_ids=[5, 6, 7])
    for start in range(8):
        for end in range(start, 8):
            assert req.token_slice(start, end) == req.all_token_ids[start:end]
