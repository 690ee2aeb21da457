"""How a request's output is produced, from sampled token ids to what its caller reads.

Two halves, one for each thread:
- `OutputProcessor`, on the thread that steps: each request's new tokens through its grammar, the
  detokenizer and the stop conditions, into one delta per step (`RequestOutput`: ids, text, logprobs); the
  delta that ends a request carries the finish reason, the text held back, usage and timings.
- `CallerOutputs`, on the caller's thread (the servicer's event loop, the offline `LLM`'s): what the step
  thread never pays for, per delta: each logprob's token text, and the tool calls parsed out of the text.
"""

from __future__ import annotations

import time
from collections.abc import Sequence, Set
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from infer.engine.detokenizer import Decoder, IncrementalDetokenizer
from infer.engine.request import FinishReason, LiveRequest, RequestOutput, TokenLogprob
from infer.engine.sampling_params import SamplingParams
from infer.engine.stopping import finish_reason, is_stop_token

if TYPE_CHECKING:
    from infer.engine.input_processor import ProcessedInput
    from infer.engine.tools.parsers import ToolCallParser

Tokens = Sequence[tuple[int, TokenLogprob | None]]  # a step's new tokens of one request, with their logprobs


@dataclass(slots=True)
class Delta:
    """A step's output of one request; `finish_reason` set when it ends the request."""

    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None
    finish_reason: FinishReason | None = None


class OutputProcessor:
    """Tokens in, deltas out, on the thread that steps: grammar accept, detokenizing, stop strings and tokens,
    max_tokens and max_model_len, then the final delta."""

    def __init__(self, tokenizer: Decoder, eos_token_ids: Set[int], max_model_len: int) -> None:
        self.tokenizer, self.eos_token_ids, self.max_model_len = tokenizer, eos_token_ids, max_model_len

    def detokenizer(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens, params.stop)

    def process(self, r: LiveRequest, tokens: Tokens) -> Delta:
        """A step's tokens as one delta; the first that ends the request ends it, and the rest are dropped
        (also from the request's output: accepted drafts past a stop are not output)."""
        if r.first_token_s is None:
            r.first_token_s = time.monotonic()
        num_before = r.num_output_tokens - len(tokens)  # the scheduler has appended them
        ids: list[int] = []
        logprobs: list[TokenLogprob] = []
        text = ""
        for i, (token_id, logprob) in enumerate(tokens):
            if r.grammar is not None and not r.grammar.accept(token_id):
                raise RuntimeError(f"token {token_id} is outside the request's {r.grammar.constraint.kind} constraint")
            ids.append(token_id)
            logprobs += [logprob] if logprob is not None else []
            # a stop token adds no text
            text += "" if is_stop_token(token_id, r.params, self.eos_token_ids) else r.detokenizer.push([token_id])
            reason = self._finish_reason(r, token_id, num_before + i + 1)
            if reason is not None:
                del r.output_token_ids[num_before + i + 1 :]
                return Delta(ids, text, logprobs or None, reason)
        return Delta(ids, text, logprobs or None)

    def _finish_reason(self, r: LiveRequest, token_id: int, num_output: int) -> FinishReason | None:
        hit_stop_string = r.detokenizer.stopped_on is not None
        reason = finish_reason(r, token_id, hit_stop_string, self.eos_token_ids, self.max_model_len, num_output)
        if reason is None and r.grammar is not None and r.grammar.is_terminated:
            return FinishReason.STOP  # the constraint is complete
        return reason

    @staticmethod
    def delta(r: LiveRequest, delta: Delta) -> RequestOutput:
        """A delta that does not end the request."""
        return RequestOutput(r.request_id, delta.token_ids, delta.text, delta.logprobs)

    @staticmethod
    def final(
        r: LiveRequest, reason: FinishReason, delta: Delta | None = None, error: str | None = None
    ) -> RequestOutput:
        """The delta that ends the request: the text held back (unless a stop string cut it), usage, timings."""
        ids, text, logprobs = (delta.token_ids, delta.text, delta.logprobs) if delta is not None else ([], "", None)
        if reason in (FinishReason.LENGTH, FinishReason.STOP) and r.detokenizer.stopped_on is None:
            text += r.detokenizer.flush()
        timings = r.timings(time.monotonic())
        return RequestOutput(r.request_id, list(ids), text, logprobs, reason, r.usage(), timings, error)


class CallerOutputs:
    """One request's deltas as its caller reads them: logprobs with their tokens' text, and with tools, the
    text split into content and tool calls (the final delta's STOP becomes TOOL_CALLS when there were calls).
    On the caller's thread, in the order the deltas come."""

    def __init__(self, tokenizer: Decoder, parser: ToolCallParser | None) -> None:
        self.tokenizer, self.parser = tokenizer, parser

    @classmethod
    def of(cls, processed: ProcessedInput, tokenizer: Decoder) -> CallerOutputs:
        return cls(tokenizer, processed.parser())

    def __call__(self, out: RequestOutput) -> RequestOutput:
        if out.logprobs:
            out = replace(out, logprobs=[self._with_text(lp) for lp in out.logprobs])
        return self._parse_calls(out) if self.parser is not None else out

    def _text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _with_text(self, lp: TokenLogprob) -> TokenLogprob:
        return replace(lp, token=self._text(lp.token_id), top_tokens=tuple(self._text(t) for t, _ in lp.top))

    def _parse_calls(self, out: RequestOutput) -> RequestOutput:
        assert self.parser is not None
        parsed = [self.parser.feed(out.text)]
        if out.finished:
            parsed.append(self.parser.finish())
        reason = out.finish_reason
        if reason is FinishReason.STOP and self.parser.has_calls:
            reason = FinishReason.TOOL_CALLS
        calls = tuple(c for p in parsed for c in p.calls)
        return replace(out, text="".join(p.content for p in parsed), tool_calls=calls, finish_reason=reason)


def caller_outputs(processed: ProcessedInput, tokenizer: Decoder) -> CallerOutputs | None:
    """What a request's caller applies to each delta; None when there is nothing to do (no logprobs, no tools)."""
    parser = processed.parser()
    if parser is None and processed.params.logprobs is None:
        return None
    return CallerOutputs(tokenizer, parser)
