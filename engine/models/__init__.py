"""Model architectures: one decoder over a flat token layout, plus per-architecture weight rules."""

from infer.engine.models.base import CausalLM, StepInput
from infer.engine.models.layers import Linear
from infer.engine.models.weights import Target, checkpoint_target, convert_tensor

__all__ = ["CausalLM", "Linear", "StepInput", "Target", "checkpoint_target", "convert_tensor"]
