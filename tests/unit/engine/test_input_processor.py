"""The input processor: one render, one tokenize, one check per request; errors name the request's field."""

from __future__ import annotations

from typing import Any

import pytest

from infer.engine.input_processor import InputLimits, InputProcessor, Prompt
from infer.engine.llm import LLM
from infer.engine.sampling_params import SamplingParams
from infer.engine.structured import Constraint
from infer.engine.tokenizer import Tokenizer
from infer.engine.tools.use import Tool, ToolChoice, ToolChoiceMode
from infer.engine.validation import InvalidInput, Refusal
from tests.helpers.fake_engine import fake_core, tiny_tokenizer

MAX_MODEL_LEN = 64
USER = [{"role": "user", "content": "Hello world"}]
WEATHER = Tool("get_weather", "The weather in a city", '{"type": "object", "properties": {"city": {"type": "string"}}}')


@pytest.fixture
def tokenizer() -> Tokenizer:
    return tiny_tokenizer()


@pytest.fixture
def processor(tokenizer: Tokenizer) -> InputProcessor:
    return InputProcessor(tokenizer, MAX_MODEL_LEN, tokenizer.vocab_size)


def refused(processor: InputProcessor, prompt: Prompt, params: SamplingParams, **limits: Any) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        processor.process(prompt, params, InputLimits(**limits))
    return caught.value


@pytest.mark.parametrize(
    ("prompt", "params", "field", "message"),
    [
        (Prompt(token_ids=range(3, 67)), SamplingParams(max_tokens=1), "prompt", "64 tokens exceeds max_model_len"),
        (Prompt(text="x" * 200), SamplingParams(), "prompt", "tokens exceeds max_model_len (64) less one"),
        (Prompt(messages=[{"role": "user", "content": "x" * 200}]), SamplingParams(), "messages", "tokens exceeds"),
        (Prompt(token_ids=[]), SamplingParams(), "prompt", "must not be empty"),
        (Prompt(token_ids=[5, 10**6]), SamplingParams(), "token_ids", "ids must be in [0, "),
        (Prompt(token_ids=[5, 6]), SamplingParams(max_tokens=63), "sampling.max_tokens", "prompt (2 tokens) + "),
        (Prompt(token_ids=[5]), SamplingParams(stop_token_ids=(10**6,)), "sampling.stop_token_ids", "ids must be"),
        (Prompt(messages=[]), SamplingParams(), "messages", "empty conversation"),
    ],
    ids=["ids-long", "text-long", "chat-long", "empty", "out-of-vocab", "plus-max-tokens", "stop-id", "empty-chat"],
)
def test_errors_name_the_field_at_fault(
    processor: InputProcessor, prompt: Prompt, params: SamplingParams, field: str, message: str
) -> None:
    error = refused(processor, prompt, params)
    assert error.field == field and message in error.message
    assert str(error) == f"{field}: {error.message}"  # the gRPC status message, as before


def test_prompt_takes_exactly_one_input() -> None:
    with pytest.raises(InvalidInput) as none:
        Prompt()
    with pytest.raises(InvalidInput) as two:
        Prompt(text="a", token_ids=[1])
    assert none.value.field == two.value.field == "input"
    with pytest.raises(InvalidInput, match="only a chat") as tools:
        Prompt(text="a", tools=[WEATHER])
    assert tools.value.field == "tools"


def test_no_max_tokens_is_what_the_context_leaves(processor: InputProcessor) -> None:
    processed = processor.process(Prompt(token_ids=[5, 6, 7]), SamplingParams(max_tokens=None))
    assert processed.params.max_tokens == MAX_MODEL_LEN - 3
    capped = processor.process(Prompt(token_ids=[5, 6, 7]), SamplingParams(max_tokens=None), InputLimits(None, 10))
    assert capped.params.max_tokens == 10  # max_output_tokens caps the default: no error
    chat = processor.process(Prompt(messages=USER), SamplingParams(max_tokens=None))
    assert chat.params.max_tokens == MAX_MODEL_LEN - len(chat.prompt_token_ids)


def test_operator_limits_name_their_setting(processor: InputProcessor) -> None:
    settings = {"max_prompt_tokens": "setting A", "max_output_tokens": "setting B", "max_prompt_chars": "setting C"}
    error = refused(processor, Prompt(token_ids=[5] * 9), SamplingParams(), max_prompt_tokens=8, settings=settings)
    assert str(error) == "prompt: 9 tokens exceeds max_prompt_tokens (8; setting A)"
    error = refused(processor, Prompt(token_ids=[5]), SamplingParams(max_tokens=9), max_output_tokens=8)
    assert str(error) == "sampling.max_tokens: 9 exceeds max_output_tokens (8)"
    error = refused(processor, Prompt(messages=USER), SamplingParams(), max_prompt_chars=10, settings=settings)
    assert (
        error.field == "messages"
        and "the rendered chat exceeds" in error.message
        and "(10; setting C)" in error.message
    )


def test_a_chat_too_long_once_rendered_is_refused_before_it_is_tokenized(
    processor: InputProcessor, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded: list[str] = []
    monkeypatch.setattr(tokenizer, "encode", lambda text, *a, **k: encoded.append(text) or [1])
    refused(processor, Prompt(messages=USER), SamplingParams(), max_prompt_chars=10)
    assert encoded == []


def test_a_chat_is_rendered_and_tokenized_once(
    processor: InputProcessor, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    renders, encodes = [], []
    render, encode = tokenizer.apply_chat_template, tokenizer.encode
    monkeypatch.setattr(tokenizer, "apply_chat_template", lambda *a, **k: renders.append(1) or render(*a, **k))
    monkeypatch.setattr(tokenizer, "encode", lambda *a, **k: encodes.append(1) or encode(*a, **k))
    processed = processor.process(Prompt(messages=USER), SamplingParams(max_tokens=None))
    assert len(renders) == len(encodes) == 1
    assert processed.rendered == "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n"
    assert processed.prompt_token_ids == encode(processed.rendered, add_special_tokens=False)


def test_template_kwargs_reach_the_template(tokenizer: Tokenizer) -> None:
    tokenizer.chat_template = "{{ greeting }} {{ messages[0].content }}"
    processor = InputProcessor(tokenizer, MAX_MODEL_LEN, tokenizer.vocab_size)
    processed = processor.tokenize(Prompt(messages=USER, template_kwargs={"greeting": "Hi"}))
    assert processed.rendered == "Hi Hello world"


@pytest.fixture
def roomy(tokenizer: Tokenizer) -> InputProcessor:
    """Room for the tools' system message (hundreds of tokens with the tiny vocabulary)."""
    return InputProcessor(tokenizer, 2048, tokenizer.vocab_size)


def test_a_named_tool_constrains_the_output(roomy: InputProcessor) -> None:
    processor = roomy
    choice = ToolChoice(ToolChoiceMode.FUNCTION, "get_weather")
    processed = processor.process(Prompt(messages=USER, tools=[WEATHER], tool_choice=choice), SamplingParams())
    assert processed.params.constraint == Constraint.json_schema(WEATHER.schema)
    assert processed.parser() is not None
    compile_error = InvalidInput("json_schema", "does not compile: bad")
    assert str(processed.constraint_error(compile_error)) == "tools[0].parameters: does not compile: bad"
    required = processor.process(
        Prompt(messages=USER, tools=[WEATHER], tool_choice=ToolChoice(ToolChoiceMode.REQUIRED)), SamplingParams()
    )
    assert str(required.constraint_error(compile_error)) == "tools: the parameters of a tool does not compile: bad"
    free = processor.process(Prompt(messages=USER), SamplingParams(constraint=Constraint.regex("[")))
    regex_error = free.constraint_error(InvalidInput("regex", "does not compile: x"))
    assert str(regex_error) == "sampling.regex: does not compile: x"


@pytest.mark.parametrize("mode", list(ToolChoiceMode))
def test_every_tools_parameters_compile_whatever_the_tool_choice(roomy: InputProcessor, mode: ToolChoiceMode) -> None:
    time = Tool("get_time", parameters='{"type": "object", "properties": {"tz": {"type": "string"}}}')
    choice = ToolChoice(mode, "get_time" if mode is ToolChoiceMode.FUNCTION else "")
    processed = roomy.process(Prompt(messages=USER, tools=[WEATHER, time], tool_choice=choice), SamplingParams())
    fields = [field for field, _ in processed.constraints]
    assert fields[:2] == ["tools[0].parameters", "tools[1].parameters"]
    assert [c for _, c in processed.constraints][:2] == [WEATHER.constraint, time.constraint]
    assert fields[2:] == ([None] if mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.FUNCTION) else [])
    assert roomy.process(Prompt(messages=USER), SamplingParams()).constraints == []


def test_a_tool_constraint_and_a_sampling_constraint_conflict(roomy: InputProcessor) -> None:
    processor = roomy
    prompt = Prompt(messages=USER, tools=[WEATHER], tool_choice=ToolChoice(ToolChoiceMode.REQUIRED))
    error = refused(processor, prompt, SamplingParams(constraint=Constraint.regex("a+")))
    assert error.field == "tool_choice" and "sampling.regex cannot be set as well" in error.message


def test_the_core_does_not_check_again(monkeypatch: pytest.MonkeyPatch) -> None:
    core, _ = fake_core(max_model_len=MAX_MODEL_LEN)
    llm = LLM.from_core(core)
    calls: list[Prompt] = []
    process = core.processor.process
    monkeypatch.setattr(core.processor, "process", lambda p, *a: calls.append(p) or process(p, *a))
    outs = llm.generate([[5, 6], "Hello"], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [2, 2]
    assert len(calls) == 2  # one check per request, none in the core


def test_a_template_failure_is_refused_as_the_templates_fault(processor: InputProcessor, tokenizer: Tokenizer) -> None:
    tokenizer.chat_template = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"  # RecursionError: a 500 before
    error = refused(processor, Prompt(messages=USER), SamplingParams())
    assert error.field == "messages" and error.reason is Refusal.TEMPLATE_FAILED
    assert "the chat template failed: RecursionError" in error.message


def test_a_template_that_grows_without_end_is_stopped_at_the_rendered_chats_bound(
    processor: InputProcessor, tokenizer: Tokenizer
) -> None:
    tokenizer.chat_template = "{% for i in range(100000) %}{% for j in range(100000) %}xxxx{% endfor %}{% endfor %}"
    error = refused(processor, Prompt(messages=USER), SamplingParams(), max_prompt_chars=1000)
    assert error.reason is Refusal.CONTEXT_LENGTH and "the rendered chat exceeds max_prompt_chars (1000)" in str(error)
    error = refused(processor, Prompt(messages=USER), SamplingParams())  # no operator bound: 16 a token
    assert error.reason is Refusal.CONTEXT_LENGTH and f"{16 * MAX_MODEL_LEN} characters" in str(error)
