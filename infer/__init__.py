"""infer: an LLM inference microservice.

The offline API is importable from the root: `from infer import LLM, SamplingParams`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["LLM", "EngineConfig", "SamplingParams", "__version__"]

if TYPE_CHECKING:
    from infer.engine.config import EngineConfig
    from infer.engine.llm import LLM
    from infer.engine.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    # lazy: `import infer` stays cheap (no torch) for the CLI and the gateway
    if name == "LLM":
        from infer.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from infer.engine.sampling_params import SamplingParams

        return SamplingParams
    if name == "EngineConfig":
        from infer.engine.config import EngineConfig

        return EngineConfig
    raise AttributeError(f"module 'infer' has no attribute {name!r}")
