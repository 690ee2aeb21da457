"""The wheel users install: built from the tracked files, installed non-editable outside the tree, served.

The editable development install reads everything from the checkout, so it hides package data that the
wheel lacks (the C++ sources of the compiled kernels were such a case). Here the wheel goes into a fresh
virtual environment in a temporary folder; its dependencies come from the test's own environment through a
plain path entry (the development tree's editable finder is not activated by it), and `infer` must import
from the wheel's copy.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.compiled import require_compiled_kernels

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "What is the capital of France?"
ANSWER = "The capital of France is Paris."
# pyproject.toml's package-dir: a folder of the tree -> its place in the installed `infer`
PACKAGE_DIRS = {"infer": "", **{name: f"{name}/" for name in ("api", "engine", "kernels", "server", "clients")}}


def _tree_files() -> list[str]:
    """What a fresh clone holds: the tracked files (and new ones not ignored, less deleted ones), nothing built."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    )  # fmt: skip
    return [name for name in listing.stdout.decode().split("\0") if name and (ROOT / name).is_file()]


def _package_files() -> set[str]:
    """What the installed `infer` must hold, relative to it: every module and stub of the package folders, the
    compiled kernels' C++ sources (built where the wheel is installed) and py.typed."""
    files = set()
    for name in _tree_files():
        top, _, rest = name.partition("/")
        shipped = name.endswith((".py", ".pyi")) or name == "infer/py.typed"
        if top in PACKAGE_DIRS and (shipped or (top == "kernels" and rest.startswith("csrc/"))):
            files.add(PACKAGE_DIRS[top] + rest)
    return files


def _copy_tracked_files(dest: Path) -> None:
    for name in _tree_files():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv outside the tree with the wheel installed (no editable finder); returns its bin folder."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to list the tracked files")
    work = tmp_path_factory.mktemp("wheel")
    src, dist, venv = work / "src", work / "dist", work / "venv"
    _copy_tracked_files(src)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)], check=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (site / "deps-from-the-test-env.pth").write_text(sysconfig.get_path("purelib") + "\n")
    (wheel,) = dist.glob("infer-*.whl")
    subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps", str(wheel)], check=True)
    return venv / "bin"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "INFER_KERNELS")}
    return env | {"PYTHONUNBUFFERED": "1", **extra}


def test_the_wheel_carries_what_runs(wheel_env: Path, tmp_path: Path) -> None:
    """The installed package holds exactly the tree's modules and kernel sources: one missing (a subpackage not
    listed in pyproject.toml, a source left out of the package data) or one too many fails."""
    code = (
        "import infer, pathlib\n"
        "root = pathlib.Path(infer.__file__).parent\n"
        "print(root)\n"
        "for p in sorted(root.rglob('*')):\n"
        "    if p.is_file() and '__pycache__' not in p.parts: print(p.relative_to(root).as_posix())\n"
    )
    run = subprocess.run([wheel_env / "python", "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    location, *installed = run.stdout.splitlines()
    assert Path(location).is_relative_to(wheel_env.parent), f"infer imported from {location}, not the wheel"
    expected = _package_files()
    assert {"kernels/csrc/dense_linear.cpp", "kernels/csrc/common.h", "py.typed"} <= expected  # the listing works
    missing, extra = sorted(expected - set(installed)), sorted(set(installed) - expected)
    assert set(installed) == expected, f"missing from the wheel: {missing}; not in the tree: {extra}"


class Served:
    """`infer serve` from the wheel's console script, in a folder outside the tree."""

    def __init__(self, bin_dir: Path, model_dir: Path, cwd: Path) -> None:
        cmd = [str(bin_dir / "infer"), "serve", "--grpc-port", "0", "--http-port", "0", "--metrics-port", "off"]
        cmd += ["--model", str(model_dir), "--max-model-len", "256", "--num-blocks", "64"]
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=_env(), stderr=subprocess.PIPE, text=True)
        self.log: list[str] = []
        self.http_port = 0
        self._listening = threading.Event()
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            if m := re.search(r"OpenAI gateway on http://[\d.]+:(\d+)", line):
                self.http_port = int(m.group(1))
                self._listening.set()

    def wait_until_serving(self, timeout_s: float) -> str:
        assert self._listening.wait(timeout_s), "".join(self.log)
        base, deadline = f"http://127.0.0.1:{self.http_port}", time.monotonic() + timeout_s
        while httpx.get(f"{base}/health").status_code != 200:
            assert self.proc.poll() is None and time.monotonic() < deadline, "".join(self.log)
            time.sleep(0.2)
        return base


@pytest.fixture
def served(wheel_env: Path, default_model_dir: Path, tmp_path: Path) -> Iterator[Served]:
    server = Served(wheel_env, default_model_dir, tmp_path)
    yield server
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait(10)


def test_the_installed_wheel_serves_a_greedy_answer(served: Served, default_model_dir: Path) -> None:
    require_compiled_kernels()  # built for this checkout (`make test` builds them first): the wheel finds the same
    base = served.wait_until_serving(timeout_s=180)
    messages = [{"role": "user", "content": QUESTION}]
    body = {"model": default_model_dir.name, "messages": messages, "max_tokens": 16, "temperature": 0}
    reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"].strip() == ANSWER
    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(60) == 0
    log = "".join(served.log)
    assert "compiled CPU kernels loaded from" in log, log


def test_without_a_build_the_wheel_runs_the_references_and_says_so_once(
    wheel_env: Path, default_model_dir: Path, tmp_path: Path
) -> None:
    cmd = [str(wheel_env / "infer"), "generate", "--chat", QUESTION, "--max-tokens", "16"]
    cmd += ["--model", str(default_model_dir), "--max-model-len", "256"]
    env = _env(INFER_KERNEL_CACHE=str(tmp_path / "empty"))
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == ANSWER
    assert run.stderr.count("compiled CPU kernels not built") == 1, run.stderr
