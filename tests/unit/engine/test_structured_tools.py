"""Tools into the prompt, per the model's chat template; the constraint of tool_choice required / named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from infer.engine.structured import Constraint, GrammarCompiler
from infer.engine.tokenizer import Tokenizer
from infer.engine.tools.use import (
    MAX_TOOLS,
    Tool,
    ToolChoice,
    ToolChoiceMode,
    ToolFormat,
    chat_for_template,
    check_tools,
    tool_constraint,
    tool_format,
)
from tests.helpers.fake_engine import tiny_tokenizer

WEATHER = Tool("get_weather", "The weather in a city", json.dumps(
    {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
     "required": ["city"], "additionalProperties": False}))  # fmt: skip
TIME = Tool("get_time")

# a hermes-style template (Qwen's conventions): it renders the tools, the calls and the results itself
HERMES_TEMPLATE = """\
{%- if tools %}<|im_start|>system
<tools>{% for t in tools %}
{{ t | tojson }}{% endfor %}
</tools><|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}<|im_start|>user
<tool_response>{{ m.content }}</tool_response><|im_end|>
{% elif m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>{"name": "{{ c.function.name }}", "arguments": \
{{ c.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1"},
    {"role": "tool", "content": "12:00", "tool_call_id": "call_2"},
]  # fmt: skip


def test_tools_are_checked() -> None:
    with pytest.raises(ValueError, match=r"^name: must be 1 to 64"):
        Tool("get weather")
    with pytest.raises(ValueError, match=r"^parameters: not valid JSON"):
        Tool("f", parameters="{")
    with pytest.raises(ValueError, match=r"^parameters: must be a JSON object"):
        Tool("f", parameters="[]")
    with pytest.raises(ValueError, match=r"^parameters: does not compile: #/properties/a: not is not enforced"):
        Tool("f", parameters=json.dumps({"type": "object", "properties": {"a": {"not": {"type": "integer"}}}}))
    with pytest.raises(ValueError, match=r"^parameters: does not compile: #: \$ref 'https://x.org/s' is a remote"):
        Tool("f", parameters=json.dumps({"$ref": "https://x.org/s"}))
    with pytest.raises(ValueError, match=r"^tools: names must be unique"):
        check_tools([TIME, TIME], ToolChoice())
    with pytest.raises(ValueError, match=rf"^tools: at most {MAX_TOOLS}"):
        check_tools([Tool(f"f{i}") for i in range(MAX_TOOLS + 1)], ToolChoice())
    with pytest.raises(ValueError, match=r"^tool_choice: 'nope' is not one of the tools"):
        check_tools([TIME], ToolChoice(ToolChoiceMode.FUNCTION, "nope"))
    with pytest.raises(ValueError, match=r"^tool_choice: required needs tools"):
        check_tools([], ToolChoice(ToolChoiceMode.REQUIRED))
    assert TIME.schema == {"type": "object", "properties": {}}


def test_the_format_is_read_from_the_chat_template(default_model_dir: Path) -> None:
    assert tool_format(Tokenizer.from_dir(default_model_dir).chat_template) is ToolFormat.JSON_LIST  # SmolLM2
    assert tool_format(HERMES_TEMPLATE) is ToolFormat.HERMES
    assert tool_format("{% if tools %}Environment: ipython{% endif %}{{ '<|python_tag|>' }}") is ToolFormat.LLAMA3
    assert tool_format(None) is ToolFormat.JSON_LIST


def test_a_template_without_tools_gets_our_instructions_and_history(default_model_dir: Path) -> None:
    tok = Tokenizer.from_dir(default_model_dir)
    messages, variables = chat_for_template(HISTORY, [WEATHER, TIME], ToolFormat.JSON_LIST)
    text = tok.apply_chat_template(messages, **variables)
    assert variables == {}
    assert text.startswith("<|im_start|>system\nYou can call functions.")
    assert '{"name": "get_weather", "description": "The weather in a city", "parameters": {' in text
    assert (
        '<|im_start|>assistant\n<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>'
        in text
    )
    # both results in one user turn: a template that knows only user and assistant renders them too
    assert "<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response>\n<tool_response>\n12:00\n" in text
    with_system, _ = chat_for_template([{"role": "system", "content": "Be brief."}, *HISTORY[:1]], [TIME],
                                       ToolFormat.JSON_LIST)  # fmt: skip
    assert with_system[0]["content"].startswith("Be brief.\n\nYou can call functions.")
    assert len(with_system) == 2


def test_a_template_with_tools_renders_them_itself() -> None:
    tok = tiny_tokenizer()
    tok.chat_template = HERMES_TEMPLATE
    messages, variables = chat_for_template(HISTORY, [WEATHER], ToolFormat.HERMES)
    text = tok.apply_chat_template(messages, **variables)
    assert '<tools>{"type": "function", "function": {"name": "get_weather"' in text
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text  # an object
    assert "<tool_response>18 C, sunny</tool_response>" in text
    assert chat_for_template(HISTORY[:1], [], ToolFormat.HERMES) == (HISTORY[:1], {})


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    tok = tiny_tokenizer()
    return GrammarCompiler(tok, tok.vocab_size, [0])


def accepts(compiler: GrammarCompiler, schema: dict[str, Any], text: str) -> bool:
    import xgrammar as xgr

    matcher = xgr.GrammarMatcher(compiler.submit(Constraint.json_schema(schema)).result(timeout=60))
    ok = bool(matcher.accept_string(text)) and bool(matcher.is_completed())
    if ok:
        jsonschema.validate(json.loads(text), schema)  # what the grammar takes, the schema validates
    return ok


def test_required_constrains_the_output_to_a_list_of_calls(compiler: GrammarCompiler) -> None:
    constraint = tool_constraint([WEATHER, TIME], ToolChoice(ToolChoiceMode.REQUIRED))
    assert constraint is not None
    schema = json.loads(constraint.text)
    assert accepts(compiler, schema, '[{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}]')
    assert accepts(compiler, schema, '[{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {}}]')
    assert not accepts(compiler, schema, "[]")
    assert not accepts(compiler, schema, '[{"name": "get_weather", "arguments": {"days": 2}}]')  # city is required
    assert not accepts(compiler, schema, '[{"name": "other", "arguments": {}}]')
    single = tool_constraint([TIME], ToolChoice(ToolChoiceMode.REQUIRED), parallel=False)
    assert single is not None
    two = '[{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {}}]'
    assert not accepts(compiler, json.loads(single.text), two)


def test_a_named_function_constrains_the_output_to_its_arguments(compiler: GrammarCompiler) -> None:
    constraint = tool_constraint([WEATHER, TIME], ToolChoice(ToolChoiceMode.FUNCTION, "get_weather"))
    assert constraint is not None and json.loads(constraint.text) == WEATHER.schema
    assert accepts(compiler, WEATHER.schema, '{"city": "Rome"}')
    assert not accepts(compiler, WEATHER.schema, '{"days": 1}')
    assert tool_constraint([WEATHER], ToolChoice()) is None
    assert tool_constraint([WEATHER], ToolChoice(ToolChoiceMode.NONE)) is None


def test_tool_use_reads_the_model() -> None:
    from infer.engine.tools.use import ToolUse
    from tests.helpers.fake_engine import SPECIALS, train_byte_bpe

    backend = train_byte_bpe(330, [*SPECIALS, "<tool_call>", "</tool_call>"])
    tags = ["<tool_call>", "</tool_call>"]
    special = Tokenizer(backend, special_tokens={"eos_token": "<|im_end|>"}, extra_special_tokens=tags,
                        chat_template=HERMES_TEMPLATE)  # fmt: skip
    use = ToolUse.for_model([WEATHER], ToolChoice(), special)
    assert use.format is ToolFormat.HERMES and use.is_tag_special
    assert use.needs_special_tokens  # else skip_special_tokens would drop the tags the parser looks for
    assert not ToolUse.for_model([WEATHER], ToolChoice(ToolChoiceMode.REQUIRED), special).needs_special_tokens
    plain = ToolUse.for_model([WEATHER], ToolChoice(), tiny_tokenizer())
    assert plain.format is ToolFormat.JSON_LIST and not plain.needs_special_tokens
    assert plain.parser() is not plain.parser()  # one per output
    with pytest.raises(ValueError, match=r"^tools: names must be unique"):
        ToolUse.for_model([WEATHER, WEATHER], ToolChoice(), special)
