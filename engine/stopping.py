"""When a request stops: pure decisions on its newest token, kept apart from the step loop."""

from __future__ import annotations

from collections.abc import Set

from infer.engine.request import FinishReason, Request
from infer.engine.sampling_params import SamplingParams


def is_stop_token(token_id: int, params: SamplingParams, eos_token_ids: Set[int]) -> bool:
    """A stop token id, or an eos the request does not ignore: it ends the request and adds no text."""
    return token_id in params.stop_token_ids or (token_id in eos_token_ids and not params.ignore_eos)


def finish_reason(
    request: Request,
    token_id: int,
    hit_stop_string: bool,
    eos_token_ids: Set[int],
    max_model_len: int,
    num_output_tokens: int | None = None,
) -> FinishReason | None:
    """Why `request` ends now that `token_id` is its newest output token (its `num_output_tokens`-th, by default
    its last), or None if it goes on."""
    if is_stop_token(token_id, request.params, eos_token_ids) or hit_stop_string:
        return FinishReason.STOP
    num_output = request.num_output_tokens if num_output_tokens is None else num_output_tokens
    max_tokens = request.params.max_tokens  # None: up to max_model_len
    if (max_tokens is not None and num_output >= max_tokens) or request.num_prompt_tokens + num_output >= max_model_len:
        return FinishReason.LENGTH
    return None


def banned_token_ids(request: Request, eos_token_ids: Set[int], num_output: int | None = None) -> tuple[int, ...]:
    """Tokens that may not be sampled yet: every stop token until min_tokens are out (after `num_output` output
    tokens, by default the request's)."""
    p = request.params
    if (request.num_output_tokens if num_output is None else num_output) >= p.min_tokens:
        return ()
    return tuple(sorted(set(eos_token_ids) | set(p.stop_token_ids)))
