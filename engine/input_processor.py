"""The input processor: text, token ids or chat messages become one validated request, once.

The one place where a chat template is rendered (tools included), a prompt tokenized, and the request
checked against the model (prompt length, token ids, max_tokens and its default from the context left) and
the operator's limits. What it returns goes to the engine core as it is: the core checks nothing again.
Errors are `InvalidInput`, the field named after the request: `prompt`, `messages`, `token_ids`,
`sampling.max_tokens`, `tools[0].parameters`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from infer.engine.sampling_params import SamplingParams
from infer.engine.structured import Constraint
from infer.engine.tokenizer import TemplateFailed, TemplateTooLong, Tokenizer
from infer.engine.tools.parsers import ToolCallParser
from infer.engine.tools.use import Tool, ToolChoice, ToolChoiceMode, ToolUse
from infer.engine.validation import InvalidInput, Refusal, check

_LIMITS = ("max_prompt_tokens", "max_output_tokens", "max_prompt_chars")
RENDER_CHARS_PER_TOKEN = 16  # a rendered chat's bound without max_prompt_chars: this many a token of the context


@dataclass(frozen=True)
class InputLimits:
    """The operator's bounds, tighter than the model's (None: no bound). `settings` says how each one is set,
    for its error message (`{"max_prompt_tokens": "server setting --max-prompt-tokens / ..."}`)."""

    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None  # also caps a default max_tokens (the context left)
    max_prompt_chars: int | None = None  # checked on a rendered chat, before it is tokenized
    settings: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in _LIMITS:
            value = getattr(self, name)
            check(name, value is None or value >= 1, "must be >= 1")

    def name(self, limit: str) -> str:
        """`max_prompt_tokens (512; server setting ...)`: the limit, its value and how it is set."""
        setting = self.settings.get(limit)
        value = getattr(self, limit)
        return f"{limit} ({value}; {setting})" if setting else f"{limit} ({value})"


@dataclass(frozen=True)
class Prompt:
    """What a request asks the model to continue: one of `text`, `token_ids` or chat `messages` (with tools,
    rendered by the model's chat template)."""

    text: str | None = None
    token_ids: Sequence[int] | None = None
    messages: Sequence[Mapping[str, Any]] | None = None  # role, content, tool_calls, tool_call_id, name
    tools: Sequence[Tool] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_tool_calls: bool = True
    add_generation_prompt: bool = True  # a chat: end with the assistant's turn opening
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # more chat template variables
    add_special_tokens: bool = True  # text: let the tokenizer add its own (a chat's template writes them)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", tuple(self.tools))
        num_inputs = sum(x is not None for x in (self.text, self.token_ids, self.messages))
        check("input", num_inputs == 1, "one of prompt, token_ids or messages is required")
        check("tools", not self.tools or self.messages is not None, "only a chat (messages) can call tools")

    @property
    def size_field(self) -> str:
        """The field a prompt's length is named after."""
        return "messages" if self.messages is not None else "prompt"


@dataclass(frozen=True)
class ProcessedInput:
    """A validated request: what the engine core takes (`EngineCore.submit`)."""

    prompt_token_ids: list[int]
    params: SamplingParams  # max_tokens settled; the constraint of tool_choice set
    tool_use: ToolUse | None = None  # a chat's tools (None: no chat)
    rendered: str | None = None  # a chat as its template rendered it

    def parser(self) -> ToolCallParser | None:
        """A new parser of the output's tool calls; None when the output is plain text."""
        return self.tool_use.parser() if self.tool_use is not None else None

    @property
    def constraints(self) -> list[tuple[str | None, Constraint]]:
        """What must compile before the request runs: every tool's parameters (named `tools[i].parameters`),
        whatever the tool_choice, then the output's constraint (None: `constraint_error` names it)."""
        tools = self.tool_use.tool_constraints if self.tool_use is not None else []
        own = [(None, self.params.constraint)] if self.params.constraint is not None else []
        return [*tools, *own]

    def constraint_error(self, error: InvalidInput) -> InvalidInput:
        """A constraint that does not compile, named after the field that asked for it."""
        use = self.tool_use
        if use is None or use.constraint is None:
            return error.within("sampling")
        if use.choice.mode is ToolChoiceMode.FUNCTION:
            index = next(i for i, t in enumerate(use.tools) if t.name == use.choice.function)
            return error.renamed(f"tools[{index}].parameters")
        return InvalidInput("tools", f"the parameters of a tool {error.message}", error.reason)


class InputProcessor:
    """Renders, tokenizes and validates requests for one model; thread-safe (prompt worker threads call it)."""

    def __init__(self, tokenizer: Tokenizer, max_model_len: int, vocab_size: int) -> None:
        self.tokenizer, self.max_model_len, self.vocab_size = tokenizer, max_model_len, vocab_size

    def tokenize(self, prompt: Prompt, limits: InputLimits | None = None) -> ProcessedInput:
        """The prompt's token ids (and a chat's rendered text), not checked against the model; `params` are
        the defaults. What the Tokenize RPC answers."""
        return self._encode(prompt, limits or InputLimits(), SamplingParams())

    def process(self, prompt: Prompt, params: SamplingParams, limits: InputLimits | None = None) -> ProcessedInput:
        """The request, rendered and tokenized once and checked; InvalidInput names the field."""
        limits = limits or InputLimits()
        processed = self._encode(prompt, limits, params)
        ids = processed.prompt_token_ids
        self._check_prompt(prompt, ids, limits)
        params = processed.params
        vocab = self.vocab_size
        ok = all(0 <= t < vocab for t in params.stop_token_ids)
        check("sampling.stop_token_ids", ok, f"ids must be in [0, {vocab})")
        max_tokens = self._max_tokens(len(ids), params.max_tokens, limits)
        return replace(processed, params=replace(params, max_tokens=max_tokens))

    def _encode(self, prompt: Prompt, limits: InputLimits, params: SamplingParams) -> ProcessedInput:
        if prompt.text is not None:
            return ProcessedInput(self.tokenizer.encode(prompt.text, prompt.add_special_tokens), params)
        if prompt.token_ids is not None:
            return ProcessedInput(list(prompt.token_ids), params)
        assert prompt.messages is not None
        use = ToolUse.for_model(prompt.tools, prompt.tool_choice, self.tokenizer, prompt.parallel_tool_calls)
        text = self._render(prompt, prompt.messages, use, limits)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return ProcessedInput(ids, with_tools(params, use), use, text)

    def _render(self, prompt: Prompt, messages: Sequence[Mapping[str, Any]], use: ToolUse, limits: InputLimits) -> str:
        checked, variables = use.render([dict(m) for m in messages])
        max_chars = limits.max_prompt_chars or RENDER_CHARS_PER_TOKEN * self.max_model_len
        try:  # NOTE: the template is stopped as soon as its output passes max_chars
            text = self.tokenizer.apply_chat_template(
                checked, prompt.add_generation_prompt, max_chars=max_chars, **{**prompt.template_kwargs, **variables}
            )
        except TemplateTooLong:
            text = None
        except TemplateFailed as e:  # the template's own fault or the messages': never the server's
            raise InvalidInput("messages", str(e), Refusal.TEMPLATE_FAILED) from None
        except ValueError as e:  # no chat template, an empty chat, messages the tools reject
            raise InvalidInput("messages", str(e)) from None
        if text is None or len(text) > max_chars:  # before it is tokenized
            limit = (
                limits.name("max_prompt_chars")
                if limits.max_prompt_chars
                else f"{max_chars} characters ({RENDER_CHARS_PER_TOKEN} a token of max_model_len {self.max_model_len})"
            )
            raise InvalidInput("messages", f"the rendered chat exceeds {limit}", Refusal.CONTEXT_LENGTH)
        return text

    def _check_prompt(self, prompt: Prompt, ids: Sequence[int], limits: InputLimits) -> None:
        num_prompt, max_model_len, vocab = len(ids), self.max_model_len, self.vocab_size
        check(prompt.size_field, num_prompt > 0, "must not be empty")
        check(prompt.size_field, num_prompt < max_model_len,
              f"{num_prompt} tokens exceeds max_model_len ({max_model_len}) less one token to generate",
              Refusal.CONTEXT_LENGTH)  # fmt: skip
        if prompt.token_ids is not None:
            check("token_ids", all(0 <= t < vocab for t in ids), f"ids must be in [0, {vocab})")
        if limits.max_prompt_tokens is not None:
            check(prompt.size_field, num_prompt <= limits.max_prompt_tokens,
                  f"{num_prompt} tokens exceeds {limits.name('max_prompt_tokens')}",
                  Refusal.CONTEXT_LENGTH)  # fmt: skip

    def _max_tokens(self, num_prompt: int, max_tokens: int | None, limits: InputLimits) -> int:
        """The request's max_tokens, checked; None: as many as the context leaves (up to max_output_tokens)."""
        room, limit = self.max_model_len - num_prompt, limits.max_output_tokens
        if max_tokens is None:
            return room if limit is None else min(room, limit)
        check("sampling.max_tokens", max_tokens <= room,
              f"prompt ({num_prompt} tokens) + max_tokens ({max_tokens}) exceeds max_model_len "
              f"({self.max_model_len})", Refusal.CONTEXT_LENGTH)  # fmt: skip
        check("sampling.max_tokens", limit is None or max_tokens <= limit,
              f"{max_tokens} exceeds {limits.name('max_output_tokens')}", Refusal.OVER_LIMIT)  # fmt: skip
        return max_tokens


def with_tools(params: SamplingParams, use: ToolUse) -> SamplingParams:
    """The constraint of tool_choice required / a named function, and the special tokens the parser reads."""
    try:
        constraint = use.constraint
    except InvalidInput as e:  # the combined schema is too long
        raise InvalidInput("tools", str(e), e.reason) from None
    if constraint is not None:
        if params.constraint is not None:
            raise InvalidInput("tool_choice", f"{use.choice.mode} constrains the output: "
                               f"sampling.{params.constraint.kind} cannot be set as well")  # fmt: skip
        params = replace(params, constraint=constraint)
    if use.needs_special_tokens:
        params = replace(params, skip_special_tokens=False)
    return params
