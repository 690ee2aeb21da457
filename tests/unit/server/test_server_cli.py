"""The `infer` command line: `serve` takes every setting, `client` stays light (no torch import)."""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infer.server.cli import build_parser
from infer.server.settings import SETTINGS, config_from_args


def test_serve_takes_every_setting_as_a_flag() -> None:
    argv = ["serve", "--grpc-port", "0", "--max-num-seqs", "4", "--no-enable-prefix-caching"]
    args = build_parser(argv).parse_args(argv)
    assert all(hasattr(args, s.name) for s in SETTINGS)
    assert (args.grpc_port, args.max_num_seqs, args.enable_prefix_caching) == (0, 4, False)


def test_serve_reads_off_ports_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gRPC-only server (what the Helm chart runs behind a separate gateway): the gateway's flags share
    INFER_HTTP_PORT but must not parse it unless `infer gateway` runs."""
    monkeypatch.setenv("INFER_HTTP_PORT", "off")
    monkeypatch.setenv("INFER_METRICS_PORT", "off")
    config = config_from_args(build_parser(["serve"]).parse_args(["serve"]))
    assert (config.http_port, config.metrics_port) == (None, None)
    with pytest.raises(SystemExit):  # the gateway itself needs a port
        build_parser(["gateway"]).parse_args(["gateway"])


def test_client_commands_do_not_import_the_engine() -> None:
    code = (
        "import sys\n"
        "from infer.server.cli import build_parser\n"
        "argv = ['client', '--address', 'h:1', 'generate', 'Hi', '--chat']\n"
        "args = build_parser(argv).parse_args(argv)\n"
        "assert (args.address, args.prompt, args.chat) == ('h:1', 'Hi', True)\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_prepare_model_prints_the_converted_default_model(default_model_dir: Path, tmp_path: Path) -> None:
    """`infer prepare-model` (an image build step) finds a converted model under $XDG_CACHE_HOME/infer/models."""
    models = tmp_path / "infer" / "models"
    models.mkdir(parents=True)
    (models / default_model_dir.name).symlink_to(default_model_dir)
    env = os.environ | {"XDG_CACHE_HOME": str(tmp_path)}
    cmd = [sys.executable, "-m", "infer", "prepare-model"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{models / default_model_dir.name}\n"
    assert result.stderr == ""  # nothing converted again


def test_generate_takes_a_quantization_and_refuses_an_unknown_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import infer.engine
    from infer.server.cli import main

    seen: dict[str, object] = {}

    class _StoppedError(Exception):
        pass

    def fake_llm(model: str | None, **settings: object) -> None:
        seen.update(settings)
        raise _StoppedError

    monkeypatch.setattr(infer.engine, "LLM", fake_llm)
    with pytest.raises(_StoppedError):
        main(["generate", "Hi", "--quantization", "int4"])
    assert seen["quantization"] == "int4"
    monkeypatch.undo()
    assert main(["generate", "Hi", "--quantization", "fp8"]) == 2
    assert "quantization: must be one of auto, none, int8, int4" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "has_client_commands"),
    [
        (["serve"], False),
        (["--log-level", "DEBUG", "serve", "--grpc-port", "0"], False),
        (["--log-level", "serve", "health"], True),  # `serve` as the log level's value names no command
        (["bench", "--help"], True),
        (["generate", "serve"], True),  # a prompt that says serve
    ],
)
def test_a_parser_for_serve_leaves_out_the_client_side_commands(argv: list[str], has_client_commands: bool) -> None:
    """Start-up time: their parsers import the clients and the gateway, which `infer serve` does not need."""
    parser = build_parser(argv)
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"generate", "serve", "prepare-model"} <= set(commands)
    assert ({"client", "health", "bench", "gateway"} <= set(commands)) is has_client_commands


def test_serve_starts_without_the_cyclic_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start-up time: torch's import and a model's load make millions of objects and no cyclic garbage; `infer
    serve` pauses the collector before its first import (`app.serve` turns it back on once SERVING, a failed
    start here); other commands keep it."""
    from infer.server import cli

    seen: list[bool] = []
    monkeypatch.setattr(cli, "_serve", lambda args: seen.append(gc.isenabled()) or 0)
    monkeypatch.setattr(cli, "_prepare_model", lambda args: seen.append(gc.isenabled()) or 0)
    try:
        assert cli.main(["serve", "--grpc-port", "0"]) == 0
        assert gc.isenabled()
        assert cli.main(["prepare-model"]) == 0
    finally:
        gc.enable()
    assert seen == [False, True]


def test_a_gateway_free_serve_imports_no_gateway_app() -> None:
    """The settings read `gateway.origins`; the package's names (its app, a web framework and schemas, 0.4 s of
    start-up) load on first use only, and its public import paths keep working."""
    code = (
        "import sys\n"
        "import infer.server.settings, infer.server.app\n"
        "assert 'infer.server.gateway.app' not in sys.modules, 'the gateway app imported'\n"
        "assert 'uvicorn' not in sys.modules, 'uvicorn imported'\n"
        "from infer.server.gateway import GatewayConfig, add_gateway_parser, create_app\n"
        "import infer.server.gateway.app as app\n"
        "assert create_app is app.create_app and GatewayConfig is app.GatewayConfig\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
