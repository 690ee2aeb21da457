"""The shared names of the contract, as users of each side see them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from infer.api import (
    API_KEY_METADATA,
    CHAT_ROLES,
    ERROR_REASON_KEY,
    FINISH_REASONS,
    INVALID_FIELD_KEY,
    REQUEST_ID,
    RETRY_AFTER_KEY,
    SERVICE_NAME,
    UNARY_METHODS,
    ErrorReason,
    bearer,
    bearer_key,
    error_reason,
    pb,
)
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


def test_the_error_metadata_keys_and_reasons_are_the_documented_words() -> None:
    keys = (ERROR_REASON_KEY, INVALID_FIELD_KEY, RETRY_AFTER_KEY)
    assert keys == ("infer-error-reason", "infer-invalid-field", "infer-retry-after-s")
    assert [r.value for r in ErrorReason] == [
        "INVALID_VALUE", "CONTEXT_LENGTH_EXCEEDED", "OVER_LIMIT", "DUPLICATE_REQUEST_ID", "DOES_NOT_COMPILE",
        "QUEUE_FULL", "NOT_SERVING", "BUDGET_EXCEEDED", "CHAT_TEMPLATE_FAILED",
    ]  # fmt: skip


def test_a_reason_is_read_from_the_trailing_metadata() -> None:
    trailing = [(INVALID_FIELD_KEY, "prompt"), (ERROR_REASON_KEY, "CONTEXT_LENGTH_EXCEEDED")]
    assert error_reason(trailing) is ErrorReason.CONTEXT_LENGTH_EXCEEDED
    assert error_reason([(INVALID_FIELD_KEY, "prompt")]) is None and error_reason(None) is None
    assert error_reason([(ERROR_REASON_KEY, "A_NEWER_SERVERS_REASON")]) is None


def test_an_api_key_travels_as_a_bearer_token() -> None:
    assert API_KEY_METADATA == "authorization" and bearer("k1") == "Bearer k1"
    assert [bearer_key(v) for v in ("Bearer k1", "bearer  k1 ", "BEARER k1")] == ["k1"] * 3
    assert [bearer_key(v) for v in (None, "", "Bearer", "Basic k1", "Bearerk1", "Bearer\tk1")] == [None] * 6
