"""The operator's per-request bounds, tighter than the model's: prompt size, prompt tokens and max_tokens.

The size bounds (`InputBounds`) are checked on the proto as it arrived, before any chat template is
rendered or any text tokenized: what a request may cost is bounded before the expensive work. The rest
(a rendered chat's size, prompt tokens, max_tokens) the engine's input processor checks (`InputLimits`).
"""

from __future__ import annotations

from dataclasses import dataclass

from infer.engine import InputLimits, InvalidInput, Refusal

# NOTE: natural text and code run 3-4 characters a token; runs of spaces or '=' up to 64 (SmolLM2's
# tokenizer). A prompt of more than this many characters per token of room is a rare legitimate one.
CHARS_PER_TOKEN = 16


def _setting(name: str) -> str:
    return f"server setting --{name.replace('_', '-')} / INFER_{name.upper()}"


@dataclass(frozen=True)
class InputBounds:
    """RequestLimits resolved for one model. Each check raises InvalidInput naming the field and the limit."""

    max_prompt_tokens: int  # the tighter of max_prompt_tokens and max_model_len less one token
    max_chat_messages: int
    max_prompt_chars: int
    token_limit: str  # what bounds max_prompt_tokens, for messages
    engine: InputLimits  # what the engine's input processor checks

    def check_messages(self, num_messages: int) -> None:
        if num_messages > self.max_chat_messages:
            raise InvalidInput(
                "messages",
                f"{num_messages} messages exceeds max_chat_messages ({self.max_chat_messages}; "
                f"{_setting('max_chat_messages')})",
                Refusal.CONTEXT_LENGTH,
            )

    def check_chars(self, field: str, num_chars: int, what: str = "") -> None:
        """`what` says which characters were counted: the prompt's, a chat's contents, the rendered chat."""
        if num_chars > self.max_prompt_chars:
            raise InvalidInput(
                field,
                f"{what}{num_chars} characters exceeds max_prompt_chars ({self.max_prompt_chars}; "
                f"{_setting('max_prompt_chars')})",
                Refusal.CONTEXT_LENGTH,
            )

    def check_tokens(self, num_tokens: int) -> None:
        if num_tokens > self.max_prompt_tokens:
            raise InvalidInput("prompt", f"{num_tokens} tokens exceeds {self.token_limit}", Refusal.CONTEXT_LENGTH)


@dataclass(frozen=True)
class RequestLimits:
    max_prompt_tokens: int | None = None  # None: max_model_len is the only bound
    max_output_tokens: int | None = None  # the largest max_tokens a request may ask for
    max_chat_messages: int | None = None  # None: the prompt's token bound (each message renders to >= 1 token)
    max_prompt_chars: int | None = None  # None: CHARS_PER_TOKEN x the prompt's token bound
    max_pending_long_prompts: int = 64  # long prompts waiting for their tokenizing thread (prompt_workers.py)

    def __post_init__(self) -> None:
        names = ("max_prompt_tokens", "max_output_tokens", "max_chat_messages", "max_prompt_chars",
                 "max_pending_long_prompts")  # fmt: skip
        for name in names:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}: must be >= 1")

    def bounds(self, max_model_len: int) -> InputBounds:
        """The size bounds for a model of `max_model_len`, the unset ones derived from its token bound."""
        room = max_model_len - 1  # one token to generate
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < room:
            num_tokens = self.max_prompt_tokens
            token_limit = f"max_prompt_tokens ({num_tokens}; {_setting('max_prompt_tokens')})"
        else:
            num_tokens, token_limit = room, f"max_model_len ({max_model_len}) less one token to generate"
        max_prompt_chars = self.max_prompt_chars or CHARS_PER_TOKEN * num_tokens
        names = ("max_prompt_tokens", "max_output_tokens", "max_prompt_chars")
        engine = InputLimits(self.max_prompt_tokens, self.max_output_tokens, max_prompt_chars,
                             settings={name: _setting(name) for name in names})  # fmt: skip
        return InputBounds(
            max_prompt_tokens=num_tokens,
            max_chat_messages=self.max_chat_messages or num_tokens,
            max_prompt_chars=max_prompt_chars,
            token_limit=token_limit,
            engine=engine,
        )
