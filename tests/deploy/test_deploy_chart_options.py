"""The chart's options, rendered: a Service type per front door, TLS with probes that still work, the thread count
from the CPU request, rollouts that fit a full GPU pool, the CPU image where no GPU is needed, metrics off the
public port, disruption budgets, and the InferencePool."""

from __future__ import annotations

from typing import Any

import pytest

from infer.server.telemetry import PROTOCOL_GAUGES
from tests.deploy.chart import (
    CASES,
    Manifest,
    chart_values,
    env,
    env_from,
    mounted_file,
    of_kind,
    one,
    pod_labels,
    pod_spec,
    render,
    render_error,
    selects,
)

SERVER, GATEWAY = "rel-infer", "rel-infer-gateway"


def _sets(*values: str) -> list[str]:
    return [arg for v in values for arg in ("--set", v)]


def _server(manifests: list[Manifest]) -> Manifest:
    return pod_spec(one(manifests, "Deployment", SERVER))["containers"][0]


# Services


def test_grpc_and_http_services_have_their_own_types(rendered: dict[str, list[Manifest]], helm: str) -> None:
    """A LoadBalancer for gRPC does not publish the plaintext HTTP API with it."""
    manifests, values = rendered["service-types"], chart_values("service-types")
    grpc, http = one(manifests, "Service", SERVER), one(manifests, "Service", "rel-infer-http")
    assert (grpc["spec"]["type"], http["spec"]["type"]) == ("LoadBalancer", "ClusterIP")
    assert grpc["metadata"]["annotations"] == values["service"]["grpc"]["annotations"]
    assert http["metadata"]["annotations"] == values["service"]["http"]["annotations"]
    for name in ("rel-infer-headless", "rel-infer-metrics"):
        assert one(manifests, "Service", name)["spec"]["type"] == "ClusterIP"
    http_only = render(helm, "--set", "service.http.type=NodePort")
    assert one(http_only, "Service", SERVER)["spec"]["type"] == "ClusterIP"
    assert one(http_only, "Service", "rel-infer-http")["spec"]["type"] == "NodePort"


# TLS


@pytest.mark.parametrize("case", [c for c in CASES if chart_values(c)["tls"]["secretName"]])
def test_tls_clients_trust_the_ca_and_present_the_client_certificate(
    rendered: dict[str, list[Manifest]], case: str
) -> None:
    manifests, tls = rendered[case], chart_values(case)["tls"]
    (test_pod,) = of_kind(manifests, "Pod")
    clients: list[tuple[Manifest, Manifest, dict[str, str]]] = []
    for container in (*test_pod["spec"]["initContainers"], *test_pod["spec"]["containers"]):
        args = container["args"]
        flags = {a: args[i + 1] for i, a in enumerate(args) if a.startswith("--tls")}
        clients.append((test_pod["spec"], container, flags))
    for gateway in (d for d in of_kind(manifests, "Deployment") if d["metadata"]["name"] == GATEWAY):
        variables = env(pod_spec(gateway)["containers"][0])
        names = {"--tls-ca": "CA", "--tls-cert": "CERT", "--tls-key": "KEY", "--tls-server-name": "SERVER_NAME"}
        flags = {
            flag: variables[f"INFER_UPSTREAM_TLS_{n}"]
            for flag, n in names.items()
            if f"INFER_UPSTREAM_TLS_{n}" in variables
        }
        clients.append((pod_spec(gateway), pod_spec(gateway)["containers"][0], flags))
    assert clients
    for spec, container, flags in clients:
        volume, key = mounted_file(spec, container, flags["--tls-ca"])
        assert (volume["secret"]["secretName"], key) == (tls["secretName"], "ca.crt")
        assert volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # never the server's key
        assert ("--tls-cert" in flags) == ("--tls-key" in flags) == bool(tls["clientCaSecretName"])
        if tls["clientCaSecretName"]:
            for flag, expected in (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key")):
                volume, key = mounted_file(spec, container, flags[flag])
                assert (volume["secret"]["secretName"], key) == (tls["clientSecretName"], expected)
        assert flags.get("--tls-server-name", "") == tls["serverName"]


def test_tls_serves_https_in_process_and_h2_over_tls(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["tls"]
    assert one(manifests, "Service", "rel-infer-http")["spec"]["ports"][0]["appProtocol"] == "https"
    assert "appProtocol" not in one(manifests, "Service", SERVER)["spec"]["ports"][0]  # not h2c: TLS
    plain = rendered["default"]
    assert one(plain, "Service", SERVER)["spec"]["ports"][0]["appProtocol"] == "kubernetes.io/h2c"
    assert one(plain, "Service", "rel-infer-http")["spec"]["ports"][0]["appProtocol"] == "http"
    for manifest in manifests:  # the health-only port is for the kubelet: no Service publishes it
        if manifest["kind"] == "Service":
            assert "health" not in {p["targetPort"] for p in manifest["spec"]["ports"]}


def test_mtls_needs_the_client_certificate_of_the_chart_s_own_clients(helm: str) -> None:
    message = render_error(helm, *_sets("tls.secretName=srv", "tls.clientCaSecretName=cas"))
    assert "tls.clientSecretName: the client certificate the gateway and the helm test present" in message


def test_the_health_port_needs_its_own_number(helm: str) -> None:
    message = render_error(helm, *_sets("tls.secretName=srv", "ports.health=9464"))
    assert "ports.metrics and ports.health are both 9464" in message
    render(helm, "--set", "ports.health=9464")  # no TLS, no health port: nothing to collide


# volumes


def test_extra_volumes_are_mounted_in_the_server(rendered: dict[str, list[Manifest]]) -> None:
    manifests, values = rendered["service-types"], chart_values("service-types")
    spec = pod_spec(one(manifests, "Deployment", SERVER))
    assert values["extraVolumes"][0] in spec["volumes"]
    assert values["extraVolumeMounts"][0] in spec["containers"][0]["volumeMounts"]


# threads


def test_threads_follow_the_cpu_request(rendered: dict[str, list[Manifest]], helm: str) -> None:
    assert env_from(_server(rendered["default"]))["OMP_NUM_THREADS"] == {
        "resourceFieldRef": {"containerName": "server", "resource": "requests.cpu", "divisor": "1"}
    }
    assert env(_server(rendered["hpa-queue"]))["OMP_NUM_THREADS"] == "3"  # cpuThreads
    entries = [e for e in _server(rendered["pvc-model"])["env"] if e["name"] == "OMP_NUM_THREADS"]
    assert entries == [{"name": "OMP_NUM_THREADS", "value": "2"}]  # extraEnv's, once
    no_request = _server(render(helm, "--set", "resources.requests.cpu=null"))
    assert "OMP_NUM_THREADS" not in {e["name"] for e in no_request["env"]}  # the downward API would give the node's


# rollouts


def _strategy(manifests: list[Manifest], name: str = SERVER) -> dict[str, Any]:
    strategy: dict[str, Any] = one(manifests, "Deployment", name)["spec"]["strategy"]
    return strategy


@pytest.mark.parametrize("case", CASES)
def test_rollouts_fit_the_pool(rendered: dict[str, list[Manifest]], case: str) -> None:
    """CPU pods surge (a new pod is ready before an old one drains); a full GPU pool has no room for a surge pod."""
    manifests, values = rendered[case], chart_values(case)
    strategy = _strategy(manifests)
    if values["updateStrategy"]["type"] == "Recreate":
        assert strategy == {"type": "Recreate"}  # rollingUpdate with Recreate: the API server refuses it
    elif values["gpu"]["count"] > 0:
        assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    else:
        assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    if values["gateway"]["mode"] == "separate":
        gateway = _strategy(manifests, GATEWAY)
        assert gateway == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def test_rollout_settings_are_kept_and_checked(helm: str) -> None:
    chosen = _strategy(render(helm, *_sets("gpu.count=1", "updateStrategy.rollingUpdate.maxSurge=25%")))
    assert chosen["rollingUpdate"] == {"maxSurge": "25%", "maxUnavailable": 1}
    frozen = ("updateStrategy.rollingUpdate.maxSurge=0", "updateStrategy.rollingUpdate.maxUnavailable=0")
    assert "maxSurge and maxUnavailable are both 0: a rollout could never start" in render_error(helm, *_sets(*frozen))


# images


@pytest.mark.parametrize("case", CASES)
def test_pods_without_a_gpu_run_the_cpu_image(rendered: dict[str, list[Manifest]], case: str) -> None:
    manifests, image = rendered[case], chart_values(case)["image"]
    cpu_image = f"{image['repository']}:{image['tag'].removesuffix('-cuda') or '0.1.0'}"
    (test_pod,) = of_kind(manifests, "Pod")
    others = [
        c
        for d in of_kind(manifests, "Deployment")
        if d["metadata"]["name"] == GATEWAY
        for c in pod_spec(d)["containers"]
    ]
    for container in (*test_pod["spec"]["initContainers"], *test_pod["spec"]["containers"], *others):
        assert container["image"] == cpu_image, container["name"]


def test_the_cpu_tag_can_be_named(helm: str) -> None:
    manifests = render(helm, *_sets("gpu.count=1", "image.cpuTag=cpu-build-7"))
    (test_pod,) = of_kind(manifests, "Pod")
    assert test_pod["spec"]["containers"][0]["image"] == "infer:cpu-build-7"
    assert _server(manifests)["image"] == "infer:0.1.0-cuda"


# metrics


@pytest.mark.parametrize("case", CASES)
def test_metrics_stay_off_the_public_http_port(rendered: dict[str, list[Manifest]], case: str) -> None:
    manifests, values = rendered[case], chart_values(case)
    scraped = [s for s in of_kind(manifests, "Service") if s["metadata"]["labels"].get("infer.metrics/scrape")]
    if not values["metrics"]["enabled"]:
        assert scraped == []
        return
    assert {p["targetPort"] for s in scraped for p in s["spec"]["ports"]} == {"metrics"}
    for deployment in of_kind(manifests, "Deployment"):
        container = pod_spec(deployment)["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["metrics"] == values["ports"]["metrics"] == int(env(container)["INFER_METRICS_PORT"])
        assert ports["metrics"] != ports.get("http")
    for monitor in of_kind(manifests, "ServiceMonitor"):
        assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]


# disruption budgets


def test_a_disruption_budget_by_min_available(rendered: dict[str, list[Manifest]], helm: str) -> None:
    (pdb,) = of_kind(rendered["service-types"], "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 2 and "maxUnavailable" not in pdb["spec"]
    percent = render(helm, "--set", "podDisruptionBudget.minAvailable=50%")
    assert of_kind(percent, "PodDisruptionBudget")[0]["spec"]["minAvailable"] == "50%"
    message = render_error(helm, "--set", "podDisruptionBudget.minAvailable=2")
    assert "podDisruptionBudget.minAvailable (2) must be below the server replicas (2)" in message


# autoscaling and the inference extension


def test_hpa_metric_names_are_the_server_s(rendered: dict[str, list[Manifest]]) -> None:
    defaults = chart_values("default")["autoscaling"]
    assert defaults["metric"] == "waitingRequests"  # queue depth by default
    assert defaults["waitingRequestsMetricName"] == PROTOCOL_GAUGES["TotalQueuedRequests"]
    assert defaults["kvCacheUsageMetricName"] == PROTOCOL_GAUGES["KVCacheUtilization"]
    (metric,) = one(rendered["gpu"], "HorizontalPodAutoscaler", SERVER)["spec"]["metrics"]
    assert metric["pods"] == {
        "metric": {"name": "infer_kv_cache_usage_ratio"},
        "target": {"type": "AverageValue", "averageValue": "0.8"},
    }


def test_the_inference_pool_selects_the_model_servers(rendered: dict[str, list[Manifest]], helm: str) -> None:
    manifests, values = rendered["inference-pool"], chart_values("inference-pool")
    (pool,) = of_kind(manifests, "InferencePool")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert selects(pool["spec"]["selector"]["matchLabels"], pod_labels(one(manifests, "Deployment", SERVER)))
    picker = values["inferencePool"]["endpointPicker"]
    assert pool["spec"]["endpointPickerRef"] == {
        "name": picker["serviceName"], "port": {"number": picker["port"]}, "failureMode": picker["failureMode"],
    }  # fmt: skip
    assert of_kind(rendered["default"], "InferencePool") == []  # off by default
    separate = render_error(
        helm,
        *_sets("inferencePool.enabled=true", "inferencePool.endpointPicker.serviceName=e", "gateway.mode=separate"),
    )
    assert "inferencePool.enabled needs gateway.mode inProcess" in separate
    assert "inferencePool.endpointPicker.serviceName" in render_error(helm, "--set", "inferencePool.enabled=true")


# tenants


def test_a_separate_gateway_forwards_the_tenant_header(helm: str) -> None:
    """The model servers read the tenant from `config.tenant_header`; a gateway of its own must forward it."""
    manifests = render(helm, *_sets("gateway.mode=separate", "config.tenant_header=x-tenant"))
    gateway = pod_spec(one(manifests, "Deployment", GATEWAY))["containers"][0]
    assert env(gateway)["INFER_TENANT_HEADER"] == "x-tenant"
    assert env(_server(manifests))["INFER_TENANT_HEADER"] == "x-tenant"
    plain = render(helm, "--set", "gateway.mode=separate")
    assert "INFER_TENANT_HEADER" not in env(pod_spec(one(plain, "Deployment", GATEWAY))["containers"][0])
