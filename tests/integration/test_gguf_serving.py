"""`infer serve --model FILE.gguf` as users run it: a subprocess serving a GGUF file (its own bits, its own
tokenizer, a chat template from `--chat-template`) on both doors, gRPC and the OpenAI gateway, then SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from infer.clients import InferClient, Sampling
from tests.helpers.fake_engine import CHATML
from tests.helpers.tiny_gguf import write_tiny_gguf
from tests.integration.grpc_helpers import ServeProcess


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    folder = tmp_path_factory.mktemp("gguf")
    path = write_tiny_gguf(folder / "tiny-qwen2.gguf", "qwen2", num_layers=2, tied=False)
    (folder / "chatml.jinja").write_text(CHATML, encoding="utf-8")
    server = ServeProcess(path, "--chat-template", str(folder / "chatml.jinja"))
    try:
        InferClient(server.address).wait_until_serving(timeout_s=120)
        yield server
    finally:
        server.kill()


def test_grpc_serves_the_file(served: ServeProcess) -> None:
    with InferClient(served.address, timeout_s=60) as client:
        info = client.model_info()
        completion = client.complete("Hello", Sampling(max_tokens=8, temperature=0, ignore_eos=True))
    assert info.model_id == "tiny-qwen2" and info.vocab_size == 256 and info.has_chat_template
    assert len(completion.token_ids) == 8 and completion.finish_reason == "length"


def test_the_gateway_serves_its_chat(served: ServeProcess) -> None:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{served.http_port}/v1", api_key="unused", timeout=60)
    [model] = client.models.list().data
    reply = client.chat.completions.create(
        model=model.id, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
    )
    assert model.id == "tiny-qwen2"
    assert reply.usage is not None and reply.usage.completion_tokens == 4


def test_sigterm_stops_it_cleanly(served: ServeProcess) -> None:
    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(60) == 0


def test_a_corrupt_file_exits_2_naming_it(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "cut.gguf", "llama", num_layers=1)
    path.write_bytes(path.read_bytes()[:5000])
    cmd = [sys.executable, "-m", "infer", "serve", "--grpc-port", "0", "--http-port", "off", "--metrics-port", "off",
           "--model", str(path)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "cut.gguf" in out.stderr and "Traceback" not in out.stderr
