"""`infer serve` settings: one table gives every flag, its `INFER_*` variable, its default and the docs.

A value comes from the flag, else the environment variable, else the dataclass default
(`EngineConfig` for engine settings, `ServerConfig` for the server's own).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from infer.api import DEFAULT_GRPC_PORT
from infer.engine import DTYPES, QUANTIZATIONS, SCHEDULING_POLICIES, EngineConfig, check
from infer.kernels import BACKENDS
from infer.server.gateway.origins import parse_origins
from infer.server.limits import RequestLimits
from infer.server.security import TlsFiles, header_problem

ENV_PREFIX = "INFER_"
TRACE_EXPORTERS = ("none", "console", "otlp")
METRICS_SETS = ("infer", "vllm")  # infer_* names; vLLM's, which an Inference Extension endpoint picker reads


@dataclass(frozen=True)
class ServerConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = "127.0.0.1"
    grpc_port: int = DEFAULT_GRPC_PORT  # 0 = any free port
    metrics_port: int | None = 9464  # None = no metrics endpoint; 0 = any free port
    metrics_sets: str = "infer,vllm"  # which names /metrics exports (METRICS_SETS), comma-separated
    http_metrics: bool = False  # also GET /metrics on the HTTP port, open like /health (an endpoint picker's default)
    http_port: int | None = 8000  # the OpenAI gateway; None = gRPC only; 0 = any free port
    health_port: int | None = None  # plaintext grpc.health.v1 only (probes while gRPC speaks TLS); None = off
    shutdown_grace_s: float = 30.0  # SIGTERM: how long in-flight streams may take to finish
    traces: str = "none"  # span exporter: none, console or otlp
    warmup: bool = True  # one tiny request before reporting SERVING
    engine_stall_timeout_s: float = 60.0  # health NOT_SERVING while one engine step runs longer
    # TLS and API keys (docs/security.md)
    tls_cert: str | None = None  # PEM certificate chain; with tls_key: TLS on gRPC and HTTP
    tls_key: str | None = None
    tls_client_ca: str | None = None  # mTLS: clients must show a certificate signed by this CA
    api_key: str | None = field(default=None, repr=False)  # one key, or several comma-separated
    api_keys_file: str | None = None  # one key a line
    allowed_origins: str | None = None  # browser origins let call the HTTP API (CORS), comma-separated; * = any
    # tenants (server/tenants.py): an API key's name, else this header's value on a keyless server
    tenant_header: str | None = None  # the gRPC metadata (HTTP header) naming the tenant; None: no header
    tenants_file: str | None = None  # `name weight [tokens_per_minute]` a line (`--tenants FILE`)
    tenant_tokens_per_minute: int | None = None  # the budget of a tenant the tenants file gives none; None: none
    # limits
    max_request_bytes: int = 4 * 1024 * 1024  # an HTTP body, a gRPC message
    max_prompt_tokens: int | None = None  # None: max_model_len is the only bound
    max_output_tokens: int | None = None  # the largest max_tokens a request may ask for; None: no bound
    max_chat_messages: int | None = None  # None: the prompt token bound (limits.py)
    max_prompt_chars: int | None = None  # text or rendered chat; None: 16 x the prompt token bound
    max_pending_long_prompts: int = 64  # long prompts waiting to be tokenized; more are refused
    max_streams_per_connection: int = 100  # gRPC (HTTP/2) streams open at once on one connection
    http_header_timeout_s: float = 10.0  # a connection's request headers must arrive within this
    http_body_timeout_s: float = 30.0  # a request's whole body must arrive within this
    # connections (docs/deployment.md)
    max_connection_age_s: float | None = 300.0  # then GOAWAY: clients reconnect and re-resolve; None = never
    max_connection_age_grace_s: float | None = None  # then an aged connection closes; None = once its RPCs end

    def __post_init__(self) -> None:
        check("grpc_port", 0 <= self.grpc_port < 65536, "must be in [0, 65535]")
        check("metrics_port", self.metrics_port is None or 0 <= self.metrics_port < 65536, "must be in [0, 65535]")
        sets = self.metric_sets
        check("metrics_sets", bool(sets) and sets <= set(METRICS_SETS), f"one or more of {', '.join(METRICS_SETS)}")
        check("http_port", self.http_port is None or 0 <= self.http_port < 65536, "must be in [0, 65535]")
        check("health_port", self.health_port is None or 0 <= self.health_port < 65536, "must be in [0, 65535]")
        check(
            "health_port", self.health_port in (None, 0) or self.health_port != self.grpc_port, "must not be grpc_port"
        )
        check("shutdown_grace_s", self.shutdown_grace_s >= 0, "must be >= 0")
        check("engine_stall_timeout_s", self.engine_stall_timeout_s > 0, "must be > 0")
        check("traces", self.traces in TRACE_EXPORTERS, f"must be one of {', '.join(TRACE_EXPORTERS)}")
        TlsFiles.from_settings(self.tls_cert, self.tls_key, self.tls_client_ca)  # ValueError when half given
        parse_origins(self.allowed_origins)  # ValueError naming allowed_origins
        problem = None if self.tenant_header is None else header_problem(self.tenant_header)
        check("tenant_header", problem is None, problem or "")
        budget = self.tenant_tokens_per_minute
        check("tenant_tokens_per_minute", budget is None or budget >= 1, "must be >= 1 (or none)")
        check("tenants_file", self.tenants_file is None or not self.engine.tenant_weights,
              "give the weights in the tenants file or in tenant_weights, not both")  # fmt: skip
        check("max_request_bytes", self.max_request_bytes >= 1024, "must be >= 1024")
        check("max_prompt_tokens", self.max_prompt_tokens is None or self.max_prompt_tokens >= 1, "must be >= 1")
        check("max_output_tokens", self.max_output_tokens is None or self.max_output_tokens >= 1, "must be >= 1")
        check("max_chat_messages", self.max_chat_messages is None or self.max_chat_messages >= 1, "must be >= 1")
        check("max_prompt_chars", self.max_prompt_chars is None or self.max_prompt_chars >= 1, "must be >= 1")
        check("max_pending_long_prompts", self.max_pending_long_prompts >= 1, "must be >= 1")
        check("max_streams_per_connection", self.max_streams_per_connection >= 1, "must be >= 1")
        threads, cores = self.engine.cpu_threads, num_cores()  # NOTE: 100,000 crashed OpenMP, 5,000 hung
        check("cpu_threads", threads <= cores, f"{threads} is more than the {cores} cores this process may run on "
              "(0: as many as are free)")  # fmt: skip
        check("http_header_timeout_s", self.http_header_timeout_s > 0, "must be > 0")
        check("http_body_timeout_s", self.http_body_timeout_s > 0, "must be > 0")
        age_s, age_grace_s = self.max_connection_age_s, self.max_connection_age_grace_s
        check("max_connection_age_s", age_s is None or age_s >= 0.001, "must be >= 0.001 (or none)")
        check("max_connection_age_grace_s", age_grace_s is None or age_grace_s >= 0, "must be >= 0 (or none)")

    @property
    def metric_sets(self) -> frozenset[str]:
        return frozenset(name.strip() for name in self.metrics_sets.split(",") if name.strip())

    @property
    def tls(self) -> TlsFiles | None:
        return TlsFiles.from_settings(self.tls_cert, self.tls_key, self.tls_client_ca)

    @property
    def limits(self) -> RequestLimits:
        return RequestLimits(
            self.max_prompt_tokens,
            self.max_output_tokens,
            self.max_chat_messages,
            self.max_prompt_chars,
            self.max_pending_long_prompts,
        )


def num_cores() -> int:
    """The CPUs this process may run on (its affinity; every CPU where the platform has none)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _optional_int(text: str) -> int | None:
    return None if text.lower() in ("", "none") else int(text)


def _optional_float(text: str) -> float | None:
    return None if text.lower() in ("", "none", "off") else float(text)


def _port_or_off(text: str) -> int | None:
    return None if text.lower() in ("off", "none") else int(text)


def _optional_str(text: str) -> str | None:
    return text or None


def _header_or_off(text: str) -> str | None:
    """A header name, lowercase (as gRPC metadata keys are); none or empty: off."""
    return None if text.strip().lower() in ("", "none", "off") else text.strip().lower()


def _str_or_off(text: str) -> str | None:
    return None if text.lower() in ("", "off", "none") else text


def _tenant_weights(text: str) -> tuple[tuple[str, float], ...]:
    """`name=weight,name=weight` (none or empty: every tenant weighs 1)."""
    if text.strip().lower() in ("", "none"):
        return ()
    pairs = []
    for item in text.split(","):
        name, sep, weight = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"tenant_weights: {item.strip()!r} is not name=weight")
        pairs.append((name.strip(), float(weight)))
    return tuple(pairs)


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


@dataclass(frozen=True)
class Setting:
    name: str  # the config field; flag --name-with-dashes, env INFER_NAME
    parse: Callable[[str], Any]
    help: str
    is_engine: bool = True
    choices: tuple[str, ...] = ()
    flag_name: str = ""  # the flag, when not the name (`tenants_file` is `--tenants`)

    @property
    def flag(self) -> str:
        return "--" + (self.flag_name or self.name.replace("_", "-"))

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def default(self) -> Any:
        owner = EngineConfig if self.is_engine else ServerConfig
        f = next(f for f in fields(owner) if f.name == self.name)
        return f.default if f.default is not MISSING else None


def _server(
    name: str, parse: Callable[[str], Any], help: str, choices: tuple[str, ...] = (), flag_name: str = ""
) -> Setting:
    return Setting(name, parse, help, is_engine=False, choices=choices, flag_name=flag_name)


SETTINGS: tuple[Setting, ...] = (
    _server("host", str, "address to listen on (0.0.0.0 for all interfaces)"),
    _server("grpc_port", int, "gRPC port (0 = any free port)"),
    _server("http_port", _port_or_off, "OpenAI-compatible HTTP gateway port (0 = any free port, off = gRPC only)"),
    _server("metrics_port", _port_or_off, "Prometheus /metrics port (0 = any free port, off = none)"),
    _server(
        "metrics_sets",
        str,
        "the metric names /metrics exports, comma-separated: infer (infer_*), vllm (vLLM's names, which an "
        "Inference Extension endpoint picker reads without configuration: docs/deployment.md)",
    ),
    _server(
        "http_metrics",
        _bool,
        "also serve /metrics on the HTTP port, without an API key like /health: where an Inference Extension "
        "endpoint picker scrapes a pool's pods unless told another port",
    ),
    _server("health_port", _port_or_off, "a plaintext port serving grpc.health.v1 only, for probes of a TLS server"),
    _server("shutdown_grace_s", float, "on SIGTERM, how long in-flight streams may take to finish"),
    _server("engine_stall_timeout_s", float, "health turns NOT_SERVING while one engine step runs longer (stalled)"),
    _server(
        "traces",
        str,
        "request spans: to stderr (console), or otlp (needs opentelemetry-exporter-otlp-proto-grpc)",
        TRACE_EXPORTERS,
    ),
    _server("tls_cert", _optional_str, "TLS certificate chain (PEM) for gRPC and HTTP; needs tls_key"),
    _server("tls_key", _optional_str, "TLS private key (PEM)"),
    _server("tls_client_ca", _optional_str, "mTLS: require client certificates signed by this CA (PEM)"),
    _server("api_key", _optional_str, "API key(s), comma-separated: clients send 'Authorization: Bearer <key>'"),
    _server(
        "api_keys_file",
        _optional_str,
        "a file of API keys, one a line (# comments); 'name: key' names the key's tenant (a key without a name is a "
        "tenant of its own, key-<8 hex digits of its SHA-256>)",
    ),
    _server(
        "tenant_header",
        _header_or_off,
        "without API keys: the gRPC metadata / HTTP header whose value names the request's tenant, e.g. x-tenant "
        "(absent: the default tenant); with keys, the key's name decides and this header is ignored",
    ),
    _server(
        "tenants_file",
        _optional_str,
        "a file of tenants, one a line: 'name weight [tokens_per_minute]' (# comments): the fair policy's weights "
        "(a tenant not named weighs 1) and token budgets; a line that does not parse stops the server",
        flag_name="tenants",
    ),
    _server(
        "tenant_tokens_per_minute",
        _optional_int,
        "the token budget of each tenant the tenants file gives none: prompt + output tokens per minute; over it, "
        "RESOURCE_EXHAUSTED / 429 with Retry-After (none = no budget)",
    ),
    _server(
        "allowed_origins",
        _optional_str,
        "browser origins that may call the HTTP API (CORS), comma-separated, * = any; without an API key, "
        "requests from other origins are refused",
    ),
    _server("max_request_bytes", int, "largest HTTP request body and gRPC message (413 / RESOURCE_EXHAUSTED)"),
    _server("max_prompt_tokens", _optional_int, "longest prompt in tokens (none = max_model_len)"),
    _server("max_output_tokens", _optional_int, "largest max_tokens a request may ask for (none = no bound)"),
    _server(
        "max_chat_messages",
        _optional_int,
        "most messages in one chat (none = the prompt token bound: max_prompt_tokens, else max_model_len - 1)",
    ),
    _server(
        "max_prompt_chars",
        _optional_int,
        "longest prompt text or rendered chat in characters (none = 16 x the prompt token bound)",
    ),
    _server(
        "max_pending_long_prompts",
        int,
        "long prompts (> 4096 characters or 64 messages) waiting to be tokenized; more: RESOURCE_EXHAUSTED",
    ),
    _server("max_streams_per_connection", int, "gRPC streams open at once on one connection; more wait"),
    _server("http_header_timeout_s", float, "HTTP: a request's headers must arrive within this, else 408"),
    _server("http_body_timeout_s", float, "HTTP: a request's body must arrive within this, else 408"),
    _server(
        "max_connection_age_s",
        _optional_float,
        "gRPC: a connection this old (±10%) gets GOAWAY and its client reconnects, re-resolving DNS, so replicas "
        "added by a scale-up get traffic within 5 min for one reconnect per 5 min; its streams go on (none = never)",
    ),
    _server(
        "max_connection_age_grace_s",
        _optional_float,
        "gRPC: how long streams may still run on a connection past its age, then they are cut (none = until they "
        "end: age never cuts a generation)",
    ),
    Setting(
        "model",
        _optional_str,
        "a Hugging Face model directory or a GGUF file (default: SmolLM2-135M-Instruct)",
    ),
    Setting(
        "chat_template",
        _optional_str,
        "a Jinja chat-template file that replaces the model's (for a model without one; default: the model's)",
    ),
    Setting(
        "chat_template_timeout_s",
        float,
        "seconds one chat-template render may take; a template that runs longer fails its request (400) and, on "
        "the probe conversation at start, the start",
    ),
    Setting("max_model_len", int, "prompt + generated tokens of one request (0 = min(2048, the model's))"),
    Setting("max_num_seqs", int, "requests running at once"),
    Setting("max_num_batched_tokens", int, "token budget of one engine step"),
    Setting("block_size", int, "tokens per KV-cache block"),
    Setting("kv_cache_memory_bytes", int, "KV-cache size in bytes, unless num_blocks is given"),
    Setting("num_blocks", _optional_int, "KV-cache blocks (overrides kv_cache_memory_bytes)"),
    Setting("max_waiting_requests", int, "queue bound; more requests are refused (RESOURCE_EXHAUSTED)"),
    Setting("batching", str, "continuous, or static (a benchmark baseline)", choices=("continuous", "static")),
    Setting(
        "kv_reserve", str, "paged, or full (max_model_len blocks per request: a baseline)", choices=("paged", "full")
    ),
    Setting("enable_chunked_prefill", _bool, "cut long prompts into chunks under the step's token budget"),
    Setting("enable_prefix_caching", _bool, "reuse the KV blocks of shared prompt prefixes"),
    Setting(
        "kv_events",
        _bool,
        "publish KV-cache events (blocks stored and evicted) on ZMQ in vLLM's layout, for a precise prefix-cache "
        "router such as llm-d's (docs/architecture.md); needs enable_prefix_caching",
    ),
    Setting(
        "kv_events_endpoint",
        str,
        "the KV-cache events PUB socket: bound when the address is a wildcard (tcp://*:PORT), else connected to (a "
        "router's SUB socket)",
    ),
    Setting(
        "kv_events_replay_endpoint",
        _str_or_off,
        "the KV-cache events replay (ROUTER) socket, for subscribers that join late or miss batches: the last 10,000 "
        "batches, up to 1,000 an answer (ask again from the next); past 32 answers at once a request gets the end "
        "marker alone (off = none)",
    ),
    Setting(
        "kv_events_pod_id",
        _optional_str,
        "the pod in the events' topic kv@POD@MODEL (none = the host name: a Kubernetes pod's name)",
    ),
    Setting("static_batch_wait_s", float, "static batching: how long to gather a batch"),
    Setting("dtype", str, "weights and KV-cache dtype", choices=tuple(DTYPES)),
    Setting(
        "quantization",
        str,
        "weights: auto (a GGUF file's own quantized bits; a directory's floats), none (floats), or weight-only "
        "linear layers (CPU) int8 (a scale per output channel) or int4 (a scale and minimum per 32 inputs, like "
        "Q4_1)",
        choices=QUANTIZATIONS,
    ),
    Setting("device", str, "torch device (cpu, cuda, cuda:1, ...)"),
    Setting("seed", int, "engine seed for unseeded sampling"),
    Setting(
        "speculative_tokens",
        int,
        "n-gram speculative decoding: draft tokens per step for requests that do not set their own (0 = off)",
    ),
    Setting("speculative_max_num_seqs", int, "speculative decoding pauses while more requests than this run"),
    Setting(
        "grammar_compile_budget_s",
        float,
        "CPU seconds one structured-output grammar (JSON schema, regex, grammar) may take to compile, tried first "
        "in a low-priority worker process; one that needs more is refused (400) and remembered",
    ),
    Setting(
        "max_pending_grammars",
        int,
        "grammar compiles queued or running; more constraints not yet compiled are refused (RESOURCE_EXHAUSTED / 429)",
    ),
    Setting(
        "cpu_threads",
        int,
        "CPU threads: 0 = as many as other processes leave cores free, re-read every half second, up to torch's "
        "count (OMP_NUM_THREADS, else one per core) and the cgroup CPU quota; N = exactly N, at most the cores this "
        "process may run on (more is refused at start)",
    ),
    Setting(
        "cuda_graphs",
        _bool,
        "on CUDA with the Triton kernels: capture decode steps in CUDA graphs at start (batch sizes 1, 2, 4, 8, then "
        "every 8 up to max_num_seqs) and replay them, a batch padded to the next size; ignored elsewhere",
    ),
    Setting(
        "kernels",
        str,
        "kernel backend (unset: auto): auto (Triton on CUDA, the compiled CPU kernels where built, else the "
        "PyTorch references), torch (the references), cpu, triton",
        choices=BACKENDS,
    ),
    Setting(
        "scheduling_policy",
        str,
        "who goes first when not everyone fits: fcfs (arrival order), priority (the request's priority, lower is "
        "sooner, aged by priority_aging_s), fair (weighted fair share of tokens across tenants, priority within "
        "one); priority and fair preempt a less deserving running request for a waiting one (docs/architecture.md)",
        choices=tuple(SCHEDULING_POLICIES),  # the policies' table (engine/policies/), which EngineConfig checks
    ),
    Setting(
        "priority_aging_s",
        float,
        "priority and fair: seconds of waiting worth one priority level; no request that arrives more than "
        "(its priority + 20) x this after a request outranks it",
    ),
    Setting(
        "tenant_weights",
        _tenant_weights,
        "fair: each tenant's weight, name=weight comma-separated (a tenant not named weighs 1)",
    ),
    Setting(
        "max_tenants",
        int,
        "tenants whose state the server keeps (the fair policy's service counters, the token budgets' buckets): "
        "past it, idle tenants are forgotten, those nearest the fair share (fair) or idle longest (budgets) first; "
        "tenants with requests in the engine are always kept (the queue bounds them)",
    ),
)


def _env_default(setting: Setting, environ: Mapping[str, str]) -> Any:
    raw = environ.get(setting.env)
    if raw is None:
        return setting.default
    try:
        value = setting.parse(raw)
    except ValueError as e:
        raise ValueError(f"{setting.env}: invalid value {raw!r} ({e})") from None
    if setting.choices and value not in setting.choices:
        raise ValueError(f"{setting.env}: must be one of {', '.join(setting.choices)}")
    return value


def add_settings(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """One flag per setting; its default comes from INFER_* in `environ` (os.environ by default)."""
    environ = os.environ if environ is None else environ
    for s in SETTINGS:
        default = _env_default(s, environ)
        text = f"{s.help} [env {s.env}; default: {_show(s.default)}]".replace("%", "%%")  # argparse formats it
        if s.parse is _bool:
            parser.add_argument(s.flag, action=argparse.BooleanOptionalAction, default=default, help=text, dest=s.name)
        else:
            choices = list(s.choices) or None
            parser.add_argument(
                s.flag, type=s.parse, default=default, choices=choices, help=text, metavar=_metavar(s), dest=s.name
            )


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """ServerConfig from parsed flags; ValueError naming the setting when a value is invalid."""
    engine = EngineConfig.from_dict({s.name: getattr(args, s.name) for s in SETTINGS if s.is_engine})
    server = {s.name: getattr(args, s.name) for s in SETTINGS if not s.is_engine}
    return ServerConfig(engine=engine, **server)


def _metavar(s: Setting) -> str:
    return "{" + ",".join(s.choices) + "}" if s.choices else s.name.upper()


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):  # tenant_weights
        return ",".join(f"{k}={v:g}" for k, v in value) or "none"
    return str(value)


def settings_markdown() -> str:
    """The configuration table of docs/configuration.md (a test keeps the two equal)."""
    rows = ["| flag | environment variable | default | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        flag = f"`{s.flag}` / `--no-{s.flag[2:]}`" if s.parse is _bool else f"`{s.flag}`"
        rows.append(f"| {flag} | `{s.env}` | `{_show(s.default)}` | {s.help} |")
    return "\n".join(rows) + "\n"
