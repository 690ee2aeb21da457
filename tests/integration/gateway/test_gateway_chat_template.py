"""A chat template that fails or runs without end, served: every chat is a 400 naming the template (a 500 before),
gRPC INVALID_ARGUMENT with CHAT_TEMPLATE_FAILED, and plain completions go on meanwhile (the prompt threads were
tied up before)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest

from infer.api import ErrorReason, error_reason, pb, pb_grpc
from tests.integration.grpc_helpers import ServerThread, running_fake_server
from tests.unit.server.gateway.gateway_helpers import error_of, first_model

CHAT = [{"role": "user", "content": "Hello"}]
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_fake_server(max_model_len=256, num_blocks=64) as s:
        tokenizer = s.engine.tokenizer
        template, timeout_s = tokenizer.chat_template, tokenizer.template_timeout_s
        yield s
        tokenizer.chat_template, tokenizer.template_timeout_s = template, timeout_s


@pytest.mark.parametrize(
    ("template", "words"),
    [("{{ 1 // 0 }}", "ZeroDivisionError"), ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
     (NESTED_LOOPS, "ran past its time bound")],
    ids=["zero", "recursion", "loops"],
)  # fmt: skip
def test_a_failing_template_is_a_400_naming_it(
    server: ServerThread, http: httpx.Client, template: str, words: str
) -> None:
    tokenizer = server.engine.tokenizer
    tokenizer.chat_template, tokenizer.template_timeout_s = template, 0.2  # NOTE: a short bound, for tests only
    body = {"model": first_model(http), "messages": CHAT, "max_tokens": 2}
    for path in ("/v1/chat/completions", "/v1/chat/completions/render"):
        error = error_of(http.post(path, json=body), 400)
        assert error["code"] == "chat_template_error" and error["param"] == "messages"
        assert "the chat template failed" in error["message"] or "the chat template ran" in error["message"]
        assert words in error["message"]
    chat = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="Hello")])
    with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as refused:
        list(pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest(messages=chat)))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(refused.value.trailing_metadata()) is ErrorReason.CHAT_TEMPLATE_FAILED


def test_completions_go_on_while_chats_run_into_the_time_bound(server: ServerThread, http: httpx.Client) -> None:
    tokenizer = server.engine.tokenizer
    tokenizer.chat_template, tokenizer.template_timeout_s = NESTED_LOOPS, 0.5
    model = first_model(http)
    chat = {"model": model, "messages": CHAT, "max_tokens": 2}
    with ThreadPoolExecutor(4) as pool:
        chats = [pool.submit(http.post, "/v1/chat/completions", json=chat) for _ in range(4)]
        time.sleep(0.1)  # both prompt threads busy with the template
        started = time.monotonic()
        completion = http.post("/v1/completions", json={"model": model, "prompt": "Hello", "max_tokens": 2})
        assert completion.status_code == 200 and time.monotonic() - started < 2.0
        assert [c.result().status_code for c in chats] == [400] * 4
