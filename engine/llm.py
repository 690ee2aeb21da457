"""The offline API: `LLM(model).generate(prompts, params)` for scripts and benchmarks."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from infer.engine.config import EngineConfig
from infer.engine.core import EngineCore, QueueFullError
from infer.engine.input_processor import ProcessedInput, Prompt
from infer.engine.output_processor import caller_outputs
from infer.engine.request import FinishReason, RequestOutput, Sink, Timings, TokenLogprob, Usage
from infer.engine.sampling_params import SamplingParams
from infer.engine.tools import Tool, ToolCallDelta, ToolChoice


@dataclass
class CompletionOutput:
    prompt_token_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    error: str | None = None
    tool_calls: list[ToolCallDelta] = field(default_factory=list)  # a chat with tools: the calls it made, whole

    def add(self, delta: RequestOutput) -> None:
        self.text += delta.text
        self.token_ids.extend(delta.token_ids)
        for call in delta.tool_calls:  # a call's first delta names it; later ones add to its arguments
            if call.id or not self.tool_calls or self.tool_calls[-1].index != call.index:
                self.tool_calls.append(call)
            else:
                last = self.tool_calls[-1]
                self.tool_calls[-1] = replace(last, arguments=last.arguments + call.arguments)
        if delta.logprobs is not None:
            self.logprobs = (self.logprobs or []) + delta.logprobs
        if delta.finished:
            self.finish_reason, self.usage, self.timings = delta.finish_reason, delta.usage, delta.timings
            self.error = delta.error


class LLM:
    """Runs the engine in the calling thread until every prompt is done."""

    def __init__(self, model: str | None = None, **settings: Any) -> None:
        self._use(EngineCore.from_config(EngineConfig.from_dict({"model": model, **settings})))

    @classmethod
    def from_core(cls, core: EngineCore) -> LLM:
        """An LLM over an engine core built from its parts (a custom or fake runner)."""
        llm = cls.__new__(cls)
        llm._use(core)
        return llm

    def _use(self, core: EngineCore) -> None:
        self.core, self.tokenizer = core, core.tokenizer
        self._next_id = 0

    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[CompletionOutput]:
        """One output per prompt, in order. Prompts are text or token id lists.

        More prompts than `max_waiting_requests` are fed to the engine as room frees up. A call that fails
        (an exception, Ctrl-C) aborts what it queued: the engine is left as it was found.
        """
        items: list[str | Sequence[int]] = (
            [prompts] if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)) else list(prompts)  # type: ignore[list-item]
        )
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(items)
        if len(params) != len(items):
            raise ValueError(f"params: {len(params)} given for {len(items)} prompts")
        processed = [self.core.processor.process(_prompt(p), sp) for p, sp in zip(items, params, strict=True)]
        return self._run(processed)

    def _run(self, processed: list[ProcessedInput]) -> list[CompletionOutput]:
        outputs = [CompletionOutput(p.prompt_token_ids) for p in processed]
        pending = deque((self._new_id(), out, p) for out, p in zip(outputs, processed, strict=True))
        added: list[str] = []
        try:
            while True:
                added += self._feed(pending)
                if not pending and all(o.finish_reason is not None for o in outputs):
                    return outputs
                if not self.core.step() and not self.core.has_work and not pending:
                    raise RuntimeError("engine stopped with unfinished requests")
        except BaseException:
            self.core.abort_now(added)
            raise

    def _new_id(self) -> str:
        self._next_id += 1
        return f"llm-{self._next_id}"

    def _feed(self, pending: deque[tuple[str, CompletionOutput, ProcessedInput]]) -> list[str]:
        """Enqueue from the front of `pending` until the engine's queue is full; the ids enqueued."""
        added = []
        while pending:
            request_id, out, p = pending[0]
            try:
                self.core.submit(request_id, p, self._sink(p, out.add))
            except QueueFullError:
                break
            added.append(request_id)
            pending.popleft()
        return added

    def _sink(self, processed: ProcessedInput, sink: Sink) -> Sink:
        """`sink`, given each delta as a caller reads it (logprob token text, tool calls; `CallerOutputs`)."""
        outputs = caller_outputs(processed, self.tokenizer)
        if outputs is None:
            return sink
        return lambda delta: sink(outputs(delta))

    def stream(self, prompt: str | Sequence[int], params: SamplingParams | None = None) -> Iterator[RequestOutput]:
        """Deltas of one request as the engine steps: the text streams as it is generated. Closing the
        iterator early (or an exception in it) aborts the request."""
        processed = self.core.processor.process(_prompt(prompt), params or SamplingParams())
        deltas: deque[RequestOutput] = deque()
        request_id = self._new_id()
        self.core.submit(request_id, processed, self._sink(processed, deltas.append))
        finished = False
        try:
            while not finished:
                while not deltas:
                    self.core.step()
                delta = deltas.popleft()
                finished = delta.finished
                yield delta
        finally:
            if not finished:
                self.core.abort_now([request_id])

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        params: SamplingParams | None = None,
        tools: Sequence[Tool] = (),
        tool_choice: ToolChoice | None = None,
        **template_kwargs: Any,
    ) -> CompletionOutput:
        """One chat completion: the messages rendered by the model's chat template (`template_kwargs`: more of
        its variables, e.g. `enable_thinking`). With `tools`, the calls the model makes are in `tool_calls`
        (and the finish reason is `tool_calls`), as the server returns them."""
        choice = tool_choice or ToolChoice()
        prompt = Prompt(messages=messages, tools=tools, tool_choice=choice, template_kwargs=template_kwargs)
        return self._run([self.core.processor.process(prompt, params or SamplingParams())])[0]


def _prompt(prompt: str | Sequence[int]) -> Prompt:
    return Prompt(text=prompt) if isinstance(prompt, str) else Prompt(token_ids=[int(t) for t in prompt])
