"""The chart's values: typed by values.schema.json, all listed in its README, every `infer serve` setting
reachable, bad values refused with a message; NOTES.txt renders; the YAML files pass yamllint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from yamllint import linter
from yamllint.config import YamlLintConfig

from infer.engine.config import DTYPES
from infer.kernels import BACKENDS
from infer.server.settings import SETTINGS
from tests.deploy.chart import CASES, CHART, chart_values, env, render, render_error, run_helm, values_args
from tests.deploy.chart_docs import documented_values, leaf_paths, values_table

SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
# `infer serve` settings the chart sets from its own values rather than from `config`
CHART_SETTINGS = {
    "host": "always 0.0.0.0",
    "grpc_port": "ports.grpc",
    "http_port": "ports.http, off with gateway.mode separate",
    "metrics_port": "ports.metrics, off without metrics.enabled",
    "shutdown_grace_s": "shutdownGraceS",
    "model": "model.*",
    "api_keys_file": "apiKeys.secretName (a Secret mounted read-only)",
    "api_key": "apiKeys.secretName (keys stay out of values, in a Secret)",
    "tls_cert": "tls.secretName (its tls.crt, mounted read-only)",
    "tls_key": "tls.secretName (its tls.key)",
    "tls_client_ca": "tls.clientCaSecretName (its ca.crt)",
    "health_port": "ports.health, with tls.secretName (the probes' plaintext port)",
    "max_connection_age_s": "maxConnectionAgeS",
    "max_connection_age_grace_s": "maxConnectionAgeGraceS",
    "kernels": "kernels (INFER_KERNELS)",
    "http_metrics": "metrics.onHttpPort, on with an InferencePool over the HTTP port",
    "kv_events": "kvEvents.enabled",
    "kv_events_endpoint": "ports.kvEvents (tcp://*:PORT)",
    "kv_events_replay_endpoint": "ports.kvEventsReplay (tcp://*:PORT)",
    "kv_events_pod_id": "the pod's IP and the pool's target port (the downward API)",
}

# the model name clients send, for the cases that do not serve the default model
MODEL_IDS = {"gateway": "smollm2", "pvc-model": "Qwen3-0.6B", "copy-model": "Llama-3.2-1B-Instruct"}


def _schema_at(path: str) -> dict[str, Any] | None:
    """The schema of a dotted value path; None inside a free-form map (annotations, resources, ...)."""
    node = SCHEMA
    for key in path.split("."):
        if "properties" not in node:
            return None  # a free-form object: its keys are Kubernetes' business
        assert key in node["properties"], f"{path}: no schema for {key!r}"
        node = node["properties"][key]
    return node


@pytest.mark.parametrize("case", CASES)
def test_every_value_has_a_schema(case: str) -> None:
    for path in leaf_paths(chart_values(case)):
        _schema_at(path)


def _schema_paths(node: dict[str, Any], prefix: str = "") -> list[str]:
    if "properties" not in node:
        return [prefix.rstrip(".")]
    return [p for key, child in node["properties"].items() for p in _schema_paths(child, f"{prefix}{key}.")]


def _typed_part(path: str) -> str:
    """The part of a value path that the schema names key by key (`resources.requests.cpu` -> `resources.requests`)."""
    keys, node = path.split("."), SCHEMA
    for n, key in enumerate(keys):
        if "properties" not in node:
            return ".".join(keys[:n])
        node = node["properties"][key]
    return path


def test_every_schema_entry_is_a_value() -> None:
    defaults = {_typed_part(path) for path in leaf_paths(chart_values("default"))}
    assert set(_schema_paths(SCHEMA)) == defaults


def test_every_serve_setting_is_reachable() -> None:
    """Each `infer serve` setting is a `config` key (INFER_<KEY>) or set by the chart itself."""
    config = SCHEMA["properties"]["config"]["properties"]
    settings = {s.name: s for s in SETTINGS}
    missing = set(settings) - set(config) - set(CHART_SETTINGS)
    assert not missing, f"add to values.yaml `config`, values.schema.json and the chart README: {sorted(missing)}"
    assert set(config) <= set(settings), "config keys that are no settings"
    assert set(chart_values("default")["config"]) == set(config)
    for name, schema in config.items():
        choices = settings[name].choices or (tuple(DTYPES) if name == "dtype" else ())
        if choices:
            assert schema["enum"] == [None, *choices], name


def test_kernels_takes_every_backend_the_server_knows() -> None:
    # the schema once left out `cpu`: the chart could not ask for the compiled CPU kernels
    assert SCHEMA["properties"]["kernels"]["enum"] == ["", *BACKENDS]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("gateway.mode=sidecar", "gateway.mode must be one of"),
        ("config.max_num_sqs=4", "Additional property max_num_sqs is not allowed"),
        ("config.dtype=fp8", "config.dtype must be one of"),
        ("gpu.count=-1", "gpu.count: Must be greater than or equal to 0"),
        ("gpu.count=1.5", "gpu.count: Invalid type. Expected: integer"),
        # a RuntimeClass is named like any object: a pod that names another one is refused at admission
        ("runtimeClassName=NVIDIA_GPU", "runtimeClassName: Does not match pattern"),
        ("ports.grpc=70000", "ports.grpc: Must be less than or equal to 65535"),
        ("model.source=s3", "model.source must be one of"),
        # quantities, as Kubernetes would refuse them (at install time, after the chart had accepted them)
        ("resources.requests.cpu=two", "resources.requests.cpu: Does not match pattern"),
        ("resources.limits.memory=8 GB", "resources.limits.memory: Does not match pattern"),
        ("gateway.resources.requests.cpu=quarter", "gateway.resources.requests.cpu: Does not match pattern"),
        ("tmpSizeLimit=lots", "tmpSizeLimit: Does not match pattern"),
        ("model.copy.sizeLimit=huge", "model.copy.sizeLimit: Does not match pattern"),
        ("autoscaling.targetWaitingRequests=many", "autoscaling.targetWaitingRequests: Does not match pattern"),
        ("autoscaling.targetWaitingRequests=0", "autoscaling.targetWaitingRequests: Must be greater than 0"),
        ("autoscaling.targetKvCacheUsage=1.5", "autoscaling.targetKvCacheUsage: Does not match pattern"),
        ("autoscaling.metric=gpu", "autoscaling.metric must be one of"),
        # a budget of 0 blocks every node drain for good
        (
            "podDisruptionBudget.maxUnavailable=0",
            "podDisruptionBudget.maxUnavailable: Must be greater than or equal to 1",
        ),
        ("podDisruptionBudget.maxUnavailable=0%", "podDisruptionBudget.maxUnavailable: Does not match pattern"),
        ("serviceMonitor.interval=soon", "serviceMonitor.interval: Does not match pattern"),
        ("updateStrategy.type=Replace", "updateStrategy.type must be one of"),
        ("updateStrategy.rollingUpdate.maxSurge=lots", "updateStrategy.rollingUpdate.maxSurge: Does not match pattern"),
        ("service.type=LoadBalancer", "service: Additional property type is not allowed"),  # service.grpc/http.type
        ("service.grpc.type=ExternalName", "service.grpc.type must be one of"),
        ("ports.health=0", "ports.health: Must be greater than or equal to 1"),
        ("inferencePool.endpointPicker.failureMode=Retry", "inferencePool.endpointPicker.failureMode must be one of"),
    ],
)
def test_schema_refuses_bad_values(helm: str, value: str, message: str) -> None:
    assert message in render_error(helm, "--set", value)


@pytest.mark.parametrize(
    ("flags", "path", "expected"),
    [
        (["--set", "podDisruptionBudget.minAvailable=1"], ("PodDisruptionBudget", "minAvailable"), 1),
        (["--set", "podDisruptionBudget.minAvailable=30%"], ("PodDisruptionBudget", "minAvailable"), "30%"),
        (["--set", "podDisruptionBudget.maxUnavailable=10%"], ("PodDisruptionBudget", "maxUnavailable"), "10%"),
        (["--set-json", "autoscaling.targetWaitingRequests=0.5"], ("HorizontalPodAutoscaler", "averageValue"), "0.5"),
        (["--set", "autoscaling.targetWaitingRequests=2.5"], ("HorizontalPodAutoscaler", "averageValue"), "2.5"),
        (["--set", "autoscaling.targetWaitingRequests=500m"], ("HorizontalPodAutoscaler", "averageValue"), "500m"),
        (["--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.interval=1m30s"],
         ("ServiceMonitor", "interval"), "1m30s"),
        (["--set", "resources.requests.cpu=1500m"], ("Deployment", "cpu"), "1500m"),
        (["--set-json", "tmpSizeLimit=1073741824"], ("Deployment", "sizeLimit"), 1073741824),
    ],
)  # fmt: skip
def test_schema_takes_what_kubernetes_takes(helm: str, flags: list[str], path: tuple[str, str], expected: Any) -> None:
    """Values the schema once refused, though Kubernetes takes them (a PDB's minAvailable, fractions, durations)."""
    kind, field = path
    (manifest,) = [m for m in render(helm, *flags) if m["kind"] == kind]
    assert _find(manifest, field) == [expected]


def _find(node: Any, field: str) -> list[Any]:
    """Every value of `field` anywhere in a manifest."""
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == field] + [x for v in node.values() for x in _find(v, field)]
    if isinstance(node, list):
        return [x for v in node for x in _find(v, field)]
    return []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["terminationGracePeriodSeconds=35"], "must exceed preStopSleepS + shutdownGraceS (35)"),
        (["model.source=pvc", "model.pvc.path=m"], "model.pvc.claimName: the claim holding the model"),
        (["model.source=pvc", "model.pvc.claimName=c"], "model.pvc.path: the model directory inside the claim"),
        (["model.source=copy"], "model.copy.from: the model directory to copy"),
        (["autoscaling.minReplicas=9"], "autoscaling.minReplicas (9) is above autoscaling.maxReplicas (8)"),
        (["serviceMonitor.enabled=true", "metrics.enabled=false"], "serviceMonitor.enabled needs metrics.enabled"),
        (["ingress.enabled=true"], "ingress.hosts: at least one host"),
        (["ports.http=50051"], "ports.grpc and ports.http are both 50051: each port needs its own number"),
        (["ports.metrics=8000"], "ports.http and ports.metrics are both 8000"),
        (["podDisruptionBudget.minAvailable=2"], "podDisruptionBudget.minAvailable (2) must be below the server"),
        (
            [
                "gateway.mode=separate",
                "gateway.replicaCount=1",
                "podDisruptionBudget.minAvailable=1",
                "autoscaling.minReplicas=3",
            ],
            "podDisruptionBudget.minAvailable (1) must be below the gateway replicas (1)",
        ),
        (
            ["updateStrategy.rollingUpdate.maxSurge=0", "updateStrategy.rollingUpdate.maxUnavailable=0%"],
            "maxSurge and maxUnavailable are both 0",
        ),
    ],
)
def test_inconsistent_values_fail_with_a_message(helm: str, values: list[str], message: str) -> None:
    assert message in render_error(helm, *(arg for v in values for arg in ("--set", v)))


def test_whole_numbers_stay_whole(helm: str) -> None:
    """Helm reads YAML numbers as floats: 2^34 must not reach the server as 1.7179869184e+10."""
    manifests = render(helm, "--set", "config.kv_cache_memory_bytes=17179869184", "--set-json", "shutdownGraceS=12.5")
    (deployment,) = (m for m in manifests if m["kind"] == "Deployment")
    variables = env(deployment["spec"]["template"]["spec"]["containers"][0])
    assert variables["INFER_KV_CACHE_MEMORY_BYTES"] == "17179869184"
    assert variables["INFER_SHUTDOWN_GRACE_S"] == "12.5"
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 5 + 13 + 15


def test_readme_lists_every_value() -> None:
    readme = (CHART / "README.md").read_text()
    assert values_table() in readme, "regenerate the table: .venv/bin/python -m tests.deploy.chart_docs"
    documented = {v.path for v in documented_values()}
    for path in leaf_paths(chart_values("default")):
        parts = path.split(".")
        assert any(".".join(parts[:n]) in documented for n in range(1, len(parts) + 1)), f"{path}: no `# --` doc"


@pytest.mark.parametrize("case", CASES)
def test_notes_render(helm: str, case: str, tmp_path: Path) -> None:
    """NOTES.txt (which `helm template` skips) rendered through a copy of the chart that includes it."""
    chart = tmp_path / "infer"
    shutil.copytree(CHART, chart)
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    wrapper = '{{- define "notes" }}' + notes + '{{- end }}\nnotes: {{ include "notes" . | quote }}\n'
    (chart / "templates" / "notes-check.yaml").write_text(wrapper)
    result = run_helm(helm, "template", "rel", str(chart), "-s", "templates/notes-check.yaml", *values_args(case))
    assert result.returncode == 0, result.stderr
    assert "rollout status deployment/rel-infer" in result.stdout and "helm test rel" in result.stdout
    model_id = MODEL_IDS.get(case, "SmolLM2-135M-Instruct")
    assert f'\\"model\\": \\"{model_id}\\"' in result.stdout


def test_yaml_files_pass_yamllint() -> None:
    config = YamlLintConfig("extends: default\nrules: {line-length: {max: 120}, document-start: disable}")
    files = [CHART / "Chart.yaml", CHART / "values.yaml", *sorted((CHART / "ci").glob("*.yaml"))]
    problems = [f"{f.name}:{p.line}: {p.message}" for f in files for p in linter.run(f.read_text(), config)]
    assert not problems, "\n".join(problems)
