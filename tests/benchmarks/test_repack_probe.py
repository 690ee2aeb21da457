"""llama-server's repack probe (benchmarks/serving_servers.py) on a fake llama-server: a faulting repacked path
(the AMX fault: the first request kills the process) makes every harness run it with `--no-repack` and say so;
a healthy one runs as it is, with nothing to say."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import offline_matrix  # noqa: E402
import serving_peers  # noqa: E402
import serving_servers  # noqa: E402
from serving_servers import NO_REPACK, RepackProbe, repack_probe  # noqa: E402

# NOTE: `mode` amx: the first completion without --no-repack dies by SIGSEGV, as llama.cpp's AMX matmul does;
# broken: every completion dies; ok: all answer
FAKE_LLAMA_SERVER = """#!{python}
import json, os, resource, signal, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

MODE = {mode!r}
with open(os.path.join({calls_dir!r}, str(os.getpid())), "w") as f:
    f.write(" ".join(sys.argv[1:]))
no_repack = "--no-repack" in sys.argv


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self._answer({{"status": "ok"}})

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        if MODE == "broken" or (MODE == "amx" and not no_repack):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.kill(os.getpid(), signal.SIGSEGV)
        self._answer({{"choices": [{{"text": " world", "index": 0, "finish_reason": "length"}}]}})

    def _answer(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), Handler).serve_forever()
"""


def _write_fake(tmp_path: Path, mode: str) -> tuple[Path, Path]:
    """A fake llama-server, and the folder where each of its starts writes its arguments."""
    calls = tmp_path / "calls"
    calls.mkdir()
    binary = tmp_path / f"llama-server-{mode}"
    binary.write_text(FAKE_LLAMA_SERVER.format(python=sys.executable, mode=mode, calls_dir=str(calls)))
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary, calls


def _fake_llama(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> Path:
    """Install a fake llama-server; returns the folder where each start writes its arguments."""
    binary, calls = _write_fake(tmp_path, mode)
    monkeypatch.setattr(serving_servers, "LLAMA_SERVER", binary)
    monkeypatch.setattr(serving_servers, "_probes", {})
    monkeypatch.setattr(serving_servers, "smollm2_gguf", lambda: tmp_path / "model.gguf")
    return calls


def _starts(calls: Path) -> list[str]:
    return [p.read_text() for p in calls.iterdir()]


def test_a_repacked_path_that_dies_on_its_first_token_means_no_repack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_llama(tmp_path, monkeypatch, "amx")
    probe = repack_probe(tmp_path)
    assert probe.faults and probe.flags == NO_REPACK
    assert probe.repacked == "died: SIGSEGV" and probe.no_repack is None
    (note,) = probe.notes()
    assert "`--no-repack`" in note and "SIGSEGV" in note and "AMX" in note
    assert repack_probe(tmp_path) is probe and len(_starts(calls)) == 2  # probed once


def test_a_healthy_llama_server_runs_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_llama(tmp_path, monkeypatch, "ok")
    probe = repack_probe(tmp_path)
    assert not probe.faults and probe.flags == () and probe.notes() == []
    assert len(_starts(calls)) == 1 and "--no-repack" not in _starts(calls)[0]


def test_a_llama_server_that_fails_either_way_is_not_a_repack_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_llama(tmp_path, monkeypatch, "broken")
    probe = repack_probe(tmp_path)
    assert not probe.faults and probe.flags == ()
    (note,) = probe.notes()
    assert "with and without `--no-repack`" in note


@pytest.mark.parametrize(
    ("repacked", "no_repack", "flags"),
    [(None, None, ()), ("died: SIGILL", None, NO_REPACK), ("died: SIGILL", "died: SIGILL", ())],
)
def test_the_decision(repacked: str | None, no_repack: str | None, flags: tuple[str, ...]) -> None:
    assert RepackProbe(repacked, no_repack).flags == flags


def _one_token(http: str) -> int:
    body = {"prompt": "Hello", "max_tokens": 1}
    try:
        return httpx.post(f"{http}/completions", json=body, timeout=10).status_code
    except httpx.HTTPError:
        return 0


def test_the_harnesses_start_llama_server_with_the_probes_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_llama(tmp_path, monkeypatch, "amx")
    with serving_peers._server(serving_peers.LLAMA, cast(Any, None), 512, tmp_path) as server:  # bench-serving
        assert _one_token(server.http) == 200
    with offline_matrix._maybe_llama(True, 512) as server:  # bench-offline's matrix
        assert server is not None and _one_token(server.http) == 200
    assert sum("--no-repack" in start for start in _starts(calls)) == 3  # the probe's second start, and both


@pytest.mark.parametrize(("mode", "said"), [("amx", "ran with `--no-repack`"), ("ok", "no `--no-repack` needed")])
def test_make_peers_says_whether_no_repack_is_needed(tmp_path: Path, mode: str, said: str) -> None:
    binary, _ = _write_fake(tmp_path, mode)
    env = os.environ | {"INFER_LLAMA_SERVER": str(binary)}
    out = subprocess.run([sys.executable, str(BENCHMARKS / "serving_servers.py")], env=env, capture_output=True,
                         text=True, timeout=120, check=True)  # fmt: skip
    assert said in out.stdout
