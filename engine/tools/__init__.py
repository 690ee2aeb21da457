"""Tool calling: tools into the prompt and the constraint of `tool_choice` (`use`), and tool calls out of the
streamed text (`parsers`)."""

from infer.engine.tools.parsers import ToolCallDelta, ToolCallParser
from infer.engine.tools.use import Tool, ToolChoice, ToolChoiceMode, ToolUse

__all__ = ["Tool", "ToolCallDelta", "ToolCallParser", "ToolChoice", "ToolChoiceMode", "ToolUse"]
