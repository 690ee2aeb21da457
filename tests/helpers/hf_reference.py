"""transformers as the correctness reference: its greedy continuation of a prompt, on the model's device."""

from __future__ import annotations

from typing import Any

import torch


def hf_greedy(model: Any, ids: list[int], num_new: int, ignore_eos: bool = True) -> list[int]:
    """transformers' greedy new tokens for `ids`; `ignore_eos` forbids EOS (`min_new_tokens`), as infer's
    `min_tokens` does, so both produce exactly `num_new` tokens."""
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids], device=device),
            max_new_tokens=num_new,
            min_new_tokens=num_new if ignore_eos else 0,
            do_sample=False,
            pad_token_id=0,
        )
    return [int(t) for t in out[0, len(ids) :]]
