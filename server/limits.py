"""The operator's per-request bounds, tighter than the model's: prompt tokens and max_tokens."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestLimits:
    max_prompt_tokens: int | None = None  # None: max_model_len is the only bound
    max_output_tokens: int | None = None  # the largest max_tokens a request may ask for

    def check(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """ValueError naming the field, the limit and its setting (the servicer's INVALID_ARGUMENT)."""
        if self.max_prompt_tokens is not None and num_prompt_tokens > self.max_prompt_tokens:
            raise ValueError(
                f"prompt: {num_prompt_tokens} tokens exceeds max_prompt_tokens ({self.max_prompt_tokens}; "
                "server setting --max-prompt-tokens / INFER_MAX_PROMPT_TOKENS)"
            )
        if self.max_output_tokens is not None and max_tokens > self.max_output_tokens:
            raise ValueError(
                f"sampling.max_tokens: {max_tokens} exceeds max_output_tokens ({self.max_output_tokens}; "
                "server setting --max-output-tokens / INFER_MAX_OUTPUT_TOKENS)"
            )
