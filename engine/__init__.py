"""The engine's public face: what the server (and any other caller) may import from `infer.engine`.

`EngineClient` is the interface the server drives (`AsyncEngine` implements it); the rest are the plain
types it speaks. Submodules are the engine's insides. Imports are lazy: `import infer.engine` loads no torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infer.engine.async_engine import AsyncEngine
    from infer.engine.config import DEFAULT_MAX_TENANTS, DTYPES, QUANTIZATIONS, SCHEDULING_POLICIES, EngineConfig
    from infer.engine.default_model import default_model_dir
    from infer.engine.inbox import QueueFullError
    from infer.engine.input_processor import InputLimits, InputProcessor, ProcessedInput, Prompt
    from infer.engine.interface import EngineClient, ModelInfo
    from infer.engine.llm import LLM
    from infer.engine.loader import ModelLoadError
    from infer.engine.output_processor import CallerOutputs
    from infer.engine.request import DEFAULT_TENANT, FinishReason, RequestOutput, Timings, TokenLogprob, Usage
    from infer.engine.sampling_params import SamplingParams
    from infer.engine.stats import EngineStats
    from infer.engine.stream import RequestStream
    from infer.engine.structured import Constraint
    from infer.engine.tokenizer import Tokenizer
    from infer.engine.tools.parsers import ToolCallDelta, ToolCallParser
    from infer.engine.tools.use import Tool, ToolChoice, ToolChoiceMode, ToolUse
    from infer.engine.validation import InvalidInput, Refusal, check

_EXPORTS = {
    "DEFAULT_TENANT": "request",
    "AsyncEngine": "async_engine",
    "CallerOutputs": "output_processor",
    "Constraint": "structured",
    "DEFAULT_MAX_TENANTS": "config",
    "DTYPES": "config",
    "EngineClient": "interface",
    "EngineConfig": "config",
    "EngineStats": "stats",
    "FinishReason": "request",
    "InputLimits": "input_processor",
    "InputProcessor": "input_processor",
    "InvalidInput": "validation",
    "LLM": "llm",
    "ModelLoadError": "loader",
    "ModelInfo": "interface",
    "ProcessedInput": "input_processor",
    "Prompt": "input_processor",
    "QUANTIZATIONS": "config",
    "SCHEDULING_POLICIES": "config",
    "QueueFullError": "inbox",
    "Refusal": "validation",
    "RequestOutput": "request",
    "RequestStream": "stream",
    "SamplingParams": "sampling_params",
    "Timings": "request",
    "TokenLogprob": "request",
    "Tokenizer": "tokenizer",
    "Tool": "tools.use",
    "ToolCallDelta": "tools.parsers",
    "ToolCallParser": "tools.parsers",
    "ToolChoice": "tools.use",
    "ToolChoiceMode": "tools.use",
    "ToolUse": "tools.use",
    "Usage": "request",
    "check": "validation",
    "default_model_dir": "default_model",
}
__all__ = [
    "DEFAULT_MAX_TENANTS",
    "DEFAULT_TENANT",
    "DTYPES",
    "LLM",
    "QUANTIZATIONS",
    "SCHEDULING_POLICIES",
    "AsyncEngine",
    "CallerOutputs",
    "Constraint",
    "EngineClient",
    "EngineConfig",
    "EngineStats",
    "FinishReason",
    "InputLimits",
    "InputProcessor",
    "InvalidInput",
    "ModelInfo",
    "ModelLoadError",
    "ProcessedInput",
    "Prompt",
    "QueueFullError",
    "Refusal",
    "RequestOutput",
    "RequestStream",
    "SamplingParams",
    "Timings",
    "TokenLogprob",
    "Tokenizer",
    "Tool",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolChoice",
    "ToolChoiceMode",
    "ToolUse",
    "Usage",
    "check",
    "default_model_dir",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'infer.engine' has no attribute {name!r}")
    return getattr(import_module(f"infer.engine.{module}"), name)
