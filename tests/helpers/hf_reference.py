"""transformers as the correctness reference: its greedy continuation of a prompt, on the model's device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def hf_greedy(
    model: Any, ids: list[int], num_new: int, ignore_eos: bool = True, eos_token_ids: Sequence[int] | None = None
) -> list[int]:
    """transformers' greedy new tokens for `ids`; `ignore_eos` forbids EOS (`min_new_tokens`), as infer's
    `min_tokens` does, so both produce exactly `num_new` tokens. `eos_token_ids`: the ids that count as EOS
    (infer's end-of-generation ids, so that both forbid the same; None: the model's generation config's)."""
    device = next(model.parameters()).device
    eos = {} if eos_token_ids is None else {"eos_token_id": list(eos_token_ids)}
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids], device=device),
            max_new_tokens=num_new,
            min_new_tokens=num_new if ignore_eos else 0,
            do_sample=False,
            pad_token_id=0,
            **eos,
        )
    return [int(t) for t in out[0, len(ids) :]]
