"""The gRPC server around one engine: start (NOT_SERVING), load and warm up (SERVING), drain, stop."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import tempfile
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import grpc
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.sdk.trace.export import SpanExporter

from infer.api import SERVICE_NAME
from infer.engine import AsyncEngine, EngineClient, EngineConfig, EngineStats, ModelLoadError
from infer.server.draining import Refuser
from infer.server.health_port import HealthPort
from infer.server.lifecycle import Lifecycle
from infer.server.security import ApiKeyInterceptor, ApiKeys, server_credentials
from infer.server.servicer import InferenceServicer, add_to_server
from infer.server.settings import ServerConfig
from infer.server.signals import run_until_signal
from infer.server.telemetry import Telemetry, make_span_exporter
from infer.server.tenants import TenantIdentity, Tenants, TenantTable
from infer.server.vllm_metrics import ServedModel

if TYPE_CHECKING:
    from infer.server.gateway.app import GatewayServer

logger = logging.getLogger(__name__)

SERVICE_NAMES = (
    SERVICE_NAME,
    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
    reflection.SERVICE_NAME,
)
GRPC_OPTIONS = (
    ("grpc.so_reuseport", 0),  # NOTE: a second server on a busy port must fail, not share it silently
    ("grpc.keepalive_time_ms", 30_000),  # ping idle clients: a vanished one is cancelled and its request aborted
    ("grpc.keepalive_timeout_ms", 10_000),
)
LOCAL_SOCKET = "grpc.sock"  # with TLS: the in-process gateway's hop, a Unix socket in a private directory


# NOTE: grpc cancels (CANCELLED, which no client retries) a call that reaches a server after its GOAWAY; before
# it, a draining server answers UNAVAILABLE (retried elsewhere). NOT_SERVING first, GOAWAY this much later: health-
# checking clients have stopped sending by then.
GOAWAY_DELAY_S = 0.5
STOP_GRACE_S = 0.5  # once the drain is over: the last statuses go out, health watches are cut
# NOTE: the start-up's one full garbage collection (collect_from_now_on) waits this long after SERVING: at once,
# the first health checks to see SERVING would wait for it
COLLECT_AFTER_SERVING_S = 1.0


def grpc_options(config: ServerConfig) -> list[tuple[str, int]]:
    """The server's channel options: the fixed ones and the limits from the settings."""
    options = [
        *GRPC_OPTIONS,
        ("grpc.max_receive_message_length", config.max_request_bytes),
        ("grpc.max_concurrent_streams", config.max_streams_per_connection),
    ]
    if config.max_connection_age_s is not None:  # GOAWAY then; the client reconnects (and re-resolves)
        options.append(("grpc.max_connection_age_ms", round(config.max_connection_age_s * 1000)))
    if config.max_connection_age_grace_s is not None:  # then the aged connection closes, streams or not
        options.append(("grpc.max_connection_age_grace_ms", round(config.max_connection_age_grace_s * 1000)))
    return options


def on_available_device(config: EngineConfig) -> EngineConfig:
    """`config`, on the CPU when it asks for CUDA and torch sees no CUDA device (the CUDA image on a machine, or in a
    pod, without a GPU), with a warning that says why; else `config` itself."""
    if torch.device(config.device).type != "cuda" or torch.cuda.is_available():
        return config
    why = (
        "this torch is built without CUDA"
        if torch.version.cuda is None
        else f"torch {torch.__version__} finds no CUDA device: no GPU visible here, or no NVIDIA driver"
    )
    logger.warning("device %s asked for, but %s: serving on the CPU", config.device, why)
    return replace(config, device="cpu")


class InferenceServer:
    def __init__(self, config: ServerConfig, span_exporter: SpanExporter | None = None) -> None:
        self.config = config
        self.lifecycle = Lifecycle()
        exporter = span_exporter if span_exporter is not None else make_span_exporter(config.traces)
        self.telemetry = Telemetry(self._stats, exporter, batch_spans=span_exporter is None,
                                   model=self._served_model, metric_sets=config.metric_sets)  # fmt: skip
        self._loaded_s = 0.0  # wall-clock time the model was served
        self._server: grpc.aio.Server | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._local_dir: tempfile.TemporaryDirectory[str] | None = None
        self.port = 0
        self.local_address: str | None = None  # the gateway's hop when TLS is on: unix:PATH
        self.api_keys: ApiKeys | None = None  # read at start, shared with the in-process gateway
        self.tenants = TenantTable()  # the tenants file, read at start
        self.metrics_port: int | None = None
        self.health_port: HealthPort | None = None  # plaintext health only, for probes (config.health_port)

    @property
    def engine(self) -> EngineClient | None:
        return self.lifecycle.engine

    @property
    def engine_config(self) -> EngineConfig:
        """The engine's settings, with the tenants file's weights (read at start) when it gives any."""
        weights = self.tenants.weights
        return replace(self.config.engine, tenant_weights=weights) if weights else self.config.engine

    def _stats(self) -> EngineStats | None:
        engine = self.lifecycle.engine
        return engine.stats() if engine is not None else None

    def _served_model(self) -> ServedModel | None:
        engine = self.lifecycle.engine
        if engine is None:
            return None
        config = engine.config
        return ServedModel(engine.model_info.model_id, config.block_size, config.enable_prefix_caching, self._loaded_s)

    async def start(self) -> None:
        """Listen at once, reporting NOT_SERVING until `load` is done."""
        cfg = self.config
        # ValueError naming the file and the line
        self.tenants = TenantTable.read(cfg.tenants_file, cfg.tenant_tokens_per_minute)
        self.api_keys = keys = ApiKeys.from_settings(cfg.api_key, cfg.api_keys_file)
        interceptors = [ApiKeyInterceptor(keys)] if keys is not None else []
        server = grpc.aio.server(options=grpc_options(cfg), interceptors=interceptors)
        identity = TenantIdentity(keys, cfg.tenant_header)  # NOTE: with keys, the key decides
        tenants = Tenants(identity, self.tenants, max_tenants=cfg.engine.max_tenants)
        servicer = InferenceServicer(self.lifecycle, self.telemetry, cfg.limits, tenants=tenants)
        add_to_server(servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.lifecycle.health, server)
        reflection.enable_server_reflection(SERVICE_NAMES, server)
        self.port = self._listen(server)
        await server.start()
        self._server = server
        await self.lifecycle.start()
        logger.info(
            "gRPC listening on %s:%d (%s, %s; NOT_SERVING until the model is loaded)", cfg.host, self.port,
            "mTLS" if cfg.tls_client_ca else "TLS" if cfg.tls_cert else "plaintext",
            f"{len(keys)} API key(s)" if keys else "no API key",
        )  # fmt: skip
        if cfg.health_port is not None:
            self.health_port = HealthPort(self.lifecycle.health, cfg.host, cfg.health_port)
            try:
                await self.health_port.start()
            except OSError:
                await server.stop(None)
                raise
        if cfg.metrics_port is not None:
            try:
                self.metrics_port = self.telemetry.serve_metrics(cfg.host, cfg.metrics_port, cfg.http_header_timeout_s)
            except OSError as e:
                await server.stop(None)
                if self.health_port is not None:
                    await self.health_port.stop()
                raise OSError(f"cannot serve metrics on {cfg.host}:{cfg.metrics_port}: {e}") from None
            logger.info("Prometheus metrics on http://%s:%d/metrics", cfg.host, self.metrics_port)

    @property
    def gateway_upstream(self) -> str:
        """Where the in-process gateway reaches this server: the private Unix socket under TLS, else the port."""
        from infer.server.gateway.app import local_upstream

        return self.local_address or local_upstream(self.config.host, self.port)

    def _listen(self, server: grpc.aio.Server) -> int:
        """Add the listening port (TLS when configured; then a private Unix socket for the in-process gateway)."""
        cfg, tls = self.config, self.config.tls
        address = f"{cfg.host}:{cfg.grpc_port}"
        try:
            port = (
                server.add_secure_port(address, server_credentials(tls)) if tls else server.add_insecure_port(address)
            )
        except RuntimeError as e:  # grpc reports a failed bind this way
            raise OSError(f"cannot listen on {address} (in use?): {e}") from None
        if port == 0:
            raise OSError(f"cannot listen on {address} (in use?)")
        if tls is not None and cfg.http_port is not None:
            # NOTE: the hop never leaves the process's user: no certificate to present, the key still checked
            self._local_dir = tempfile.TemporaryDirectory(prefix="infer-")
            self.local_address = f"unix:{os.path.join(self._local_dir.name, LOCAL_SOCKET)}"
            server.add_insecure_port(self.local_address)
        return int(port)

    async def _refuse_new_calls(self) -> Refuser | None:
        """The port answering new connections for the rest of the drain, once grpc has closed it."""
        cfg, tls = self.config, self.config.tls
        refuser = Refuser(f"{cfg.host}:{self.port}", server_credentials(tls) if tls else None, list(GRPC_OPTIONS))
        return refuser if await refuser.start() else None

    async def load(self, engine: EngineClient | None = None) -> None:
        """Load the model (in a thread: health keeps answering), warm it up, then report SERVING.

        A model that fails to load or to warm up raises, and health stays NOT_SERVING.
        `engine`: serve this one instead of loading `config.engine` (tests serve a fake engine this way).
        """
        if engine is None:
            engine = await asyncio.to_thread(AsyncEngine.from_config, on_available_device(self.engine_config))
        if self.config.warmup:
            try:
                await engine.warmup()
            except BaseException:
                await asyncio.to_thread(engine.shutdown)
                raise
        info, cfg, stats = engine.model_info, engine.config, engine.stats()
        logger.info(
            "model %s from %s on %s (%s): %d KV blocks of %d tokens, max_model_len %d, max_num_seqs %d",
            info.model_id, info.model_dir, cfg.device, cfg.dtype, stats.num_blocks_used + stats.num_blocks_free,
            cfg.block_size, cfg.max_model_len, cfg.max_num_seqs,
        )  # fmt: skip
        omp = os.environ.get("OMP_NUM_THREADS")
        logger.info("%d CPU threads (%s)", torch.get_num_threads(), f"OMP_NUM_THREADS={omp}" if omp else "one per core")
        self._loaded_s = time.time()
        await self.lifecycle.serve(engine)
        self._watchdog = asyncio.create_task(self.lifecycle.watch_engine(self.config.engine_stall_timeout_s))
        logger.info("SERVING on %s:%d", self.config.host, self.port)

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain, then stop: health NOT_SERVING, then GOAWAY on every connection (clients move to other replicas);
        in-flight RPCs finish within grace_s (then they are cancelled). Until then, new connections to the port
        are answered too: UNAVAILABLE, NOT_SERVING, a retry hint (server/draining.py)."""
        grace_s = self.config.shutdown_grace_s if grace_s is None else grace_s
        if self._watchdog is not None:
            self._watchdog.cancel()
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + grace_s
        await self.lifecycle.start_draining()
        server, goaway, refuser = self._server, None, None
        if server is not None:  # a graceful stop: GOAWAY, then calls left at the end of the grace are cancelled
            await asyncio.sleep(min(GOAWAY_DELAY_S, grace_s))
            goaway = asyncio.create_task(server.stop(grace=max(0.0, deadline_s - loop.time())))
            if self.lifecycle.num_in_flight and deadline_s > loop.time():
                refuser = await self._refuse_new_calls()  # NOTE: grpc closed the listener with its GOAWAY
        await self.lifecycle.wait_idle(max(0.0, deadline_s - loop.time()))
        if server is not None and goaway is not None:
            # NOTE: health Watch streams (client-side health checking) never end by themselves
            await server.stop(grace=STOP_GRACE_S)
            await goaway
        if refuser is not None:
            await refuser.stop()
        if self.health_port is not None:
            await self.health_port.stop()  # NOTE: after the main port: probes see NOT_SERVING for the whole drain
        self.lifecycle.stopped()
        if self._local_dir is not None:
            self._local_dir.cleanup()
            self._local_dir = None
        if self.engine is not None:
            await asyncio.to_thread(self.engine.shutdown)
        self.telemetry.shutdown()
        logger.info("stopped")


async def serve(config: ServerConfig) -> int:
    """`infer serve`: run until SIGTERM or SIGINT, then drain and exit 0; 2 for a model we cannot load (a missing
    or corrupt file, an unsupported architecture: the message names the file and the field), 1 when it fails
    otherwise to load or to warm up (health never says SERVING)."""
    server = InferenceServer(config)
    await server.start()
    gateway = await start_gateway(server)

    async def load_and_serve() -> None:
        await server.load()
        asyncio.get_running_loop().call_later(COLLECT_AFTER_SERVING_S, collect_from_now_on)
        await asyncio.Event().wait()  # serve until a signal cancels us

    try:
        await run_until_signal(load_and_serve())  # a signal during loading: stop without serving
    except Exception as e:
        logger.error("model failed to load or warm up: %s", e)
        await asyncio.gather(server.stop(grace_s=0), *([gateway.stop()] if gateway else []))
        return 2 if isinstance(e, ModelLoadError) else 1
    logger.info("signal received: draining (grace %.1f s)", config.shutdown_grace_s)
    await asyncio.gather(server.stop(), *([gateway.stop()] if gateway else []))
    return 0


def collect_from_now_on() -> None:
    """The cyclic garbage collector back on after SERVING (the command line pauses it for the start-up): the
    start-up's garbage collected once (a default model's first conversion leaves 230 MB of it), everything alive
    then (modules, the model, the tokenizer) frozen out of the later passes. NOTE: a full pass over them took
    0.18 s (Gemma 3 270M served: 335k objects), now once, not a stall of a step every so often."""
    gc.collect()
    gc.freeze()
    gc.enable()


async def start_gateway(server: InferenceServer) -> GatewayServer | None:
    """The OpenAI gateway in the same process and loop: a gRPC client of this (started) server, behind the same
    door (its TLS files and API keys)."""
    config = server.config
    if config.http_port is None:
        return None
    # NOTE: here, not at the top: a server without the gateway never imports it (0.1-0.4 s of start-up; the
    # settings read only gateway.origins)
    from infer.server.gateway.app import GatewayConfig, GatewayServer
    from infer.server.gateway.guard import HttpLimits
    from infer.server.gateway.origins import parse_origins

    gateway = GatewayServer(
        GatewayConfig(
            upstream=server.gateway_upstream,
            upstream_max_streams=config.max_streams_per_connection,
            host=config.host,
            http_port=config.http_port,
            shutdown_grace_s=config.shutdown_grace_s,
            tls=config.tls,
            api_keys=server.api_keys,
            limits=HttpLimits(config.max_request_bytes, config.http_header_timeout_s, config.http_body_timeout_s),
            allowed_origins=parse_origins(config.allowed_origins),
            tenant_header=config.tenant_header,
            metrics=server.telemetry.registry if config.http_metrics else None,
        )
    )
    await gateway.start()
    server.telemetry.add_own(gateway.metrics.registry)  # on the metrics port, off the public HTTP one
    return gateway
