"""Model architectures: one decoder over a flat token layout, plus per-architecture weight rules."""

from infer.engine.models.base import CausalLM, StepInput
from infer.engine.models.weights import checkpoint_to_params

__all__ = ["CausalLM", "StepInput", "checkpoint_to_params"]
