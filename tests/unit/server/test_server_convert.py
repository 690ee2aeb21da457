"""Proto <-> engine conversion: defaults, every sampling field, field names in errors, the final message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import pytest

from infer.api import CONSTRAINT_FIELDS, pb
from infer.engine import Constraint, InputProcessor, InvalidInput, Prompt, Tool, ToolChoice, ToolChoiceMode
from infer.engine.request import FinishReason, RequestOutput, Timings, TokenLogprob, Usage
from infer.engine.sampling_params import SamplingParams
from infer.engine.tokenizer import Tokenizer
from infer.server import convert
from infer.server.limits import RequestLimits


class FakeTokenizer:
    """One token per character; counts the chats it renders."""

    chat_template = "fake"
    num_rendered = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)

    def token_to_id(self, token: str) -> int | None:
        return None

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **variables: Any
    ) -> str:
        if not messages:
            raise ValueError("cannot apply a chat template to an empty conversation")
        FakeTokenizer.num_rendered += 1
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<a>" if add_generation_prompt else "")


TOKENIZER = cast(Tokenizer, FakeTokenizer())
BOUNDS = RequestLimits().bounds(max_model_len=2048)


def test_unset_sampling_fields_keep_the_engine_defaults() -> None:
    assert convert.sampling_params(pb.SamplingParams()) == SamplingParams()


def test_every_sampling_field_is_carried() -> None:
    values: dict[str, Any] = {
        "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "seed": 123, "stop": ["\n"], "stop_token_ids": [2],
        "min_tokens": 1, "ignore_eos": True, "logprobs": 0, "skip_special_tokens": False, "speculative_tokens": 3,
        "priority": -2,
    }  # fmt: skip
    params = convert.sampling_params(pb.SamplingParams(**values))
    assert params == SamplingParams(**values)
    proto_only = {"max_tokens_from_context"}  # becomes max_tokens None (test below)
    carried = {f.name for f in pb.SamplingParams.DESCRIPTOR.fields} - set(CONSTRAINT_FIELDS) - proto_only
    assert carried | {"constraint"} == set(SamplingParams.__dataclass_fields__)


def test_max_tokens_from_context_leaves_max_tokens_to_the_engine() -> None:
    assert convert.sampling_params(pb.SamplingParams(max_tokens_from_context=True)).max_tokens is None
    assert convert.sampling_params(pb.SamplingParams(max_tokens=7, max_tokens_from_context=True)).max_tokens == 7
    assert convert.sampling_params(pb.SamplingParams()).max_tokens == 16


@pytest.mark.parametrize(
    ("proto", "constraint"),
    [
        (pb.SamplingParams(json_schema='{"type": "object"}'), Constraint.json_schema({"type": "object"})),
        (pb.SamplingParams(regex="[0-9]+"), Constraint.regex("[0-9]+")),
        (pb.SamplingParams(grammar='root ::= "a"'), Constraint.grammar('root ::= "a"')),
        (pb.SamplingParams(choice=pb.Choices(choices=["yes", "no"])), Constraint.choice(["yes", "no"])),
        (pb.SamplingParams(json_object=pb.JsonObject()), Constraint.json_object()),
        (pb.SamplingParams(), None),
    ],
)
def test_the_constraint_is_carried(proto: pb.SamplingParams, constraint: Constraint | None) -> None:
    assert convert.sampling_params(proto).constraint == constraint


@pytest.mark.parametrize(
    ("proto", "message"),
    [
        (pb.SamplingParams(json_schema="{"), r"^sampling\.json_schema: not valid JSON"),
        (pb.SamplingParams(regex=""), r"^sampling\.regex: must not be empty"),
        (pb.SamplingParams(choice=pb.Choices()), r"^sampling\.choice: 1 to 1024 strings"),
    ],
)
def test_a_malformed_constraint_names_the_proto_field(proto: pb.SamplingParams, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        convert.sampling_params(proto)


def test_sampling_errors_name_the_proto_field() -> None:
    with pytest.raises(ValueError, match=r"^sampling\.top_k: "):
        convert.sampling_params(pb.SamplingParams(top_k=-1))
    with pytest.raises(ValueError, match=r"^sampling\.speculative_tokens: must be in \[0, 16\]"):
        convert.sampling_params(pb.SamplingParams(speculative_tokens=17))


def test_prompt_from_text_ids_or_messages() -> None:
    assert convert.prompt(pb.GenerateRequest(prompt="hi")) == Prompt(text="hi")
    assert list(convert.prompt(pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 6]))).token_ids or ()) == [5, 6]
    chat = pb.ChatMessages(messages=[pb.ChatMessage(role="developer", content="x")])
    assert convert.prompt(pb.GenerateRequest(messages=chat)).messages == [{"role": "system", "content": "x"}]
    with pytest.raises(InvalidInput, match=r"^input: ") as missing:
        convert.prompt(pb.GenerateRequest())
    assert missing.value.field == "input"
    bad_role = pb.ChatMessages(messages=[pb.ChatMessage(role="root", content="x")])
    with pytest.raises(InvalidInput) as role:
        convert.prompt(pb.GenerateRequest(messages=bad_role))
    assert role.value.field == "messages[0].role"


def test_tools_and_choice_are_carried() -> None:
    tool = pb.Tool(name="f", parameters='{"type": "object"}')
    request = pb.GenerateRequest(messages=_chat("x"), tools=[tool], tool_choice=pb.ToolChoice(function="f"),
                                 parallel_tool_calls=False)  # fmt: skip
    prompt = convert.prompt(request)
    assert prompt.tools == (Tool("f", "", '{"type": "object"}'),)
    assert (prompt.tool_choice, prompt.parallel_tool_calls) == (ToolChoice(ToolChoiceMode.FUNCTION, "f"), False)
    with pytest.raises(InvalidInput) as bad:
        convert.prompt(pb.GenerateRequest(messages=_chat("x"), tools=[tool, pb.Tool(name="a b")]))
    assert bad.value.field == "tools[1].name"


def test_deltas_carry_tokens_and_only_the_last_carries_usage() -> None:
    lp = TokenLogprob(token_id=104, logprob=-0.5, top=((104, -0.5), (105, -1.5)), token="h", top_tokens=("h", "i"))
    delta = convert.generate_response(RequestOutput("r", [104], "h", [lp]))
    assert (list(delta.token_ids), delta.text, delta.finish_reason) == ([104], "h", pb.FINISH_REASON_UNSPECIFIED)
    assert not delta.HasField("usage") and not delta.HasField("timings")
    assert delta.logprobs[0].token == "h" and [t.token for t in delta.logprobs[0].top] == ["h", "i"]
    last = RequestOutput("r", [105], "i", None, FinishReason.LENGTH, Usage(3, 2, 0), Timings(0.1, 0.2, 0.3, 1))
    final = convert.generate_response(last)
    assert final.finish_reason == pb.FINISH_REASON_LENGTH and not final.logprobs
    assert (final.usage.prompt_tokens, final.usage.completion_tokens, final.usage.cached_tokens) == (3, 2, 0)
    assert final.timings.total_s == pytest.approx(0.3) and final.timings.num_preemptions == 1
    assert final.timings.num_draft_tokens == final.timings.num_accepted_tokens == 0  # no drafts
    spec = RequestOutput("r", [105], "i", None, FinishReason.STOP, Usage(3, 9, 0), Timings(0.1, 0.2, 0.3, 0, 12, 9))
    t = convert.generate_response(spec).timings
    assert (t.num_draft_tokens, t.num_accepted_tokens, t.acceptance_rate) == (12, 9, pytest.approx(0.75))


def test_tokenize_text_and_chat() -> None:
    processor = InputProcessor(TOKENIZER, 2048, 1 << 16)
    text = pb.TokenizeRequest(text="a")
    assert list(convert.tokenize_response(text, processor.tokenize(convert.tokenize_prompt(text))).token_ids) == [1, 97]
    no_special = pb.TokenizeRequest(text="a", add_special_tokens=False)
    assert convert.tokenize_prompt(no_special) == Prompt(text="a", add_special_tokens=False)
    assert list(processor.tokenize(convert.tokenize_prompt(no_special)).prompt_token_ids) == [97]
    chat = pb.TokenizeRequest(messages=_chat("x"), add_generation_prompt=False)
    response = convert.tokenize_response(chat, processor.tokenize(convert.tokenize_prompt(chat)))
    assert response.text == "<user>x" and list(response.token_ids) == [ord(c) for c in "<user>x"]


def _chat(*contents: str) -> pb.ChatMessages:
    return pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=c) for c in contents])


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (pb.GenerateRequest(messages=_chat(*[""] * 11)), r"^messages: 11 messages exceeds max_chat_messages \(10; "),
        (pb.TokenizeRequest(messages=_chat(*[""] * 11)), r"^messages: 11 messages exceeds max_chat_messages \(10; "),
        (
            pb.GenerateRequest(messages=_chat("x" * 60, "y" * 41)),
            r"^messages: the roles and contents are 109 characters exceeds max_prompt_chars \(100; ",
        ),
        (pb.GenerateRequest(prompt="x" * 101), r"^prompt: 101 characters exceeds max_prompt_chars \(100; "),
        (pb.TokenizeRequest(text="x" * 101), r"^text: 101 characters exceeds max_prompt_chars \(100; "),
        (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5] * 49)), r"^prompt: 49 tokens exceeds max_prompt_tokens"),
    ],
    ids=["messages", "tokenize-messages", "chat-chars", "prompt-chars", "text-chars", "token-ids"],
)
def test_oversized_input_is_refused_before_any_template_work(
    request_: pb.GenerateRequest | pb.TokenizeRequest, message: str
) -> None:
    bounds = RequestLimits(max_prompt_tokens=48, max_chat_messages=10, max_prompt_chars=100).bounds(2048)
    rendered = FakeTokenizer.num_rendered
    with pytest.raises(ValueError, match=message):
        convert.checked_input_size(request_, bounds)
    assert FakeTokenizer.num_rendered == rendered


def test_the_rendered_chat_is_bounded_before_it_is_tokenized() -> None:
    bounds = RequestLimits(max_prompt_chars=20).bounds(2048)
    chat = pb.GenerateRequest(messages=_chat("a" * 5, "b" * 5))  # 18 characters as sent, 25 rendered
    assert convert.checked_input_size(chat, bounds) == convert.InputSize(num_chars=18, num_messages=2)
    processor = InputProcessor(TOKENIZER, 2048, 1 << 16)
    with pytest.raises(ValueError, match=r"^messages: the rendered chat exceeds max_prompt_chars"):
        processor.process(convert.prompt(chat), SamplingParams(), bounds.engine)


def test_unset_size_limits_follow_the_prompt_token_bound() -> None:
    assert (BOUNDS.max_prompt_tokens, BOUNDS.max_chat_messages, BOUNDS.max_prompt_chars) == (2047, 2047, 16 * 2047)
    tighter = RequestLimits(max_prompt_tokens=100).bounds(2048)
    assert (tighter.max_chat_messages, tighter.max_prompt_chars) == (100, 1600)
    with pytest.raises(ValueError, match=r"^prompt: 2048 tokens exceeds max_model_len \(2048\) less one token"):
        BOUNDS.check_tokens(2048)


def test_tool_calls_and_results_in_the_history_reach_the_template() -> None:
    call = pb.ToolCall(id="call_1", name="f", arguments='{"x": 1}')
    messages = pb.ChatMessages(messages=[
        pb.ChatMessage(role="user", content="q"),
        pb.ChatMessage(role="assistant", tool_calls=[call]),
        pb.ChatMessage(role="tool", content="42", tool_call_id="call_1", name="f"),
    ])  # fmt: skip
    assert convert._messages(messages)[1:] == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "content": "42", "tool_call_id": "call_1", "name": "f"},
    ]  # fmt: skip
    bad = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="q", tool_calls=[call])])
    with pytest.raises(ValueError, match=r"^messages\[0\]\.tool_calls: only an assistant message"):
        convert._messages(bad)


def test_tool_calls_and_their_finish_reason_are_carried() -> None:
    """The engine parses the calls (`CallerOutputs`, tests/unit/engine/test_output_processor.py); here they are
    converted."""
    from infer.engine.tools.parsers import ToolCallDelta

    calls = (ToolCallDelta(0, "call_1", "f", "{}"),)
    last = RequestOutput("r", [2], "", None, FinishReason.TOOL_CALLS, Usage(3, 2, 0), tool_calls=calls)
    response = convert.generate_response(last)
    assert response.text == "" and [(c.index, c.id, c.name, c.arguments) for c in response.tool_calls] == [
        (0, "call_1", "f", "{}")
    ]
    assert response.finish_reason == pb.FINISH_REASON_TOOL_CALLS


def test_a_choice_has_an_engine_id_no_request_id_can_be() -> None:
    plain = convert.engine_request_id("nn-1", pb.GenerateRequest(request_id="nn-1"))
    choice = convert.engine_request_id("nn", pb.GenerateRequest(request_id="nn", choice_index=1))
    assert plain == "nn-1" and choice == "nn (choice 1)"
    assert convert.engine_request_id("nn", pb.GenerateRequest(request_id="nn", choice_index=0)) != "nn"
    with pytest.raises(InvalidInput, match="request_id"):
        convert.check_request_id(choice)  # a client cannot send a choice's engine id as its own


def test_a_priority_out_of_range_names_the_field() -> None:
    assert convert.sampling_params(pb.SamplingParams(priority=-20)).priority == -20
    with pytest.raises(InvalidInput, match=r"^sampling\.priority: "):
        convert.sampling_params(pb.SamplingParams(priority=21))
