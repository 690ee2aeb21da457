"""Engine settings: one frozen, validated dataclass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import torch

from infer.engine.chat_template import DEFAULT_TIMEOUT_S
from infer.engine.policies import POLICIES
from infer.engine.speculation.state import MAX_SPECULATIVE_TOKENS
from infer.engine.structured import DEFAULT_COMPILE_BUDGET_S, DEFAULT_MAX_PENDING_GRAMMARS
from infer.engine.validation import check
from infer.kernels import BACKENDS

DEFAULT_MAX_MODEL_LEN = 2048  # when the model allows as much
DEFAULT_MAX_TENANTS = 10_000
QUANTIZATIONS = ("auto", "none", "int8", "int4")
# NOTE: the LM head of an int4 model stays int8, as llama.cpp's Q4_1 files keep theirs Q8_0: on SmolLM2-135M an
# int4 head alone cost +5.0% perplexity on the fixed text, an int8 one -0.05% (docs/benchmarks/precision.md)
_LM_HEAD_METHOD = {"int4": "int8"}


@dataclass(frozen=True)
class Quantization:
    """What a weight-only quantization method does to a model's linear layers: the projections' method and the
    LM head's (none: floats)."""

    layers: str
    lm_head: str

    @classmethod
    def of(cls, method: str) -> Quantization:
        """`method` (none, int8, int4) as a model applies it."""
        return cls(method, _LM_HEAD_METHOD.get(method, method))


SCHEDULING_POLICIES = POLICIES  # name -> class (engine/policies/): the names scheduling_policy takes
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # a Hugging Face directory or a GGUF file; None = the default model
    chat_template: str | None = None  # a Jinja file that replaces the model's chat template (None: the model's)
    chat_template_timeout_s: float = DEFAULT_TIMEOUT_S  # one chat template render's time bound (chat_template.py)
    max_model_len: int = 0  # prompt + generated tokens of one request; 0 = min(2048, the model's max positions)
    max_num_seqs: int = 64  # requests running at once
    # token budget of one step. NOTE: 256, not 512: on 2 CPU cores a 512-token prefill chunk held every decoding
    # stream for ~1 s (P99 inter-token gap 1066 vs 546 ms at 256, same throughput; make bench-serving)
    max_num_batched_tokens: int = 256
    block_size: int = 16  # tokens per KV block
    kv_cache_memory_bytes: int = 1 << 30  # KV pool size, unless num_blocks is given
    num_blocks: int | None = None
    max_waiting_requests: int = 1024  # queue bound; more is refused
    batching: Literal["continuous", "static"] = "continuous"
    kv_reserve: Literal["paged", "full"] = "paged"  # full: max_model_len of blocks at admission
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    static_batch_wait_s: float = 0.05  # static batching: how long to gather a batch
    dtype: str = "float32"
    # auto: a GGUF file's own bits, a Hugging Face directory's floats | none: floats | int8 (per-output-channel
    # scales) | int4 (groups of 32, Q4_1-like): weight-only, CPU
    quantization: str = "auto"
    device: str = "cpu"
    seed: int = 0
    speculative_tokens: int = 0  # n-gram drafts per step for requests that do not say (0 = off)
    speculative_max_num_seqs: int = 4  # no drafts while more requests than this are running
    # CPU seconds one grammar compile may take (tried first in a worker process, killed then); more: refused
    grammar_compile_budget_s: float = DEFAULT_COMPILE_BUDGET_S
    max_pending_grammars: int = DEFAULT_MAX_PENDING_GRAMMARS  # compiles queued or running; more are refused
    # KV-cache events (engine/kv_events.py): blocks stored and evicted, on ZMQ in vLLM's layout
    kv_events: bool = False
    kv_events_endpoint: str = "tcp://*:5557"  # PUB socket: bound if a wildcard address, else connected to
    kv_events_replay_endpoint: str | None = "tcp://*:5558"  # ROUTER socket for late subscribers; None = none
    kv_events_pod_id: str | None = None  # the topic's kv@<pod-id>@<model>; None = the host name
    # CPU threads: 0 = as many as other processes leave cores free, up to torch's count (engine/threads.py);
    # N = exactly N
    cpu_threads: int = 0
    # decode steps replayed from CUDA graphs captured at start (engine/cuda_graphs.py): on CUDA with the Triton
    # kernels; ignored elsewhere
    cuda_graphs: bool = True
    kernels: str | None = None  # the kernel backend: auto | torch | cpu | triton; None: INFER_KERNELS, else auto
    # who goes first when not everyone fits (engine/policies/): fcfs | priority (the request's, aged) | fair
    # (weighted fair share across tenants, priority within one); priority and fair preempt for a waiting request
    scheduling_policy: str = "fcfs"
    priority_aging_s: float = 10.0  # seconds of waiting worth one priority level (the starvation bound's unit)
    tenant_weights: tuple[tuple[str, float], ...] = ()  # (tenant, weight) for fair; a tenant not named: 1
    # tenants whose state is kept (fair's counters, token budgets): past it, idle ones are forgotten; tenants with
    # requests in the engine are always kept (the queue bounds them)
    max_tenants: int = DEFAULT_MAX_TENANTS

    def __post_init__(self) -> None:
        positive = ("max_num_seqs", "max_num_batched_tokens", "block_size", "kv_cache_memory_bytes",
                    "max_waiting_requests")  # fmt: skip
        for name in positive:
            check(name, int(getattr(self, name)) > 0, "must be > 0")
        check("max_model_len", self.max_model_len >= 0, "must be >= 0 (0 = the smaller of 2048 and the model's)")
        check("num_blocks", self.num_blocks is None or self.num_blocks > 0, "must be > 0")
        check("batching", self.batching in ("continuous", "static"), "must be 'continuous' or 'static'")
        check("kv_reserve", self.kv_reserve in ("paged", "full"), "must be 'paged' or 'full'")
        check("dtype", self.dtype in DTYPES, f"must be one of {', '.join(DTYPES)}")
        check("quantization", self.quantization in QUANTIZATIONS, f"must be one of {', '.join(QUANTIZATIONS)}")
        check("speculative_tokens", 0 <= self.speculative_tokens <= MAX_SPECULATIVE_TOKENS,
              f"must be in [0, {MAX_SPECULATIVE_TOKENS}]")  # fmt: skip
        check("speculative_max_num_seqs", self.speculative_max_num_seqs >= 1, "must be >= 1")
        check("static_batch_wait_s", self.static_batch_wait_s >= 0, "must be >= 0")
        check("grammar_compile_budget_s", self.grammar_compile_budget_s > 0, "must be > 0")
        check("max_pending_grammars", self.max_pending_grammars >= 1, "must be >= 1")
        check("chat_template_timeout_s", self.chat_template_timeout_s > 0, "must be > 0")
        check("kv_events", not self.kv_events or self.enable_prefix_caching,
              "needs enable_prefix_caching (without it no block is ever cached)")  # fmt: skip
        check("kv_events_endpoint", "://" in self.kv_events_endpoint, "must be a ZMQ address (tcp://*:5557)")
        replay = self.kv_events_replay_endpoint
        check("kv_events_replay_endpoint", replay is None or "://" in replay, "must be a ZMQ address (tcp://*:5558)")
        check("kv_events_pod_id", self.kv_events_pod_id is None or "@" not in self.kv_events_pod_id,
              "must not hold '@' (the topic's separator)")  # fmt: skip
        check("cpu_threads", self.cpu_threads >= 0, "must be >= 0 (0 = follow the free cores)")
        check("kernels", self.kernels is None or self.kernels in BACKENDS, f"must be one of {', '.join(BACKENDS)}")
        self._check_scheduling()
        if not self.enable_chunked_prefill:
            check("max_num_batched_tokens", self.max_num_batched_tokens >= self.max_model_len,
                   "must be >= max_model_len when chunked prefill is off")  # fmt: skip
        try:
            torch.device(self.device)
        except RuntimeError:
            raise ValueError(f"device: {self.device!r} is not a torch device") from None

    def _check_scheduling(self) -> None:
        weights: Any = self.tenant_weights  # a mapping is taken too; kept as a tuple of pairs (hashable)
        pairs = weights.items() if isinstance(weights, Mapping) else weights
        object.__setattr__(self, "tenant_weights", tuple((str(t), float(w)) for t, w in pairs))
        policy = self.scheduling_policy
        check("scheduling_policy", policy in SCHEDULING_POLICIES, f"must be one of {', '.join(SCHEDULING_POLICIES)}")
        is_ok = SCHEDULING_POLICIES[policy].allows_static_batching or self.batching == "continuous"
        check("scheduling_policy", is_ok, "needs batching=continuous")
        check("priority_aging_s", self.priority_aging_s > 0, "must be > 0")
        check("max_tenants", self.max_tenants >= 1, "must be >= 1")
        names = [t for t, _ in self.tenant_weights]
        unique = len(set(names)) == len(names)
        check("tenant_weights", all(names) and unique, "tenant names must be non-empty, once each")
        check("tenant_weights", all(0 < w < float("inf") for _, w in self.tenant_weights), "weights must be > 0")

    def for_model(self, max_position_embeddings: int) -> EngineConfig:
        """This config with max_model_len settled for a model: 0 becomes min(2048, the model's); a larger
        value than the model's is an error."""
        if self.max_model_len == 0:
            return replace(self, max_model_len=min(DEFAULT_MAX_MODEL_LEN, max_position_embeddings))
        check("max_model_len", self.max_model_len <= max_position_embeddings,
              f"must be <= the model's max_position_embeddings ({max_position_embeddings})")  # fmt: skip
        return self

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EngineConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown engine setting(s): {', '.join(unknown)}")
        return cls(**values)
