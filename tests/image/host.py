"""The host side of `make test-image`: podman from apt where missing, a base image where no registry answers,
and the host's pip settings turned into `make image` arguments."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.deploy.chart import REPO

# podman (and its OCI runtime: crun fails on setrlimit with this machine's cgroups, runc works)
PACKAGES = ("podman", "runc", "uidmap")
# a Debian bookworm root filesystem with what the Dockerfile's stages need from their base
LOCAL_BASE = "localhost/infer-base:bookworm-debootstrap"
DEBOOTSTRAP_INCLUDE = "python3,python3-venv,python-is-python3,ca-certificates"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
PULL_TIMEOUT_S = 120
# pip's configuration scopes, lowest priority first (`pip config list` prints `scope.key='value'`)
_SCOPES = ("global", "user", "site", ":env:")
_CONFIG_LINE = re.compile(r"^(?P<scope>[^.]*|:env:)\.(?P<key>[\w-]+)='(?P<value>.*)'$")


def run(cmd: Sequence[str], *, timeout_s: float, check: bool = True, **kwargs: object) -> str:
    """Run a command; its stdout, or a RuntimeError that shows its output."""
    result = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s, **kwargs)  # type: ignore[call-overload]
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return str(result.stdout)


def _installed(package: str) -> bool:
    result = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return result.returncode == 0 and result.stdout.endswith(" installed")


def ensure_packages(packages: Sequence[str]) -> list[str]:
    """apt-get install what is missing (a refresh of the package lists once, if the install fails); the list."""
    if shutil.which("dpkg-query") is None:
        raise RuntimeError(f"no dpkg here: install {', '.join(packages)} with this system's package manager")
    missing = [p for p in packages if not _installed(p)]
    if not missing:
        return []
    if os.geteuid() != 0:
        raise RuntimeError(f"apt-get install {' '.join(missing)} needs root")
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=600", *missing]
    if subprocess.run(install, env=env, capture_output=True, timeout=1200).returncode != 0:
        run(["apt-get", "update"], timeout_s=600, env=env)
        run(install, timeout_s=1200, env=env)
    return missing


def dockerfile_base() -> str:
    """The default of the Dockerfile's global `ARG BASE_IMAGE=...`."""
    found = re.search(r"^ARG BASE_IMAGE=(\S+)$", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError("the Dockerfile has no `ARG BASE_IMAGE=<default>`")
    return found[1]


def _podman_has(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image], capture_output=True).returncode == 0


def base_image(podman_flags: Sequence[str] = ()) -> str | None:
    """None when podman has or can pull the Dockerfile's base; else a local bookworm base (made once), its name."""
    wanted = dockerfile_base()
    if _podman_has(wanted):
        return None
    try:
        pulled = subprocess.run(["podman", "pull", *podman_flags, wanted], capture_output=True, timeout=PULL_TIMEOUT_S)
        if pulled.returncode == 0:
            return None
    except subprocess.TimeoutExpired:
        pass
    if not _podman_has(LOCAL_BASE):
        make_local_base(LOCAL_BASE)
    return LOCAL_BASE


def make_local_base(name: str) -> None:
    """debootstrap a minimal bookworm with python 3.11, then `podman import` it as `name` (~3 minutes)."""
    ensure_packages(["debootstrap"])
    with tempfile.TemporaryDirectory(prefix="infer-base-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        cmd = ["debootstrap", "--variant=minbase", f"--include={DEBOOTSTRAP_INCLUDE}", "bookworm", str(rootfs)]
        run([*cmd, DEBIAN_MIRROR], timeout_s=1800)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["podman", "import", "--change", 'CMD ["python3"]', "-", name],
                                  stdin=tar.stdout, capture_output=True, text=True, timeout=600)  # fmt: skip
        tar.wait(60)
        if imported.returncode != 0 or tar.returncode != 0:
            raise RuntimeError(f"podman import {name} failed:\n{imported.stderr}")


@dataclass(frozen=True)
class PipSettings:
    """What the host's pip is told about where packages come from (`pip config list`)."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    cert: str | None = None

    @classmethod
    def parse(cls, config_list: str) -> PipSettings:
        """The effective values: an environment variable over the site, user and global files."""
        best: dict[str, tuple[int, str]] = {}
        for line in config_list.splitlines():
            found = _CONFIG_LINE.match(line.strip())
            if found is None or found["scope"] not in _SCOPES:
                continue
            rank = _SCOPES.index(found["scope"])
            if rank >= best.get(found["key"], (-1, ""))[0]:
                best[found["key"]] = (rank, found["value"])
        values = {key: value for key, (_, value) in best.items()}
        return cls(
            index_url=values.get("index-url"),
            extra_index_urls=tuple(values.get("extra-index-url", "").split()),
            find_links=tuple(values.get("find-links", "").split()),
            cert=values.get("cert"),
        )


def torch_wheels_dir(settings: PipSettings, torch_version: str) -> str | None:
    """The first local find-links folder that holds torch's CPU wheel for CPython 3.11 on x86-64 Linux."""
    pattern = re.compile(rf"torch-{re.escape(torch_version)}\+cpu-cp311-cp311-.*x86_64\.whl")
    for link in settings.find_links:
        folder = Path(link.removeprefix("file://"))
        if folder.is_dir() and any(pattern.fullmatch(p.name) for p in folder.iterdir()):
            return str(folder)
    return None


def image_make_vars(
    settings: PipSettings, torch_version: str, build_flags: Sequence[str], device: str = "cpu"
) -> dict[str, str]:
    """`make image DEVICE=device` variables that give the build what the host's pip has: its CA bundle, torch's CPU
    wheel (the CPU image's; the CUDA image's torch comes from the index), its index (not a `file://` index: a folder
    of this machine, which a build cannot reach)."""
    make_vars = {"DEVICE": device}
    if settings.cert and Path(settings.cert).is_file():
        make_vars["PIP_CERT"] = settings.cert
    wheels = torch_wheels_dir(settings, torch_version) if device == "cpu" else None
    if wheels:
        make_vars["TORCH_WHEELS"] = wheels
    flags = list(build_flags)
    if settings.index_url and settings.index_url.startswith(("http://", "https://")):
        flags += ["--build-arg", f"PIP_INDEX_URL={settings.index_url}"]
    make_vars["IMAGE_BUILD_FLAGS"] = " ".join(flags)
    return make_vars


def make_command(target: str, make_vars: Mapping[str, str]) -> list[str]:
    return ["make", "-C", str(REPO), target, *(f"{k}={v}" for k, v in make_vars.items())]
