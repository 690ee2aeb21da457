"""Serving workloads, generated from a seed: token-id prompts of exact lengths, no downloads.

Each workload says how its requests arrive: at given offsets (a schedule), as fast as a fixed
number of concurrent streams allows, or at a Poisson rate chosen on the command line.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

FIRST_ID = 100  # prompts use ids from here up: clear of the specials at the start of the vocabulary
SYSTEM_PROMPT_TOKENS = 1024


@dataclass(frozen=True)
class RequestSpec:
    prompt: tuple[int, ...]
    max_tokens: int
    at_s: float | None = None  # arrival offset from the start; None = as the load pattern decides
    tag: str = ""  # a role inside the workload ("decode", "long_prompt", "hit", ...)


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    requests: tuple[RequestSpec, ...]
    concurrency: int | None = None  # the default load: this many streams at once (None = the schedule or a rate)
    rates: tuple[float, ...] = ()  # a rate sweep (requests/s), for `mixed`
    warmup: tuple[RequestSpec, ...] = ()  # sent before timing starts (prefix_caching: fill the cache)

    @property
    def num_output_tokens(self) -> int:
        return sum(r.max_tokens for r in self.requests)

    @property
    def has_schedule(self) -> bool:
        return any(r.at_s is not None for r in self.requests)


@dataclass(frozen=True)
class WorkloadOptions:
    vocab_size: int = 49152
    seed: int = 0
    num_requests: int | None = None  # None = the workload's own count
    max_tokens: int | None = None  # cap every request's output (short runs)
    time_scale: float = 1.0  # stretch (> 1) or squeeze (< 1) the schedule's arrival offsets
    extra: dict[str, int] = field(default_factory=dict)


def _prompt(rng: random.Random, length: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(rng.randrange(FIRST_ID, vocab_size) for _ in range(length))


def _count(opts: WorkloadOptions, default: int) -> int:
    return max(1, opts.num_requests if opts.num_requests is not None else default)


def baseline(opts: WorkloadOptions) -> Workload:
    rng = random.Random(opts.seed)
    reqs = tuple(RequestSpec(_prompt(rng, 128, opts.vocab_size), 64) for _ in range(_count(opts, 8)))
    return Workload("baseline", "one request at a time: 128-token prompts, 64 new tokens", reqs, concurrency=1)


def continuous_batching(opts: WorkloadOptions) -> Workload:
    rng = random.Random(opts.seed + 1)
    reqs, at = [], 0.0
    for _ in range(_count(opts, 32)):
        at += rng.expovariate(1.0)  # ~1 request/s
        n_prompt, n_new = rng.randint(32, 256), rng.choice((16, 32, 64, 128))
        reqs.append(RequestSpec(_prompt(rng, n_prompt, opts.vocab_size), n_new, at_s=at))
    desc = "staggered Poisson arrivals (~1/s), prompts 32–256 tokens, 16–128 new tokens"
    return Workload("continuous_batching", desc, tuple(reqs))


def paged_attention(opts: WorkloadOptions) -> Workload:
    rng = random.Random(opts.seed + 2)
    n = _count(opts, 48)
    reqs = tuple(RequestSpec(_prompt(rng, rng.randint(64, 160), opts.vocab_size), 32, at_s=0.0) for _ in range(n))
    return Workload("paged_attention", f"a burst of {n} requests at once, prompts 64–160 tokens, 32 new", reqs)


def chunked_prefill(opts: WorkloadOptions) -> Workload:
    """Decoding streams, then long prompts that arrive while they decode."""
    rng = random.Random(opts.seed + 3)
    n_decode = opts.extra.get("decoders", 6)
    n_long = _count(opts, 4)
    long_len = opts.extra.get("long_prompt", 1536)
    reqs = [RequestSpec(_prompt(rng, 32, opts.vocab_size), 160, at_s=0.0, tag="decode") for _ in range(n_decode)]
    for i in range(n_long):
        reqs.append(RequestSpec(_prompt(rng, long_len, opts.vocab_size), 8, at_s=2.0 + 4.0 * i, tag="long_prompt"))
    desc = f"{n_decode} streams decode 160 tokens while {n_long} prompts of {long_len} tokens arrive 4 s apart"
    return Workload("chunked_prefill", desc, tuple(reqs))


def prefix_caching(opts: WorkloadOptions) -> Workload:
    """A shared 1,024-token system prompt; each request adds its own question. One at a time: TTFT is clean."""
    rng = random.Random(opts.seed + 4)
    system = _prompt(rng, SYSTEM_PROMPT_TOKENS, opts.vocab_size)

    def one(tag: str) -> RequestSpec:
        return RequestSpec(system + _prompt(rng, rng.randint(16, 64), opts.vocab_size), 16, tag=tag)

    reqs = tuple(one("shared_prefix") for _ in range(_count(opts, 12)))
    desc = f"a shared {SYSTEM_PROMPT_TOKENS}-token system prompt + 16–64 own tokens, 16 new, one at a time"
    return Workload("prefix_caching", desc, reqs, concurrency=1, warmup=(one("warmup"),))


def mixed(opts: WorkloadOptions) -> Workload:
    """All the shapes above, shuffled, sent at a Poisson rate; the sweep's rates are in `rates`."""
    rng = random.Random(opts.seed + 5)
    system = _prompt(rng, SYSTEM_PROMPT_TOKENS, opts.vocab_size)
    shapes: list[Callable[[], RequestSpec]] = [
        lambda: RequestSpec(_prompt(rng, 128, opts.vocab_size), 32, tag="short"),
        lambda: RequestSpec(_prompt(rng, rng.randint(32, 256), opts.vocab_size), rng.choice((16, 64)), tag="mixed"),
        lambda: RequestSpec(_prompt(rng, 768, opts.vocab_size), 8, tag="long_prompt"),
        lambda: RequestSpec(system + _prompt(rng, 32, opts.vocab_size), 16, tag="shared_prefix"),
    ]
    reqs = tuple(rng.choice(shapes)() for _ in range(_count(opts, 24)))
    return Workload("mixed", "all the shapes above, shuffled, at a Poisson rate sweep", reqs, rates=(0.25, 0.5, 1.0))


def saturation(opts: WorkloadOptions) -> Workload:
    """16 streams at once, never idle: the throughput workload (the peer comparison uses it too)."""
    rng = random.Random(opts.seed + 6)
    reqs = tuple(RequestSpec(_prompt(rng, rng.randint(64, 256), opts.vocab_size), 64) for _ in range(_count(opts, 32)))
    return Workload("saturation", "16 concurrent streams, prompts 64–256 tokens, 64 new tokens", reqs, concurrency=16)


WORKLOADS: dict[str, Callable[[WorkloadOptions], Workload]] = {
    "baseline": baseline,
    "continuous_batching": continuous_batching,
    "paged_attention": paged_attention,
    "chunked_prefill": chunked_prefill,
    "prefix_caching": prefix_caching,
    "mixed": mixed,
    "saturation": saturation,
}


def make_workload(name: str, opts: WorkloadOptions | None = None) -> Workload:
    """The named workload; `opts.max_tokens` caps outputs and `opts.time_scale` stretches the schedule."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}: one of {', '.join(WORKLOADS)}")
    opts = opts or WorkloadOptions()
    work = WORKLOADS[name](opts)

    def adjust(r: RequestSpec) -> RequestSpec:
        n = r.max_tokens if opts.max_tokens is None else min(r.max_tokens, opts.max_tokens)
        at = None if r.at_s is None else r.at_s * opts.time_scale
        return replace(r, max_tokens=max(1, n), at_s=at)

    return replace(work, requests=tuple(map(adjust, work.requests)), warmup=tuple(map(adjust, work.warmup)))
