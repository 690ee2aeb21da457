"""The chart as an inference gateway's backend (the Gateway API Inference Extension, llm-d's router): the pod labels
the picker reads, /metrics where it scrapes, KV-cache events where its precise scorer subscribes, and a pool over
HTTP or gRPC (h2c).

What the picker expects, from its sources (llm-d/llm-d-router at ebab687927f5331c1b39defcb579a07951bce56c;
kubernetes-sigs/gateway-api-inference-extension at 84436a96b9e6ce2b59ddacd3d04c31b4fbd442de):
- engine-type label `llm-d.ai/engine-type` (extractor/metrics/mapping_registry.go), role label `llm-d.ai/role`
  with `prefill-decode` admitted by both the prefill and decode filters (scheduling/filter/bylabel/roles.go);
- metrics scraped at `<pod IP>:<target port>/metrics` (epp/datastore/datastore.go, MetricsHost);
- KV events from `tcp://<pod IP>:5557`, replay on a configured port (kvevents/pool.go, PodDiscoveryConfig);
- `appProtocol: kubernetes.io/h2c` on the InferencePool for gRPC (api/v1/inferencepool_types.go, proposal 2162).
"""

from __future__ import annotations

import os

import pytest

from infer.server.cli import build_parser
from infer.server.settings import ServerConfig, config_from_args
from tests.deploy.chart import (
    Manifest,
    chart_values,
    env,
    env_from,
    of_kind,
    one,
    pod_labels,
    pod_spec,
    render,
    render_error,
)

SERVER = "rel-infer"
ENGINE_TYPE_LABEL, ROLE_LABEL = "llm-d.ai/engine-type", "llm-d.ai/role"
PICKER_KV_EVENTS_PORT = 5557  # the picker's default PodDiscoveryConfig.socketPort


def _server(manifests: list[Manifest]) -> Manifest:
    return pod_spec(one(manifests, "Deployment", SERVER))["containers"][0]


def _config(container: Manifest, monkeypatch: pytest.MonkeyPatch) -> ServerConfig:
    """What `infer serve` makes of the container's variables (alone: none set by an earlier call remains)."""
    for name in [n for n in os.environ if n.startswith("INFER_")]:
        monkeypatch.delenv(name)
    for name, value in env(container).items():
        monkeypatch.setenv(name, value)
    return config_from_args(build_parser(["serve"]).parse_args(["serve"]))


def _sets(*values: str) -> list[str]:
    return [arg for v in values for arg in ("--set", v)]


def test_the_pods_carry_the_labels_the_picker_reads(rendered: dict[str, list[Manifest]], helm: str) -> None:
    labels = pod_labels(one(rendered["default"], "Deployment", SERVER))
    assert (labels[ENGINE_TYPE_LABEL], labels[ROLE_LABEL]) == ("vllm", "prefill-decode")  # infer exports vLLM's names
    none = pod_labels(one(render(helm, *_sets("picker.engineType=", "picker.role=")), "Deployment", SERVER))
    assert ENGINE_TYPE_LABEL not in none and ROLE_LABEL not in none
    mine = render(helm, *_sets("podLabels.llm-d\\.ai/role=decode", "podLabels.team=ml"))
    assert pod_labels(one(mine, "Deployment", SERVER))[ROLE_LABEL] == "decode"  # podLabels win


def test_an_http_pool_is_scraped_on_its_target_port(
    rendered: dict[str, list[Manifest]], monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = rendered["inference-pool"]
    (pool,) = of_kind(manifests, "InferencePool")
    assert "appProtocol" not in pool["spec"]  # HTTP/1.1, the default
    config = _config(_server(manifests), monkeypatch)
    assert config.http_metrics and pool["spec"]["targetPorts"] == [{"number": config.http_port}]
    assert config.metric_sets == {"infer", "vllm"}
    assert not _config(_server(rendered["default"]), monkeypatch).http_metrics  # off the public port otherwise


def test_a_precise_grpc_pool_publishes_kv_events_where_the_picker_subscribes(
    rendered: dict[str, list[Manifest]], monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests, values = rendered["llm-d-precise"], chart_values("llm-d-precise")
    (pool,) = of_kind(manifests, "InferencePool")
    container = _server(manifests)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert pool["spec"]["appProtocol"] == "kubernetes.io/h2c"
    assert pool["spec"]["targetPorts"] == [{"number": ports["grpc"]}]
    assert ports["kv-events"] == values["ports"]["kvEvents"] == PICKER_KV_EVENTS_PORT
    assert ports["kv-replay"] == values["ports"]["kvEventsReplay"]
    config = _config(container, monkeypatch)
    engine = config.engine
    assert engine.kv_events and engine.enable_prefix_caching
    assert engine.kv_events_endpoint == f"tcp://*:{ports['kv-events']}"
    assert engine.kv_events_replay_endpoint == f"tcp://*:{ports['kv-replay']}"
    # the topic's pod id: the address and port the picker names the endpoint by (Kubernetes expands $(POD_IP))
    assert engine.kv_events_pod_id == f"$(POD_IP):{ports['grpc']}"
    assert env_from(container)["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert not config.http_metrics  # a gRPC port has no /metrics: the picker scrapes ports.metrics
    assert of_kind(rendered["default"], "InferencePool") == []
    assert "kv-events" not in {p["name"] for p in _server(rendered["default"])["ports"]}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["kvEvents.enabled=true", "config.enable_prefix_caching=false"], "kvEvents.enabled needs config.enable_pre"),
        (["kvEvents.enabled=true", "ports.kvEvents=50051"], "ports.grpc and ports.kvEvents are both 50051"),
        (["kvEvents.enabled=true", "ports.kvEventsReplay=5557"], "ports.kvEvents and ports.kvEventsReplay are both"),
        (
            [
                "inferencePool.enabled=true",
                "inferencePool.protocol=grpc",
                "inferencePool.endpointPicker.serviceName=e",
                "tls.secretName=infer-tls",
            ],
            "inferencePool.protocol grpc is cleartext HTTP/2",
        ),
        (["inferencePool.protocol=tcp"], "inferencePool.protocol"),
        (["picker.role=leader"], "picker.role"),
    ],
)
def test_inconsistent_picker_values_fail_with_a_message(helm: str, values: list[str], message: str) -> None:
    assert message in render_error(helm, *_sets(*values))


def test_a_grpc_pool_works_with_a_separate_gateway(helm: str) -> None:
    sets = ("inferencePool.enabled=true", "inferencePool.protocol=grpc", "inferencePool.endpointPicker.serviceName=e",
            "gateway.mode=separate")  # fmt: skip
    (pool,) = of_kind(render(helm, *_sets(*sets)), "InferencePool")
    assert pool["spec"]["appProtocol"] == "kubernetes.io/h2c"
