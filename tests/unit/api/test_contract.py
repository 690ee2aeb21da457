"""The shared names of the contract, as users of each side see them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from infer.api import CHAT_ROLES, FINISH_REASONS, REQUEST_ID, SERVICE_NAME, UNARY_METHODS, pb
from infer.server.gateway.schemas import ChatMessage


def test_every_finish_reason_of_the_proto_has_an_openai_word() -> None:
    reasons = {v.number for v in pb.FinishReason.DESCRIPTOR.values} - {pb.FINISH_REASON_UNSPECIFIED}
    assert set(FINISH_REASONS) == reasons
    assert sorted(FINISH_REASONS.values()) == ["length", "stop", "tool_calls"]


def test_the_service_and_its_methods() -> None:
    assert SERVICE_NAME == "infer.v1.InferenceService"
    assert sorted(UNARY_METHODS) == ["GetModelInfo", "Tokenize"]  # Generate streams


def test_a_request_id_is_1_to_128_visible_ascii_characters() -> None:
    assert REQUEST_ID.match("a" * 128) and REQUEST_ID.match("chatcmpl-1~!")
    assert not any(REQUEST_ID.match(s) for s in ("", "a" * 129, "a b", "é", "a\n"))


@pytest.mark.parametrize("role", CHAT_ROLES)
def test_the_gateway_takes_every_chat_role(role: str) -> None:
    assert ChatMessage.model_validate({"role": role, "content": "x"}).role == role


def test_the_gateway_refuses_another_role() -> None:
    with pytest.raises(ValidationError, match="system"):
        ChatMessage.model_validate({"role": "narrator", "content": "x"})
