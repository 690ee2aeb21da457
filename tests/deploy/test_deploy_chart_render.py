"""The Helm chart, rendered for its defaults and each charts/infer/ci value file: lint, Kubernetes 1.31 schemas,
and the wiring a cluster would only reveal at run time (probe ports, grace periods, selectors, env)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from kubernetes_validate import utils as k8s

from infer.server.cli import build_parser
from infer.server.gateway.cli import config_from_args as gateway_config
from infer.server.settings import ServerConfig, config_from_args
from tests.deploy.chart import (
    CASES,
    CHART,
    K8S_VERSION,
    Manifest,
    chart_values,
    containers,
    env,
    mounted_file,
    of_kind,
    one,
    pod_labels,
    pod_spec,
    render,
    run_helm,
    selects,
    values_args,
)

SERVER, GATEWAY, HEADLESS = "rel-infer", "rel-infer-gateway", "rel-infer-headless"
CRD_KINDS = {"ServiceMonitor", "InferencePool"}  # not in Kubernetes' schemas: checked by hand


def server_container(manifests: list[Manifest]) -> Manifest:
    return pod_spec(one(manifests, "Deployment", SERVER))["containers"][0]


@pytest.mark.parametrize("case", CASES)
def test_helm_lint_strict(helm: str, case: str) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), *values_args(case))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("case", CASES)
def test_manifests_pass_strict_kubernetes_schemas(rendered: dict[str, list[Manifest]], case: str) -> None:
    """What `kubernetes-validate --strict -k 1.31` checks: every field known and well typed."""
    for manifest in rendered[case]:
        if manifest["kind"] in CRD_KINDS:
            continue
        try:
            k8s.validate(manifest, K8S_VERSION, strict=True)
        except k8s.ValidationError as e:
            raise AssertionError(f"{manifest['kind']} {manifest['metadata']['name']}: {e.message}") from None


@pytest.mark.parametrize("case", CASES)
def test_probes_check_grpc_health_where_it_is_plaintext(rendered: dict[str, list[Manifest]], case: str) -> None:
    """The gRPC port, or with TLS the health-only port (the kubelet's grpc probes speak no TLS)."""
    server, values = server_container(rendered[case]), chart_values(case)
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports["grpc"] == values["ports"]["grpc"] == int(env(server)["INFER_GRPC_PORT"])
    if values["tls"]["secretName"]:
        assert ports["health"] == values["ports"]["health"] == int(env(server)["INFER_HEALTH_PORT"])
        probed = ports["health"]
    else:
        assert "health" not in ports and "INFER_HEALTH_PORT" not in env(server)
        probed = ports["grpc"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["grpc"] == {"port": probed}, probe
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # room to load a model


@pytest.mark.parametrize("case", CASES)
def test_grace_period_outlasts_the_drain(rendered: dict[str, list[Manifest]], case: str) -> None:
    for deployment in of_kind(rendered[case], "Deployment"):
        spec = pod_spec(deployment)
        container = spec["containers"][0]
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", ["sleep", "0"])
        drain_s = float(pre_stop[1]) + float(env(container)["INFER_SHUTDOWN_GRACE_S"])
        assert spec["terminationGracePeriodSeconds"] > drain_s, deployment["metadata"]["name"]


@pytest.mark.parametrize("case", CASES)
def test_selectors_match_pod_labels(rendered: dict[str, list[Manifest]], case: str) -> None:
    manifests = rendered[case]
    pods = {d["metadata"]["name"]: d for d in of_kind(manifests, "Deployment")}
    for name, deployment in pods.items():
        assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels(deployment)), name
    for service in of_kind(manifests, "Service"):
        chosen = [d for d in pods.values() if selects(service["spec"]["selector"], pod_labels(d))]
        assert len(chosen) == 1, f"Service {service['metadata']['name']} selects {len(chosen)} Deployments"
        port_names = {p["name"] for c in pod_spec(chosen[0])["containers"] for p in c["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names, service["metadata"]["name"]
    for pdb in of_kind(manifests, "PodDisruptionBudget"):
        assert any(selects(pdb["spec"]["selector"]["matchLabels"], pod_labels(d)) for d in pods.values())
    for hpa in of_kind(manifests, "HorizontalPodAutoscaler"):
        target = pods[hpa["spec"]["scaleTargetRef"]["name"]]
        assert "replicas" not in target["spec"], "the HPA owns the replica count"


@pytest.mark.parametrize("case", CASES)
def test_routes_reach_named_ports(rendered: dict[str, list[Manifest]], case: str) -> None:
    manifests = rendered[case]
    services = {s["metadata"]["name"]: s for s in of_kind(manifests, "Service")}
    for ingress in of_kind(manifests, "Ingress"):
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                assert backend["port"]["name"] in {p["name"] for p in services[backend["name"]]["spec"]["ports"]}
    for monitor in of_kind(manifests, "ServiceMonitor"):
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        selector = monitor["spec"]["selector"]["matchLabels"]
        chosen = [s for s in services.values() if selects(selector, s["metadata"]["labels"])]
        port_names = {p["name"] for s in chosen for p in s["spec"]["ports"]}
        assert chosen and {e["port"] for e in monitor["spec"]["endpoints"]} <= port_names
    for pool in of_kind(manifests, "InferencePool"):
        server = server_container(manifests)
        port_name = chart_values(case)["inferencePool"]["protocol"]  # http, or grpc
        target = next(p["containerPort"] for p in server["ports"] if p["name"] == port_name)
        assert [p["number"] for p in pool["spec"]["targetPorts"]] == [target]
    assert {m["kind"] for m in manifests} - CRD_KINDS <= {
        "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Ingress", "ServiceAccount", "Pod",
    }  # fmt: skip


def _env_names(command: str) -> set[str]:
    """The INFER_* variables that `infer <command>` reads, from its flags' help (`[env INFER_X; ...]`)."""
    parser = build_parser([command])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    helps = [a.help or "" for a in (*parser._actions, *sub._actions)]
    return {h.split("[env ", 1)[1].split(";")[0] for h in helps if "[env " in h}


def _server_config(variables: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> ServerConfig:
    """What `infer serve` makes of these variables: its whole command line is built, as in the container."""
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    return config_from_args(build_parser(["serve"]).parse_args(["serve"]))


def _mounted(manifests: list[Manifest], path: str) -> tuple[str, str]:
    """The Secret and its key behind a file path of the model server container."""
    spec = pod_spec(one(manifests, "Deployment", SERVER))
    volume, key = mounted_file(spec, spec["containers"][0], path)
    return volume["secret"]["secretName"], key


@pytest.mark.parametrize("case", CASES)
def test_server_env_is_a_valid_infer_serve_config(
    rendered: dict[str, list[Manifest]], case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests, values = rendered[case], chart_values(case)
    variables = env(server_container(manifests))
    infer_names = {name for name in variables if name.startswith("INFER_")}
    assert infer_names <= _env_names("serve")  # INFER_KERNELS too: the --kernels setting's variable
    config = _server_config(variables, monkeypatch)
    separate = values["gateway"]["mode"] == "separate"
    assert (config.host, config.grpc_port) == ("0.0.0.0", values["ports"]["grpc"])
    assert config.http_port == (None if separate else values["ports"]["http"])
    assert config.metrics_port == (values["ports"]["metrics"] if values["metrics"]["enabled"] else None)
    assert config.shutdown_grace_s == values["shutdownGraceS"]
    for name, key in (
        ("max_connection_age_s", "maxConnectionAgeS"),
        ("max_connection_age_grace_s", "maxConnectionAgeGraceS"),
    ):
        raw = variables.get(f"INFER_{name.upper()}")
        assert (None if raw is None else float(raw)) == values[key], key  # null: the server's default
        if hasattr(config, name) and raw is not None:
            assert getattr(config, name) == values[key], name
    tls = config.tls
    assert (tls is not None) == bool(values["tls"]["secretName"])
    if tls is not None:  # the files come from the Secrets, under the keys cert-manager writes
        assert config.health_port == values["ports"]["health"]
        assert _mounted(manifests, tls.cert_file) == (values["tls"]["secretName"], "tls.crt")
        assert _mounted(manifests, tls.key_file) == (values["tls"]["secretName"], "tls.key")
        client_ca = values["tls"]["clientCaSecretName"]
        assert (tls.client_ca_file is not None) == bool(client_ca)
        if tls.client_ca_file is not None:
            assert _mounted(manifests, tls.client_ca_file) == (client_ca, "ca.crt")
    for name, value in values["config"].items():
        if value is not None:
            assert getattr(config.engine, name, getattr(config, name, None)) == value, name


def test_separate_gateway_env_is_a_valid_infer_gateway_config(
    rendered: dict[str, list[Manifest]], monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests, values = rendered["gateway"], chart_values("gateway")
    variables = env(pod_spec(one(manifests, "Deployment", GATEWAY))["containers"][0])
    assert set(variables) <= _env_names("gateway")
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    config = gateway_config(build_parser(["gateway"]).parse_args(["gateway"]))
    assert config.upstream == f"dns:///{HEADLESS}.ml.svc:{values['ports']['grpc']}"
    assert one(manifests, "Service", HEADLESS)["spec"]["clusterIP"] == "None"
    assert (config.http_port, config.timeout_s, config.model_id) == (8000, 120.0, "smollm2")
    assert config.metrics_port == values["ports"]["metrics"] and config.upstream_tls is None
    server = server_container(manifests)
    assert env(server)["INFER_HTTP_PORT"] == "off" and "http" not in {p["name"] for p in server["ports"]}


@pytest.mark.parametrize("case", CASES)
def test_the_model_directory_is_mounted(rendered: dict[str, list[Manifest]], case: str) -> None:
    deployment = one(rendered[case], "Deployment", SERVER)
    server = pod_spec(deployment)["containers"][0]
    model = env(server).get("INFER_MODEL")
    source = chart_values(case)["model"]["source"]
    if source == "image":
        assert model is None  # the default model baked into the image
        return
    assert model is not None
    mounts = {m["mountPath"]: m["name"] for m in server["volumeMounts"]}
    volume = next(name for path, name in mounts.items() if model.startswith(path + "/"))
    if source == "copy":
        copier = pod_spec(deployment)["initContainers"][0]
        assert copier["command"][:2] == ["cp", "-R"] and copier["command"][3] == "/models/"
        assert {m["name"] for m in copier["volumeMounts"] if m["mountPath"] == "/models"} == {volume}


@pytest.mark.parametrize("case", CASES)
def test_gpus_only_where_asked(rendered: dict[str, list[Manifest]], case: str) -> None:
    server, count = server_container(rendered[case]), chart_values(case)["gpu"]["count"]
    limits: dict[str, Any] = server["resources"].get("limits", {})
    assert limits.get("nvidia.com/gpu", 0) == count
    tag = chart_values(case)["image"]["tag"]
    assert server["image"].endswith("-cuda") == (count > 0 and (not tag or tag.endswith("-cuda")))
    assert (env(server).get("INFER_DEVICE") == "cuda") == (count > 0)


@pytest.mark.parametrize("case", CASES)
def test_gpu_scheduling_only_for_the_model_servers(rendered: dict[str, list[Manifest]], case: str) -> None:
    """The server pods take the values' runtime class, node selector and tolerations; the pods that need no GPU (the
    separate gateways, the helm test) take none of them, nor a GPU."""
    values, manifests = chart_values(case), rendered[case]
    server = pod_spec(one(manifests, "Deployment", SERVER))
    assert server.get("runtimeClassName", "") == values["runtimeClassName"]
    assert server.get("nodeSelector", {}) == values["nodeSelector"]
    assert server.get("tolerations", []) == values["tolerations"]
    others = [
        m for m in of_kind(manifests, "Deployment") + of_kind(manifests, "Pod") if m["metadata"]["name"] != SERVER
    ]
    assert others, "the helm test pod at least"
    for manifest in others:
        assert not {"runtimeClassName", "nodeSelector", "tolerations"} & set(pod_spec(manifest))
        for container in containers(manifest):
            assert "nvidia.com/gpu" not in str(container.get("resources", {})), manifest["metadata"]["name"]


@pytest.mark.parametrize("case", CASES)
def test_autoscaling(rendered: dict[str, list[Manifest]], case: str) -> None:
    manifests, values = rendered[case], chart_values(case)
    autoscaling = values["autoscaling"]
    hpas = of_kind(manifests, "HorizontalPodAutoscaler")
    if not autoscaling["enabled"]:
        assert hpas == [] and one(manifests, "Deployment", SERVER)["spec"]["replicas"] == values["replicaCount"]
        return
    (metric,) = hpas[0]["spec"]["metrics"]
    if autoscaling["metric"] == "cpu":
        assert metric["resource"]["target"] == {"type": "Utilization", "averageUtilization": 70}
        return
    name, target = {
        "waitingRequests": ("waitingRequestsMetricName", "targetWaitingRequests"),
        "kvCacheUsage": ("kvCacheUsageMetricName", "targetKvCacheUsage"),
    }[autoscaling["metric"]]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == autoscaling[name]
    assert metric["pods"]["target"]["type"] == "AverageValue"
    assert float(metric["pods"]["target"]["averageValue"]) == autoscaling[target]


@pytest.mark.parametrize("case", CASES)
def test_helm_test_pod_checks_health_then_generates(rendered: dict[str, list[Manifest]], case: str) -> None:
    manifests = rendered[case]
    (pod,) = of_kind(manifests, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    health, generate = pod["spec"]["initContainers"][0], pod["spec"]["containers"][0]
    address = f"{SERVER}:{chart_values(case)['ports']['grpc']}"
    assert health["args"][:3] == ["health", "--address", address]
    assert generate["args"][:3] == ["client", "--address", address] and "generate" in generate["args"]
    assert one(manifests, "Service", SERVER)["spec"]["ports"][0]["port"] == int(address.rsplit(":")[1])


@pytest.mark.parametrize("case", CASES)
def test_read_only_root_with_a_writable_tmp(rendered: dict[str, list[Manifest]], case: str) -> None:
    for deployment in of_kind(rendered[case], "Deployment"):
        for container in containers(deployment):
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            if container in pod_spec(deployment)["containers"]:
                assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}


def test_api_keys_come_from_a_mounted_secret(helm: str) -> None:
    manifests = render(helm, "--set", "apiKeys.secretName=infer-keys")
    (server,) = [d for d in of_kind(manifests, "Deployment") if d["metadata"]["name"] == "rel-infer"]
    pod = server["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "server"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["INFER_API_KEYS_FILE"] == "/etc/infer/api-keys/keys"
    assert {"name": "api-keys", "mountPath": "/etc/infer/api-keys", "readOnly": True} in container["volumeMounts"]
    volume = next(v for v in pod["volumes"] if v["name"] == "api-keys")
    assert volume["secret"] == {"secretName": "infer-keys", "items": [{"key": "keys", "path": "keys"}]}
    (test_pod,) = of_kind(manifests, "Pod")
    args = test_pod["spec"]["containers"][0]["args"]
    assert args[args.index("--api-key-file") + 1] == "/etc/infer/api-keys/keys"
    assert "api-keys" in {v["name"] for v in test_pod["spec"]["volumes"]}
    assert "INFER_API_KEYS_FILE" not in str(render(helm))  # off by default
