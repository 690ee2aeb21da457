"""Output processing: the caller's half (`CallerOutputs`: logprob tokens' text, tool calls), for the servicer
and the offline `LLM` alike. The step thread's half is exercised through the core (test_core*.py)."""

from __future__ import annotations

from typing import cast

from infer.engine.detokenizer import Decoder
from infer.engine.input_processor import ProcessedInput
from infer.engine.llm import LLM
from infer.engine.output_processor import CallerOutputs, caller_outputs
from infer.engine.request import FinishReason, RequestOutput, TokenLogprob, Usage
from infer.engine.sampling_params import SamplingParams
from infer.engine.tools import Tool, ToolChoice, ToolChoiceMode
from infer.engine.tools.parsers import TaggedParser
from tests.helpers.fake_engine import fake_core

WEATHER = Tool("get_weather", "The weather", '{"type": "object", "properties": {"city": {"type": "string", '
               '"maxLength": 5}}, "required": ["city"], "additionalProperties": false}')  # fmt: skip


class CharDecoder:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


DECODER = cast(Decoder, CharDecoder())


def test_logprobs_get_their_tokens_text() -> None:
    lp = TokenLogprob(token_id=104, logprob=-0.5, top=((104, -0.5), (105, -1.5)))
    out = CallerOutputs(DECODER, None)(RequestOutput("r", [104], "h", [lp]))
    assert out.logprobs is not None and out.logprobs[0].token == "h" and out.logprobs[0].top_tokens == ("h", "i")
    assert out.logprobs[0] == lp  # the text is not part of a logprob's value


def test_a_parsed_output_streams_content_and_calls_then_ends_with_tool_calls() -> None:
    outputs = CallerOutputs(DECODER, TaggedParser())
    pieces = ["Sure.\n<tool_", 'call>{"name": "f", "arguments": {}}</tool_call>']
    first = outputs(RequestOutput("r", [1], pieces[0]))
    last = outputs(RequestOutput("r", [2], pieces[1], None, FinishReason.STOP, Usage(3, 2, 0)))
    assert (first.text, first.tool_calls) == ("Sure.", ())
    assert last.text == "" and [(c.index, c.name, c.arguments) for c in last.tool_calls] == [(0, "f", "{}")]
    assert last.finish_reason is FinishReason.TOOL_CALLS
    plain = CallerOutputs(DECODER, TaggedParser())(RequestOutput("r", [2], "x", None, FinishReason.STOP))
    assert plain.text == "x" and plain.finish_reason is FinishReason.STOP


def test_nothing_to_do_without_logprobs_or_tools() -> None:
    assert caller_outputs(ProcessedInput([1, 2], SamplingParams()), DECODER) is None
    assert caller_outputs(ProcessedInput([1, 2], SamplingParams(logprobs=0)), DECODER) is not None


def test_llm_chat_returns_tool_calls_and_logprob_text() -> None:
    core, _ = fake_core(max_model_len=1024, num_blocks=128)
    llm = LLM.from_core(core)
    choice = ToolChoice(ToolChoiceMode.FUNCTION, "get_weather")
    params = SamplingParams(max_tokens=60, logprobs=1)
    out = llm.chat([{"role": "user", "content": "hi"}], params, tools=[WEATHER], tool_choice=choice)
    assert out.finish_reason is FinishReason.TOOL_CALLS and out.text == ""
    assert [(c.index, c.name) for c in out.tool_calls] == [(0, "get_weather")] and out.tool_calls[0].id
    assert out.tool_calls[0].arguments.startswith('{"city": "') and out.tool_calls[0].arguments.endswith('"}')
    assert out.logprobs is not None  # each token's text, the eos that ended the call shown
    assert "".join(lp.token or "" for lp in out.logprobs) == out.tool_calls[0].arguments + "<|im_end|>"
