"""Python clients of the infer.v1 gRPC service (no engine import: cheap for gateways and scripts)."""

from infer.api import DEFAULT_ADDRESS
from infer.clients.client import AsyncInferClient, GenerateStream, InferClient
from infer.clients.types import Chunk, Completion, InferError, ModelInfo, Sampling, Timings, TokenLogprob, Usage

__all__ = [
    "DEFAULT_ADDRESS",
    "AsyncInferClient",
    "Chunk",
    "Completion",
    "GenerateStream",
    "InferClient",
    "InferError",
    "ModelInfo",
    "Sampling",
    "Timings",
    "TokenLogprob",
    "Usage",
]
