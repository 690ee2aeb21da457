"""Proto <-> engine conversion: defaults, every sampling field, field names in errors, the final message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import pytest

from infer.clients.proto.v1 import inference_pb2 as pb
from infer.engine.request import FinishReason, RequestOutput, Timings, TokenLogprob, Usage
from infer.engine.sampling_params import SamplingParams
from infer.engine.tokenizer import Tokenizer
from infer.server import convert


class FakeTokenizer:
    """One token per character."""

    chat_template = "fake"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        if not messages:
            raise ValueError("cannot apply a chat template to an empty conversation")
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<a>" if add_generation_prompt else "")


TOKENIZER = cast(Tokenizer, FakeTokenizer())


def test_unset_sampling_fields_keep_the_engine_defaults() -> None:
    assert convert.sampling_params(pb.SamplingParams()) == SamplingParams()


def test_every_sampling_field_is_carried() -> None:
    values: dict[str, Any] = {
        "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "seed": 123, "stop": ["\n"], "stop_token_ids": [2],
        "min_tokens": 1, "ignore_eos": True, "logprobs": 0, "skip_special_tokens": False,
    }  # fmt: skip
    params = convert.sampling_params(pb.SamplingParams(**values))
    assert params == SamplingParams(**values)
    assert {f.name for f in pb.SamplingParams.DESCRIPTOR.fields} == set(SamplingParams.__dataclass_fields__)


def test_sampling_errors_name_the_proto_field() -> None:
    with pytest.raises(ValueError, match=r"^sampling\.top_k: "):
        convert.sampling_params(pb.SamplingParams(top_k=-1))


def test_prompt_from_text_ids_or_messages() -> None:
    assert convert.prompt_token_ids(pb.GenerateRequest(prompt="hi"), TOKENIZER) == [1, 104, 105]
    assert convert.prompt_token_ids(pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 6])), TOKENIZER) == [5, 6]
    chat = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="x")])
    assert convert.prompt_token_ids(pb.GenerateRequest(messages=chat), TOKENIZER) == [ord(c) for c in "<user>x<a>"]
    with pytest.raises(ValueError, match=r"^input: "):
        convert.prompt_token_ids(pb.GenerateRequest(), TOKENIZER)
    with pytest.raises(ValueError, match=r"^messages: "):
        convert.prompt_token_ids(pb.GenerateRequest(messages=pb.ChatMessages()), TOKENIZER)


def test_deltas_carry_tokens_and_only_the_last_carries_usage() -> None:
    lp = TokenLogprob(token_id=104, logprob=-0.5, top=((104, -0.5), (105, -1.5)))
    delta = convert.generate_response(RequestOutput("r", [104], "h", [lp]), TOKENIZER)
    assert (list(delta.token_ids), delta.text, delta.finish_reason) == ([104], "h", pb.FINISH_REASON_UNSPECIFIED)
    assert not delta.HasField("usage") and not delta.HasField("timings")
    assert delta.logprobs[0].token == "h" and [t.token for t in delta.logprobs[0].top] == ["h", "i"]
    last = RequestOutput("r", [105], "i", None, FinishReason.LENGTH, Usage(3, 2, 0), Timings(0.1, 0.2, 0.3, 1))
    final = convert.generate_response(last, TOKENIZER)
    assert final.finish_reason == pb.FINISH_REASON_LENGTH and not final.logprobs
    assert (final.usage.prompt_tokens, final.usage.completion_tokens, final.usage.cached_tokens) == (3, 2, 0)
    assert final.timings.total_s == pytest.approx(0.3) and final.timings.num_preemptions == 1


def test_tokenize_text_and_chat() -> None:
    assert list(convert.tokenize(pb.TokenizeRequest(text="a"), TOKENIZER).token_ids) == [1, 97]
    no_special = pb.TokenizeRequest(text="a", add_special_tokens=False)
    assert list(convert.tokenize(no_special, TOKENIZER).token_ids) == [97]
    chat = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="x")])
    response = convert.tokenize(pb.TokenizeRequest(messages=chat, add_generation_prompt=False), TOKENIZER)
    assert response.text == "<user>x" and list(response.token_ids) == [ord(c) for c in "<user>x"]
