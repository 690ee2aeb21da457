"""The gRPC contract of infer: the generated stubs of `proto/infer/v1` and the names the server, the gateway and
the clients share. Everything that speaks the protocol imports it from here (a test walks their imports).

    from infer.api import SERVICE_NAME, pb, pb_grpc

No engine import: cheap for gateways and scripts. `make proto` regenerates `infer.api.v1` (`codegen.py`).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from typing import Literal, get_args

from infer.api.v1 import inference_pb2 as pb
from infer.api.v1 import inference_pb2_grpc as pb_grpc

__all__ = [
    "API_KEY_METADATA",
    "BEARER",
    "CHAT_ROLES",
    "CONSTRAINT_FIELDS",
    "DEFAULT_ADDRESS",
    "DEFAULT_GRPC_PORT",
    "ERROR_REASON_KEY",
    "FINISH_REASONS",
    "INVALID_FIELD_KEY",
    "MAX_REQUEST_ID_CHARS",
    "OPTIONAL_SAMPLING_FIELDS",
    "REQUEST_ID",
    "RETRY_AFTER_KEY",
    "SERVICE",
    "SERVICE_NAME",
    "UNARY_METHODS",
    "ChatRole",
    "ErrorReason",
    "bearer",
    "bearer_key",
    "error_reason",
    "pb",
    "pb_grpc",
    "retry_after_s",
]

# the service
SERVICE = pb.DESCRIPTOR.services_by_name["InferenceService"]
SERVICE_NAME: str = SERVICE.full_name  # "infer.v1.InferenceService"; also its grpc.health.v1 service name
UNARY_METHODS: tuple[str, ...] = tuple(m.name for m in SERVICE.methods if not m.server_streaming)
DEFAULT_GRPC_PORT = 50051
DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_GRPC_PORT}"
API_KEY_METADATA = "authorization"  # its value: "Bearer <key>" (gRPC metadata, or the HTTP header)
BEARER = "Bearer"  # the scheme of an API key (RFC 6750); a server reads it in any case


def bearer(api_key: str) -> str:
    """The API_KEY_METADATA value that carries `api_key`."""
    return f"{BEARER} {api_key}"


def bearer_key(value: str | None) -> str | None:
    """The key of an API_KEY_METADATA value (`Bearer <key>`, the scheme in any case); None for another scheme."""
    prefix = f"{BEARER.lower()} "
    if value is None or value[: len(prefix)].lower() != prefix:
        return None
    return value[len(prefix) :].strip()


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

# errors: a refused call ends with a gRPC code and a message for people; its trailing metadata says why
# (ERROR_REASON_KEY, an ErrorReason) and, for INVALID_ARGUMENT, which request field is at fault
# (INVALID_FIELD_KEY: `sampling.max_tokens`, `messages[1].role`). Programs read these, never the message.
ERROR_REASON_KEY = "infer-error-reason"
INVALID_FIELD_KEY = "infer-invalid-field"
RETRY_AFTER_KEY = "infer-retry-after-s"  # whole seconds until a refused call would be let in (BUDGET_EXCEEDED)


class ErrorReason(enum.StrEnum):
    """Why the server refused a call (the value of ERROR_REASON_KEY), beside its gRPC code. A call refused for
    another cause (UNAUTHENTICATED, CANCELLED, DEADLINE_EXCEEDED, INTERNAL, gRPC's own errors) carries none:
    its code says it."""

    INVALID_VALUE = "INVALID_VALUE"  # INVALID_ARGUMENT: a value the request may not have
    CONTEXT_LENGTH_EXCEEDED = "CONTEXT_LENGTH_EXCEEDED"  # INVALID_ARGUMENT: the prompt, or the prompt + max_tokens,
    # over max_model_len, or a prompt over an operator's bound on its size (max_prompt_tokens, max_prompt_chars,
    # max_chat_messages)
    OVER_LIMIT = "OVER_LIMIT"  # INVALID_ARGUMENT: over an operator's limit that is not the prompt's size
    DUPLICATE_REQUEST_ID = "DUPLICATE_REQUEST_ID"  # INVALID_ARGUMENT: the request id is already in flight
    DOES_NOT_COMPILE = "DOES_NOT_COMPILE"  # INVALID_ARGUMENT: a constraint or a tool's parameters that the
    # grammar compiler refuses (or that it would not enforce)
    QUEUE_FULL = "QUEUE_FULL"  # RESOURCE_EXHAUSTED: a bounded queue is full; retry later
    NOT_SERVING = "NOT_SERVING"  # UNAVAILABLE: the server is starting or draining; try another replica
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"  # RESOURCE_EXHAUSTED: the tenant's token budget is spent; retry after
    # RETRY_AFTER_KEY seconds
    CHAT_TEMPLATE_FAILED = "CHAT_TEMPLATE_FAILED"  # INVALID_ARGUMENT: the model's chat template raised on the
    # messages, or ran past its time or size bound


def error_reason(trailing_metadata: Iterable[tuple[str, str | bytes]] | None) -> ErrorReason | None:
    """The reason in a refused call's trailing metadata; None when it names none (or one this client does not
    know: a newer server's)."""
    for key, value in trailing_metadata or ():
        if key == ERROR_REASON_KEY and isinstance(value, str) and value in ErrorReason.__members__:
            return ErrorReason(value)
    return None


def retry_after_s(trailing_metadata: Iterable[tuple[str, str | bytes]] | None) -> int | None:
    """The seconds a refused call's trailing metadata says to wait (RETRY_AFTER_KEY); None when it says none."""
    for key, value in trailing_metadata or ():
        if key == RETRY_AFTER_KEY and isinstance(value, str) and value.isdigit():
            return int(value)
    return None


# responses: proto -> OpenAI's words
FINISH_REASONS = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length",
                  pb.FINISH_REASON_TOOL_CALLS: "tool_calls"}  # fmt: skip
