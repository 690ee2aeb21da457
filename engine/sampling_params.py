"""Per-request sampling parameters, validated at the edge."""

from __future__ import annotations

from dataclasses import dataclass

from infer.engine.speculation.state import MAX_SPECULATIVE_TOKENS
from infer.engine.structured import Constraint
from infer.engine.validation import check

# NOTE: the sampler works in float32: a positive temperature or repetition penalty far below these divides the
# logits into inf (or rounds to 0: 1e-300 is 0.0 in float32) and every draw is NaN. Smaller values are raised
# to these minimums (docs/api.md), which sample as good as greedily.
MIN_TEMPERATURE = 0.01
MIN_REPETITION_PENALTY = 0.01
# scheduling priority, lower is sooner (vLLM's sense; the `priority` and `fair` policies read it: engine/policies/)
MIN_PRIORITY, MAX_PRIORITY = -20, 20


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int | None = 16  # None: as many as the context leaves (the input processor settles it)
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # > 1 discourages tokens seen in prompt or output
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None  # None = off; n = the sampled token's logprob and the top n
    skip_special_tokens: bool = True
    constraint: Constraint | None = None  # the output must match it (JSON schema, regex, grammar, choice)
    speculative_tokens: int | None = None  # n-gram drafts per step, at most; None = the engine's; 0 = off
    priority: int = 0  # lower is sooner, under the priority and fair policies (fcfs ignores it)

    def __post_init__(self) -> None:
        # accept lists from callers; keep the dataclass hashable
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        check("max_tokens", self.max_tokens is None or self.max_tokens >= 1, "must be >= 1")
        check("temperature", 0.0 <= self.temperature <= 100.0, "must be in [0, 100]")
        check("top_p", 0.0 < self.top_p <= 1.0, "must be in (0, 1]")
        check("top_k", self.top_k >= 0, "must be >= 0 (0 = off)")
        check("min_p", 0.0 <= self.min_p <= 1.0, "must be in [0, 1]")
        check("repetition_penalty", 0.0 < self.repetition_penalty <= 10.0, "must be in (0, 10]")
        check("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "must be in [-2, 2]")
        check("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "must be in [-2, 2]")
        max_tokens = self.max_tokens if self.max_tokens is not None else self.min_tokens
        check("min_tokens", 0 <= self.min_tokens <= max_tokens, "must be in [0, max_tokens]")
        check("logprobs", self.logprobs is None or 0 <= self.logprobs <= 20, "must be in [0, 20]")
        check("stop", all(isinstance(s, str) and s for s in self.stop), "must be non-empty strings")
        check("stop", len(self.stop) <= 16, "at most 16 stop strings")
        check("stop_token_ids", all(t >= 0 for t in self.stop_token_ids), "must be >= 0")
        check("seed", self.seed is None or 0 <= self.seed < 2**63, "must be in [0, 2**63)")
        check("constraint", self.constraint is None or isinstance(self.constraint, Constraint), "must be a Constraint")
        spec = self.speculative_tokens
        check("speculative_tokens", spec is None or 0 <= spec <= MAX_SPECULATIVE_TOKENS,
              f"must be in [0, {MAX_SPECULATIVE_TOKENS}] (0 = off)")  # fmt: skip
        ok = isinstance(self.priority, int) and MIN_PRIORITY <= self.priority <= MAX_PRIORITY
        check("priority", ok, f"must be an integer in [{MIN_PRIORITY}, {MAX_PRIORITY}] (lower is sooner)")
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            object.__setattr__(self, "temperature", MIN_TEMPERATURE)
        if self.repetition_penalty < MIN_REPETITION_PENALTY:
            object.__setattr__(self, "repetition_penalty", MIN_REPETITION_PENALTY)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
