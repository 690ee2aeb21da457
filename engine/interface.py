"""The engine as the server sees it: `EngineClient`, the one interface `infer.server` uses.

`AsyncEngine` implements it. The server imports the engine only through `infer.engine` (this protocol and
the plain types it speaks); it never reaches into the engine core.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from infer.engine.config import EngineConfig
from infer.engine.cuda_graphs import NO_GRAPHS, GraphStats
from infer.engine.input_processor import InputLimits, ProcessedInput, Prompt
from infer.engine.sampling_params import SamplingParams
from infer.engine.stats import EngineStats
from infer.engine.stream import RequestStream
from infer.engine.structured import Constraint
from infer.engine.tokenizer import Tokenizer


@dataclass(frozen=True)
class ModelInfo:
    """What the served model is, as clients see it."""

    model_id: str  # the name clients use: the model directory's name
    model_dir: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]  # sorted; generation stops at any of them unless ignore_eos
    has_chat_template: bool
    kernels: str = ""  # the kernel backend the model runs on (torch | cpu | triton, as INFER_KERNELS names them)
    cuda_graphs: GraphStats = NO_GRAPHS  # the decode steps captured at start (none: no sizes)


class EngineClient(Protocol):
    @property
    def config(self) -> EngineConfig: ...

    @property
    def model_info(self) -> ModelInfo: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    def process(self, prompt: Prompt, params: SamplingParams, limits: InputLimits | None = None) -> ProcessedInput:
        """The request rendered, tokenized and checked, once (the input processor; CPU work: call it off the
        event loop); InvalidInput naming the field when it cannot run."""
        ...

    def tokenize(self, prompt: Prompt, limits: InputLimits | None = None) -> ProcessedInput:
        """The prompt's token ids (a chat rendered), not checked against the model (off the event loop)."""
        ...

    async def compile_constraint(self, constraint: Constraint) -> None:
        """Return once the constraint has compiled (off the event loop; the engine keeps the result for the
        requests that use it); ValueError naming its kind when it does not compile."""
        ...

    def predict_ttft_s(self, num_prompt_tokens: int) -> float:
        """Seconds until a new request's first token, from the work queued ahead of it."""
        ...

    def stats(self) -> EngineStats: ...

    def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        tenant: str | None = None,
    ) -> RequestStream:
        """Enqueue and stream deltas; ValueError for bad input, QueueFullError when the queue is full. `tenant`:
        who asks, for the fair policy (None: the default tenant)."""
        ...

    def submit(
        self, processed: ProcessedInput, request_id: str | None = None, tenant: str | None = None
    ) -> RequestStream:
        """`generate` for a request `process` returned; QueueFullError when the queue is full."""
        ...

    def abort(self, request_id: str) -> None: ...

    def problem(self, stall_timeout_s: float) -> str | None:
        """Why the engine cannot make progress (stalled or dead), or None when it is healthy."""
        ...

    async def warmup(self) -> None:
        """Run one small greedy request through the path real ones take, so the first real one finds the kernels
        warm and the rates measured; raises (WarmupError) when it fails."""
        ...

    def shutdown(self) -> None: ...
