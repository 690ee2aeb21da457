"""Tool calling: tools into the prompt as the model's chat template expects, and the constraint that
`tool_choice` required / a named function puts on the output. Parsing the calls out of the output is in
`parsers.py`.

The format is chosen once per model, from its chat template:
- hermes (Qwen 2.5 and 3, Hermes): the template renders the tools itself; calls are
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
- llama3 (Llama 3.1+, `<|python_tag|>` in the template): the template renders the tools; a call is the
  whole output, `{"name": ..., "parameters": {...}}`;
- json_list (any template that ignores tools, SmolLM2's among them): a system message of ours lists the
  tools; calls are `<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>`, and tool results go
  back as a user turn of `<tool_response>` blocks (a template that knows no `tool` role still renders them).
"""

from __future__ import annotations

import contextlib
import enum
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infer.engine.structured.constraint import Constraint
from infer.engine.tools.parsers import (
    TOOL_CALL_OPEN,
    ListParser,
    NamedParser,
    TaggedParser,
    ToolCallParser,
    WholeOutputParser,
)
from infer.engine.validation import InvalidInput, check

if TYPE_CHECKING:
    from infer.engine.tokenizer import Tokenizer

MAX_TOOLS = 128
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
NO_ARGUMENTS = {"type": "object", "properties": {}}
Message = dict[str, Any]  # a chat message as templates take it: role, content, tool_calls, tool_call_id, ...


class ToolFormat(enum.StrEnum):
    HERMES = "hermes"
    LLAMA3 = "llama3"
    JSON_LIST = "json_list"


class ToolChoiceMode(enum.StrEnum):
    AUTO = "auto"  # text or calls, parsed from the output
    NONE = "none"  # text only
    REQUIRED = "required"  # one or more calls (constrained)
    FUNCTION = "function"  # a call of one named function (constrained)


@dataclass(frozen=True)
class Tool:
    """A function the model may call; `parameters` is a JSON schema (JSON text) of its arguments."""

    name: str
    description: str = ""
    parameters: str = ""

    def __post_init__(self) -> None:
        check("name", bool(TOOL_NAME.match(self.name)), "must be 1 to 64 of a-z, A-Z, 0-9, _ and -")
        if self.parameters:
            try:
                schema = json.loads(self.parameters)
            except (ValueError, RecursionError) as e:
                raise InvalidInput("parameters", f"not valid JSON: {e}") from None
            check("parameters", isinstance(schema, dict), "must be a JSON object (a JSON schema)")
            try:  # every tool_choice: what a call's arguments follow is what the schema says
                self.constraint  # noqa: B018
            except InvalidInput as e:
                raise e.renamed("parameters") from None

    @property
    def constraint(self) -> Constraint:
        """Its arguments: a JSON object of its schema (what a call of it is compiled to)."""
        return Constraint.json_schema(self.schema)

    @property
    def schema(self) -> dict[str, Any]:
        return dict(json.loads(self.parameters)) if self.parameters else dict(NO_ARGUMENTS)

    def to_template(self) -> dict[str, Any]:
        """OpenAI's (and chat templates') form: {"type": "function", "function": {...}}."""
        function = {"name": self.name, "description": self.description, "parameters": self.schema}
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    mode: ToolChoiceMode = ToolChoiceMode.AUTO
    function: str = ""  # mode FUNCTION: its name


def check_tools(tools: Sequence[Tool], choice: ToolChoice) -> None:
    """ValueError naming the field: too many tools, a name twice, a choice naming no tool."""
    check("tools", len(tools) <= MAX_TOOLS, f"at most {MAX_TOOLS}")
    names = [t.name for t in tools]
    check("tools", len(set(names)) == len(names), "names must be unique")
    if choice.mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.FUNCTION):
        check("tool_choice", bool(tools), f"{choice.mode} needs tools")
    if choice.mode is ToolChoiceMode.FUNCTION:
        check("tool_choice", choice.function in names, f"{choice.function[:64]!r} is not one of the tools")


def tool_format(chat_template: str | None) -> ToolFormat:
    """How this model calls tools, read from its chat template."""
    template = chat_template or ""
    if "tools" in template and "<tool_call>" in template:
        return ToolFormat.HERMES
    if "tools" in template and "<|python_tag|>" in template:
        return ToolFormat.LLAMA3
    return ToolFormat.JSON_LIST


@dataclass(frozen=True)
class ToolUse:
    """One request's tools, as its model calls them: the prompt, the constraint and the parser."""

    tools: tuple[Tool, ...]
    choice: ToolChoice
    format: ToolFormat
    parallel: bool = True  # more than one call in an output
    is_tag_special: bool = False  # the vocabulary has `<tool_call>` as a special token

    @classmethod
    def for_model(
        cls, tools: Sequence[Tool], choice: ToolChoice, tokenizer: Tokenizer, parallel: bool = True
    ) -> ToolUse:
        """ValueError naming the field when the tools or the choice are not usable."""
        check_tools(tools, choice)
        tag_id = tokenizer.token_to_id(TOOL_CALL_OPEN)
        is_special = tag_id is not None and tokenizer.decode([tag_id], skip_special_tokens=True) == ""
        return cls(tuple(tools), choice, tool_format(tokenizer.chat_template), parallel, is_special)

    def render(self, messages: Sequence[Message]) -> tuple[list[Message], dict[str, Any]]:
        """The messages and template variables to render (`chat_for_template`)."""
        return chat_for_template(messages, self.tools, self.format)

    @property
    def constraint(self) -> Constraint | None:
        return tool_constraint(self.tools, self.choice, self.parallel)

    @property
    def tool_constraints(self) -> list[tuple[str, Constraint]]:
        """(`tools[i].parameters`, its constraint) of every tool: each compiles, whatever the tool_choice."""
        return [(f"tools[{i}].parameters", t.constraint) for i, t in enumerate(self.tools)]

    def parser(self) -> ToolCallParser | None:
        """A new parser for one output; None when the output is plain text (no tools, or tool_choice none)."""
        return tool_call_parser(self.format, self.tools, self.choice)

    @property
    def needs_special_tokens(self) -> bool:
        """Whether the output's text must keep special tokens: the parser reads `<tool_call>`, and this
        vocabulary makes it one (skip_special_tokens would drop it)."""
        return self.is_tag_special and isinstance(self.parser(), TaggedParser)


def tool_call_parser(fmt: ToolFormat, tools: Sequence[Tool], choice: ToolChoice) -> ToolCallParser | None:
    if not tools or choice.mode is ToolChoiceMode.NONE:
        return None
    if choice.mode is ToolChoiceMode.FUNCTION:
        return NamedParser(choice.function)
    if choice.mode is ToolChoiceMode.REQUIRED:
        return ListParser()
    return WholeOutputParser() if fmt is ToolFormat.LLAMA3 else TaggedParser()


# --- the constraint of tool_choice required / a named function


def tool_constraint(tools: Sequence[Tool], choice: ToolChoice, parallel: bool = True) -> Constraint | None:
    """A named function: its arguments (a JSON object of its schema). Required: a JSON list of calls,
    `[{"name": ..., "arguments": {...}}, ...]` (one call when `parallel` is off). Else None."""
    if choice.mode is ToolChoiceMode.FUNCTION:
        return next(t for t in tools if t.name == choice.function).constraint
    if choice.mode is not ToolChoiceMode.REQUIRED:
        return None
    calls = [
        {"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.schema},
         "required": ["name", "arguments"]}
        for t in tools
    ]  # fmt: skip
    schema: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return Constraint.json_schema(schema)


# --- the prompt

JSON_LIST_INSTRUCTIONS = """\
You can call functions. Each function is described by a JSON schema of its arguments:
<tools>
{tools}
</tools>
To call one or more of them, answer with nothing else than
<tool_call>[{{"name": "<function name>", "arguments": {{<its arguments>}}}}]</tool_call>
Otherwise answer in plain text. Function results come back inside <tool_response></tool_response> tags."""


def render_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """{"name", "arguments"} of a call in the template form {"id", "type", "function": {...}}; JSON-text
    arguments become an object, as templates expect (those that take a string still get one when it is not JSON)."""
    function = call.get("function", call)
    arguments: Any = function.get("arguments", "")
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError, RecursionError):
            arguments = json.loads(arguments) if arguments else {}
    return {"name": function.get("name", ""), "arguments": arguments}


def chat_for_template(
    messages: Sequence[Message], tools: Sequence[Tool], fmt: ToolFormat
) -> tuple[list[Message], dict[str, Any]]:
    """The messages and template variables that render `tools` and the calls and results in the history."""
    if fmt is not ToolFormat.JSON_LIST:
        chat = [_template_calls(m) for m in messages]
        return chat, ({"tools": [t.to_template() for t in tools]} if tools else {})
    chat = _json_list_history(messages)
    if tools:
        listed = "\n".join(json.dumps(t.to_template()["function"], ensure_ascii=False) for t in tools)
        instructions = JSON_LIST_INSTRUCTIONS.format(tools=listed)
        if chat and chat[0]["role"] == "system":
            chat[0] = {**chat[0], "content": f"{chat[0].get('content') or ''}\n\n{instructions}".lstrip()}
        else:
            chat.insert(0, {"role": "system", "content": instructions})
    return chat, {}


def _template_calls(message: Message) -> Message:
    calls = message.get("tool_calls")
    if not calls:
        return message
    rendered = [{"id": c.get("id", ""), "type": "function", "function": render_call(c)} for c in calls]
    return {**message, "tool_calls": rendered}


def _json_list_history(messages: Sequence[Message]) -> list[Message]:
    """Calls into the assistant's text, runs of tool results into one user turn of <tool_response> blocks."""
    chat: list[Message] = []
    for m in messages:
        if m["role"] == "tool":
            block = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if chat and chat[-1].get("is_tool_results"):
                chat[-1]["content"] += "\n" + block
            else:
                chat.append({"role": "user", "content": block, "is_tool_results": True})
            continue
        if m.get("tool_calls"):
            calls = json.dumps([render_call(c) for c in m["tool_calls"]], ensure_ascii=False)
            text = f"{m.get('content') or ''}\n".lstrip() + f"<tool_call>{calls}</tool_call>"
            m = {k: v for k, v in m.items() if k != "tool_calls"} | {"content": text}
        chat.append(dict(m))
    for m in chat:
        m.pop("is_tool_results", None)
    return chat
