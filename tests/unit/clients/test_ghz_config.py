"""benchmarks/ghz: the method and every request field the configs and the data file name exist, as the
server's reflection service describes them (ghz's reflection variant reads the schema the same way)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from tests.integration.grpc_helpers import running_fake_server

ROOT = Path(__file__).resolve().parents[3]
GHZ = ROOT / "benchmarks" / "ghz"
CONFIGS = ("generate.json", "generate-reflection.json")
# the ghz config keys these files may use (ghz's runner.Config JSON names)
GHZ_KEYS = {"name", "proto", "protoset", "import-paths", "call", "host", "insecure", "total", "concurrency",
            "connections", "timeout", "data-file", "data", "metadata", "rps", "duration", "max-duration"}  # fmt: skip


@pytest.fixture(scope="module")
def reflected() -> Iterator[descriptor_pool.DescriptorPool]:
    """A descriptor pool filled from the reflection service of a running (fake-engine) server."""
    with running_fake_server() as server, grpc.insecure_channel(server.address) as channel:
        yield descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))


def _config(name: str) -> dict[str, Any]:
    return dict(json.loads((GHZ / name).read_text()))


def _field_paths(data: Any, message: Descriptor, prefix: str = "") -> Iterator[tuple[str, FieldDescriptor | None]]:
    """Every key of `data` as (dotted path, its field in `message` or None when there is none)."""
    for key, value in data.items():
        field = message.fields_by_name.get(key) or message.fields_by_camelcase_name.get(key)
        yield prefix + key, field
        if field is None or field.message_type is None:
            continue
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, dict):
                yield from _field_paths(item, field.message_type, f"{prefix}{key}.")


@pytest.mark.parametrize("name", CONFIGS)
def test_config_names_an_existing_server_streaming_method(name: str, reflected: descriptor_pool.DescriptorPool) -> None:
    config = _config(name)
    assert set(config) <= GHZ_KEYS, f"unknown ghz keys: {set(config) - GHZ_KEYS}"
    service_name, method_name = config["call"].rsplit(".", 1)
    method = reflected.FindServiceByName(service_name).methods_by_name[method_name]
    assert method.server_streaming and not method.client_streaming
    assert method.input_type.full_name == "infer.v1.GenerateRequest"
    assert (ROOT / config["data-file"]).is_file()


def test_proto_variant_points_at_the_served_proto(reflected: descriptor_pool.DescriptorPool) -> None:
    config = _config("generate.json")
    proto = ROOT / config["proto"]
    assert proto.is_file() and all((ROOT / p).is_dir() for p in config["import-paths"])
    served = reflected.FindFileContainingSymbol("infer.v1.InferenceService")
    assert proto.relative_to(ROOT / config["import-paths"][0]).as_posix() == served.name
    assert "proto" not in _config("generate-reflection.json")  # ghz then asks the server's reflection service


def test_every_data_field_exists_and_parses(reflected: descriptor_pool.DescriptorPool) -> None:
    request = reflected.FindMessageTypeByName("infer.v1.GenerateRequest")
    data = json.loads((GHZ / "generate-data.json").read_text())
    assert isinstance(data, list) and data
    for item in data:
        missing = [path for path, field in _field_paths(item, request) if field is None]
        assert not missing, f"fields not in infer.v1.GenerateRequest: {missing}"
        message = message_factory.GetMessageClass(request)()
        json_format.ParseDict(item, message)  # types and enum values as well as names
        assert message.WhichOneof("input") is not None


def test_field_check_catches_a_misspelt_field(reflected: descriptor_pool.DescriptorPool) -> None:
    request = reflected.FindMessageTypeByName("infer.v1.GenerateRequest")
    paths = dict(_field_paths({"prompt": "x", "sampling": {"max_token": 3}}, request))
    assert paths["prompt"] is not None and paths["sampling.max_token"] is None
