"""`make test-image [DEVICE=cuda]`: build the CPU (or CUDA) image with podman and run it as users do, then print its
figures.

    python -m tests.image.check_image [--device cpu|cuda] [--image NAME] [--no-build]

Podman (and runc) come from apt where missing. When the Dockerfile's base cannot be pulled (no registry answers
here), a Debian bookworm base made with debootstrap is built once and passed as BASE_IMAGE. The build gets the
host's pip settings (`pip config list`): its CA bundle, and torch's CPU wheel from a find-links folder (the CUDA
image's torch and triton come from the package index). The container runs read-only with a tmpfs /tmp, as the
image's non-root user, no GPU passed in; it must pass its HEALTHCHECK, answer the chat question over HTTP and over
gRPC and exit 0 on SIGTERM. The CPU image logs its compiled CPU kernels in use and holds no compiler; the CUDA image
holds torch's CUDA build and the C compiler Triton needs, and logs that it serves on the CPU, finding no GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from infer.clients import InferClient, Sampling
from tests.deploy.chart import REPO
from tests.image import host

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
ANSWER = "The capital of France is Paris."
# what works on this machine (docs/deployment.md#docker): chroot isolation and the host network for the build;
# runc (crun fails on setrlimit here) and explicit ulimits for the container
BUILD_FLAGS = ("--isolation", "chroot", "--network", "host")
RUN_FLAGS = ("--runtime", "runc", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=8192:8192")


@dataclass(frozen=True)
class Device:
    """What the image built for one DEVICE shows when it runs here, with no GPU passed into its container."""

    log: str  # a pattern its log must match
    cuda: bool  # torch's CUDA build and a C compiler (Triton builds its driver stub with one) in the runtime


DEVICES = {
    "cpu": Device(log=re.escape("compiled CPU kernels loaded from /opt/infer/kernels"), cuda=False),
    # server/app.py's on_available_device: INFER_DEVICE=cuda, no GPU seen
    "cuda": Device(log=r"device cuda asked for, but torch \S+ finds no CUDA device.*: serving on the CPU", cuda=True),
}
# whether torch is a CUDA build (triton is in both images: xgrammar asks for it)
TORCH_PROBE = "import torch, triton; print(torch.version.cuda is not None)"
SERVING_TIMEOUT_S = 300
STOP_TIMEOUT_S = 90


@dataclass(frozen=True)
class Figures:
    device: str
    image_size_bytes: int
    build_s: float | None
    serving_s: float
    first_request_s: float
    grpc_request_s: float

    def report(self) -> str:
        build = f"{self.build_s:.0f} s" if self.build_s is not None else "not built (--no-build)"
        return "\n".join([
            f"image size:             {self.image_size_bytes / 1e9:.2f} GB ({self.image_size_bytes} bytes, "
            f"DEVICE={self.device})",
            f"build:                  {build}",
            f"time to SERVING:        {self.serving_s:.1f} s (podman run -> grpc.health.v1 SERVING)",
            f"first request (HTTP):   {self.first_request_s:.2f} s (chat completion, greedy, {ANSWER!r})",
            f"then one gRPC Generate: {self.grpc_request_s:.2f} s",
        ])  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def podman(*args: str, timeout_s: float = 120, check: bool = True) -> str:
    return host.run(["podman", *args], timeout_s=timeout_s, check=check).strip()


def build(image: str, device: str) -> float:
    """`make image DEVICE=device` with podman, the flags that work here and the host's pip settings; seconds taken."""
    host.ensure_packages(host.PACKAGES)
    base = host.base_image()
    settings = host.PipSettings.parse(host.run([sys.executable, "-m", "pip", "config", "list"], timeout_s=60))
    make_vars = host.image_make_vars(settings, torch_version(), BUILD_FLAGS, device)
    make_vars |= {"DOCKER": "podman", "IMAGE": image} | ({"BASE_IMAGE": base} if base else {})
    command = host.make_command("image", make_vars)
    print("+", " ".join(command), flush=True)
    start = time.perf_counter()
    if subprocess.run(command, timeout=3600).returncode != 0:
        raise SystemExit("make image failed")
    return time.perf_counter() - start


def torch_version() -> str:
    found = re.search(r"^TORCH := torch==(\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert found is not None, "the Makefile pins torch as `TORCH := torch==<version>`"
    return found[1]


def _post_json(url: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        answer: dict[str, Any] = json.load(response)
    return answer


def _chat_over_http(http_port: int) -> str:
    base = f"http://127.0.0.1:{http_port}/v1"
    with urllib.request.urlopen(f"{base}/models", timeout=30) as response:
        model = json.load(response)["data"][0]["id"]
    body = {"model": model, "messages": QUESTION, "max_tokens": 24, "temperature": 0}
    answer = _post_json(f"{base}/chat/completions", body, timeout_s=120)
    return str(answer["choices"][0]["message"]["content"])


class Container:
    """One `podman run -d` of the image, removed on exit."""

    def __init__(self, image: str) -> None:
        self.image, self.name = image, f"infer-image-test-{int(time.time())}"
        self.grpc_port, self.http_port = _free_port(), _free_port()

    def start(self) -> None:
        env = {"INFER_GRPC_PORT": self.grpc_port, "INFER_HTTP_PORT": self.http_port, "INFER_METRICS_PORT": _free_port()}
        env_flags = [flag for k, v in env.items() for flag in ("--env", f"{k}={v}")]
        podman("run", "--detach", "--name", self.name, *RUN_FLAGS, "--read-only", "--tmpfs", "/tmp",
               "--network", "host", *env_flags, self.image)  # fmt: skip

    def exec(self, *command: str) -> str:
        return podman("exec", self.name, *command)

    def logs(self) -> str:
        logs = subprocess.run(["podman", "logs", self.name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=60)  # fmt: skip
        return logs.stdout

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        podman("rm", "--force", "--time", "0", self.name, check=False)


def check(condition: bool, what: str, container: Container) -> None:
    if not condition:
        raise AssertionError(f"{what}\n--- container log ---\n{container.logs()}")


def _serve_and_ask(container: Container) -> tuple[float, float, float]:
    """Start it; the seconds to SERVING, to the first answer over HTTP, to an answer over gRPC (both greedy)."""
    start = time.perf_counter()
    container.start()
    with InferClient(f"127.0.0.1:{container.grpc_port}", timeout_s=10) as client:
        try:
            client.wait_until_serving(timeout_s=SERVING_TIMEOUT_S)
        except TimeoutError as e:
            check(False, str(e), container)
        serving_s = time.perf_counter() - start
        start = time.perf_counter()
        http_text = _chat_over_http(container.http_port)
        first_request_s = time.perf_counter() - start
        check(http_text.strip() == ANSWER, f"HTTP chat answered {http_text!r}", container)
        start = time.perf_counter()
        grpc_text = client.complete(QUESTION, Sampling(max_tokens=24, temperature=0.0), timeout_s=120).text
        grpc_request_s = time.perf_counter() - start
        check(grpc_text.strip() == ANSWER, f"gRPC Generate answered {grpc_text!r}", container)
    return serving_s, first_request_s, grpc_request_s


def _inspect(container: Container, device: Device) -> None:
    """HEALTHCHECK passes; non-root; everything readable by that user; CUDA torch and a compiler only in the CUDA
    image; the device's line in the log."""
    health = subprocess.run(["podman", "healthcheck", "run", container.name], capture_output=True, text=True)
    check(health.returncode == 0, f"podman healthcheck run: {health.stdout}{health.stderr}", container)
    check(container.exec("id", "-u") == "10001", "the server does not run as uid 10001", container)
    unreadable = container.exec("find", "/opt/infer", "/opt/venv", "!", "-readable")
    check(unreadable == "", f"unreadable by the runtime user:\n{unreadable}", container)
    compilers = container.exec("sh", "-c", "command -v gcc cc g++ c++ clang || true")
    check((compilers != "") == device.cuda, f"compilers in the runtime: {compilers or 'none'}", container)
    cuda_torch = container.exec("python", "-c", TORCH_PROBE)
    check(cuda_torch == str(device.cuda), f"torch is a CUDA build: {cuda_torch}", container)
    check(re.search(device.log, container.logs()) is not None, f"no line in the log matches {device.log!r}", container)


def run_checks(image: str, device: str, build_s: float | None) -> Figures:
    with Container(image) as container:
        serving_s, first_request_s, grpc_request_s = _serve_and_ask(container)
        _inspect(container, DEVICES[device])
        podman("kill", "--signal", "TERM", container.name)
        exit_code = podman("wait", container.name, timeout_s=STOP_TIMEOUT_S)
        check(exit_code == "0", f"exit code {exit_code} after SIGTERM", container)
    size = int(podman("image", "inspect", "--format", "{{.Size}}", image))
    return Figures(device, size, build_s, serving_s, first_request_s, grpc_request_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=tuple(DEVICES), default="cpu", help="the image's DEVICE build argument")
    parser.add_argument("--image", help="the tag to build and run (infer:test-image, -cuda for the CUDA image)")
    parser.add_argument("--no-build", action="store_true", help="run an image built before")
    args = parser.parse_args(argv)
    image = args.image or f"infer:test-image{'-cuda' if args.device == 'cuda' else ''}"
    build_s = None if args.no_build else build(image, args.device)
    figures = run_checks(image, args.device, build_s)
    print(f"make test-image: {image} passed\n{figures.report()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
