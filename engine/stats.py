"""Engine counters and gauges for metrics, and the time-to-first-token estimate for admission."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    num_waiting: int
    num_running: int
    num_blocks_used: int
    num_blocks_free: int
    num_preemptions_total: int
    num_prompt_tokens_total: int  # computed prompt tokens (prefix-cache hits excluded)
    num_generation_tokens_total: int
    num_cached_tokens_total: int  # prompt tokens served from the prefix cache
    tokens_per_s: float  # recent forward-pass throughput (0 before the first step)
    queued_tokens: int  # tokens still to compute: requests not yet scheduled, waiting and prefilling


class ThroughputMeter:
    """Exponential moving average of tokens per second over engine steps."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha, self.tokens_per_s = alpha, 0.0

    def record(self, num_tokens: int, elapsed_s: float) -> None:
        if elapsed_s <= 0:
            return
        rate = num_tokens / elapsed_s
        self.tokens_per_s = rate if self.tokens_per_s == 0 else (1 - self.alpha) * self.tokens_per_s + self.alpha * rate

    def predict_s(self, num_tokens: int) -> float:
        """Seconds to compute num_tokens at the recent rate; 0 when nothing has been measured yet."""
        return num_tokens / self.tokens_per_s if self.tokens_per_s > 0 else 0.0
