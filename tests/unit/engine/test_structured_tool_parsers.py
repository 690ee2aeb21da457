"""Tool calls out of streamed text: what a client sees as content and as calls, however the text is cut."""

from __future__ import annotations

import json

import pytest

from infer.engine.tools.parsers import (
    ListParser,
    NamedParser,
    Parsed,
    TaggedParser,
    ToolCallDelta,
    ToolCallParser,
    WholeOutputParser,
)
from infer.engine.tools.use import Tool, ToolChoice, ToolChoiceMode, ToolFormat, tool_call_parser


def run(parser: ToolCallParser, pieces: list[str]) -> tuple[str, list[ToolCallDelta]]:
    """Feed the pieces, then finish: all content, and all call deltas."""
    outs: list[Parsed] = [parser.feed(p) for p in pieces] + [parser.finish()]
    return "".join(o.content for o in outs), [c for o in outs for c in o.calls]


def calls_of(deltas: list[ToolCallDelta]) -> list[tuple[str, dict[str, object]]]:
    """(name, arguments) per call, from deltas merged the way OpenAI clients merge them."""
    merged: dict[int, list[str]] = {}
    for d in deltas:
        if d.index not in merged:
            assert d.id.startswith("call_") and d.name
            merged[d.index] = [d.name, ""]
        merged[d.index][1] += d.arguments
    return [(name, json.loads(args)) for name, args in (merged[i] for i in sorted(merged))]


def chars(text: str) -> list[str]:
    return list(text)


HERMES = 'Let me check.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("split", [chars, lambda t: [t], lambda t: [t[:20], t[20:]]])
def test_a_tagged_call_after_some_text(split: object) -> None:
    content, deltas = run(TaggedParser(), split(HERMES))  # type: ignore[operator]
    assert content == "Let me check."
    assert calls_of(deltas) == [("weather", {"city": "Paris"})]


def test_several_tagged_calls_and_lists_are_numbered_in_order() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n\n'
        '<tool_call>[{"name": "b", "arguments": {"x": 1}}, {"name": "c", "parameters": {"y": [2]}}]</tool_call>\n'
    )
    content, deltas = run(TaggedParser(), chars(text))
    assert content == ""  # the newlines between the calls are not an answer
    assert calls_of(deltas) == [("a", {}), ("b", {"x": 1}), ("c", {"y": [2]})]
    assert [d.index for d in deltas] == [0, 1, 2]
    assert len({d.id for d in deltas}) == 3


def test_text_that_only_looks_like_a_tag_is_content() -> None:
    parser = TaggedParser()
    assert parser.feed("a <tool").content == "a"  # held back: it may be a tag
    assert parser.feed("box> and <tool_call>not json</tool_call> end\n").content == (
        " <toolbox> and <tool_call>not json</tool_call> end"
    )
    assert parser.finish().content == "\n"  # no calls: the answer keeps its last newline
    assert not parser.has_calls


def test_a_call_cut_off_at_the_end() -> None:
    content, deltas = run(TaggedParser(), ['<tool_call>{"name": "a", "arguments": {"k": 1}}'])
    assert content == "" and calls_of(deltas) == [("a", {"k": 1})]
    content, deltas = run(TaggedParser(), ['Hi <tool_call>{"name": "a", "argu'])
    assert content == 'Hi <tool_call>{"name": "a", "argu' and deltas == []


def test_llama3_calls_are_the_whole_output() -> None:
    content, deltas = run(WholeOutputParser(), chars(' {"name": "f", "parameters": {"q": "x"}}; {"name": "g"}'))
    assert content == "" and calls_of(deltas) == [("f", {"q": "x"}), ("g", {})]
    parser = WholeOutputParser()
    assert parser.feed("Paris is").content == "Paris is"  # not JSON: content streams at once
    assert parser.feed(' {"name": "f"}').content == ' {"name": "f"}'
    content, deltas = run(WholeOutputParser(), ['{"not": "a call"}'])
    assert content == '{"not": "a call"}' and deltas == []


def test_a_named_function_streams_its_arguments() -> None:
    parser = NamedParser("weather")
    first = parser.feed('{"city": ')
    assert first.content == "" and first.calls[0].name == "weather" and first.calls[0].arguments == '{"city": '
    later = parser.feed('"Paris"}')
    assert later.calls == [ToolCallDelta(0, arguments='"Paris"}')]
    assert parser.finish() == Parsed()
    assert calls_of([*first.calls, *later.calls]) == [("weather", {"city": "Paris"})]


def test_required_calls_are_a_json_list() -> None:
    content, deltas = run(ListParser(), chars('[{"name": "a", "arguments": {"n": 1}}, {"name": "b", "arguments": {}}]'))
    assert content == "" and calls_of(deltas) == [("a", {"n": 1}), ("b", {})]
    content, deltas = run(ListParser(), ['[{"name": "a", "argum'])  # cut off by max_tokens
    assert content == '[{"name": "a", "argum' and deltas == []


def test_the_parser_follows_the_format_and_the_choice() -> None:
    tools = [Tool("f")]
    auto = ToolChoice()
    assert tool_call_parser(ToolFormat.HERMES, [], auto) is None
    assert tool_call_parser(ToolFormat.HERMES, tools, ToolChoice(ToolChoiceMode.NONE)) is None
    assert isinstance(tool_call_parser(ToolFormat.HERMES, tools, auto), TaggedParser)
    assert isinstance(tool_call_parser(ToolFormat.JSON_LIST, tools, auto), TaggedParser)
    assert isinstance(tool_call_parser(ToolFormat.LLAMA3, tools, auto), WholeOutputParser)
    assert isinstance(tool_call_parser(ToolFormat.LLAMA3, tools, ToolChoice(ToolChoiceMode.REQUIRED)), ListParser)
    named = tool_call_parser(ToolFormat.JSON_LIST, tools, ToolChoice(ToolChoiceMode.FUNCTION, "f"))
    assert isinstance(named, NamedParser) and named.name == "f"
