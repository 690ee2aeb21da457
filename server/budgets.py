"""Token budgets per tenant: tokens per minute, prompt and output tokens alike, kept as token buckets.

A tenant's bucket holds up to one minute of its budget and refills continuously (`tokens_per_minute / 60` a
second). A request is admitted when the bucket holds its prompt's tokens (a prompt larger than the whole budget:
when the bucket is full), and those are taken at once; its output tokens are taken as they are produced. So a
request in flight may overdraw the bucket (its output is never cut), and the tenant's next request waits until
the bucket has refilled: refused meanwhile with RESOURCE_EXHAUSTED (HTTP 429) and the seconds until it would be
admitted (Retry-After). Prompt tokens count whether or not the prefix cache held them.

At most `max_buckets` tenants' buckets are kept (`--max-tenants`): when a new one would pass it, the full ones
are forgotten (a full bucket is what a new one is), and if more than half are still kept, the least recently used
go until half are (forgiven what they owed: a bucket refills from empty within a minute, so the least recently used
are the first to have refilled). Memory stays bounded, and the full pass runs once per half the bound new tenants.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from infer.engine import DEFAULT_MAX_TENANTS

SECONDS_PER_MINUTE = 60.0


class BudgetExceededError(Exception):
    """The tenant's token budget cannot pay for the request's prompt now; `retry_after_s` until it can."""

    def __init__(self, tenant: str, tokens_per_minute: int, retry_after_s: int) -> None:
        super().__init__(
            f"tenant {tenant!r} is over its token budget of {tokens_per_minute} tokens per minute (prompt and output "
            f"tokens): retry in {retry_after_s} s"
        )
        self.tenant, self.tokens_per_minute, self.retry_after_s = tenant, tokens_per_minute, retry_after_s


@dataclass
class _Bucket:
    tokens_per_minute: int
    level: float  # tokens available; below 0 after an overdraw
    updated_s: float

    def refill(self, now_s: float) -> None:
        rate = self.tokens_per_minute / SECONDS_PER_MINUTE
        self.level = min(float(self.tokens_per_minute), self.level + (now_s - self.updated_s) * rate)
        self.updated_s = now_s

    @property
    def is_full(self) -> bool:
        return self.level >= self.tokens_per_minute


class TokenBudgets:
    """`tokens_per_minute(tenant)`: a tenant's budget (None: none). Lives on the server's event loop: `check`
    then `charge` with no await between them is one step."""

    def __init__(
        self,
        tokens_per_minute: Callable[[str], int | None],
        clock: Callable[[], float] = time.monotonic,
        max_buckets: int = DEFAULT_MAX_TENANTS,
    ) -> None:
        self.tokens_per_minute, self.clock, self.max_buckets = tokens_per_minute, clock, max_buckets
        self._buckets: dict[str, _Bucket] = {}  # least recently used first

    def check(self, tenant: str, num_prompt_tokens: int) -> None:
        """BudgetExceededError when the tenant's bucket cannot pay for the prompt now."""
        bucket = self._bucket(tenant)
        if bucket is None:
            return
        needed = min(num_prompt_tokens, bucket.tokens_per_minute)
        if bucket.level < needed:
            wait_s = (needed - bucket.level) * SECONDS_PER_MINUTE / bucket.tokens_per_minute
            raise BudgetExceededError(tenant, bucket.tokens_per_minute, max(1, math.ceil(wait_s)))

    def charge(self, tenant: str, num_tokens: int) -> None:
        """Take `num_tokens` (prompt at admission, output as produced); the bucket may go below 0."""
        bucket = self._bucket(tenant)
        if bucket is not None:
            bucket.level -= num_tokens

    def level(self, tenant: str) -> float | None:
        """The tokens the tenant's bucket holds now; None: no budget."""
        bucket = self._bucket(tenant)
        return None if bucket is None else bucket.level

    def _bucket(self, tenant: str) -> _Bucket | None:
        tokens_per_minute = self.tokens_per_minute(tenant)
        if tokens_per_minute is None:
            return None
        now_s = self.clock()
        bucket = self._buckets.pop(tenant, None)  # NOTE: put back last: the most recently used
        if bucket is None or bucket.tokens_per_minute != tokens_per_minute:
            if len(self._buckets) >= self.max_buckets:
                self._forget(now_s)
            bucket = _Bucket(tokens_per_minute, float(tokens_per_minute), now_s)
        self._buckets[tenant] = bucket
        bucket.refill(now_s)
        return bucket

    def _forget(self, now_s: float) -> None:
        for bucket in self._buckets.values():
            bucket.refill(now_s)
        self._buckets = {t: b for t, b in self._buckets.items() if not b.is_full}
        for tenant in list(self._buckets)[: max(0, len(self._buckets) - self.max_buckets // 2)]:
            del self._buckets[tenant]  # the least recently used

    def __len__(self) -> int:
        return len(self._buckets)
