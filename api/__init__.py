"""The gRPC contract of infer: the generated stubs of `proto/infer/v1` and the names the server, the gateway and
the clients share. Everything that speaks the protocol imports it from here (a test walks their imports).

    from infer.api import SERVICE_NAME, pb, pb_grpc

No engine import: cheap for gateways and scripts. `make proto` regenerates `infer.api.v1` (`codegen.py`).
"""

from __future__ import annotations

import re
from typing import Literal, get_args

from infer.api.v1 import inference_pb2 as pb
from infer.api.v1 import inference_pb2_grpc as pb_grpc

__all__ = [
    "API_KEY_METADATA",
    "CHAT_ROLES",
    "CONSTRAINT_FIELDS",
    "DEFAULT_ADDRESS",
    "DEFAULT_GRPC_PORT",
    "FINISH_REASONS",
    "INVALID_FIELD_KEY",
    "MAX_REQUEST_ID_CHARS",
    "OPTIONAL_SAMPLING_FIELDS",
    "REQUEST_ID",
    "SERVICE",
    "SERVICE_NAME",
    "UNARY_METHODS",
    "ChatRole",
    "pb",
    "pb_grpc",
]

# the service
SERVICE = pb.DESCRIPTOR.services_by_name["InferenceService"]
SERVICE_NAME: str = SERVICE.full_name  # "infer.v1.InferenceService"; also its grpc.health.v1 service name
UNARY_METHODS: tuple[str, ...] = tuple(m.name for m in SERVICE.methods if not m.server_streaming)
DEFAULT_GRPC_PORT = 50051
DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_GRPC_PORT}"
API_KEY_METADATA = "authorization"  # its value: "Bearer <key>" (gRPC metadata, or the HTTP header)

# requests
MAX_REQUEST_ID_CHARS = 128
# 1 to 128 visible ASCII characters. NOTE: \Z, not $: `$` also matches before a final newline
REQUEST_ID = re.compile(rf"^[\x21-\x7e]{{1,{MAX_REQUEST_ID_CHARS}}}\Z")
ChatRole = Literal["system", "developer", "user", "assistant", "tool"]  # "developer": OpenAI's newer "system"
CHAT_ROLES: tuple[ChatRole, ...] = get_args(ChatRole)
# the sampling message's `constraint` oneof: json_schema, regex, grammar, choice, json_object
CONSTRAINT_FIELDS: tuple[str, ...] = tuple(
    f.name for f in pb.SamplingParams.DESCRIPTOR.oneofs_by_name["constraint"].fields
)
# the proto3 `optional` sampling fields: unset = the server's default
OPTIONAL_SAMPLING_FIELDS: tuple[str, ...] = tuple(
    f.name
    for f in pb.SamplingParams.DESCRIPTOR.fields
    if f.has_presence and f.message_type is None and f.name not in CONSTRAINT_FIELDS
)

# errors: INVALID_ARGUMENT's trailing metadata names the request field at fault (`sampling.max_tokens`,
# `messages[1].role`), apart from the message
INVALID_FIELD_KEY = "infer-invalid-field"

# responses: proto -> OpenAI's words
FINISH_REASONS = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length",
                  pb.FINISH_REASON_TOOL_CALLS: "tool_calls"}  # fmt: skip
