"""The gRPC server around one engine: start (NOT_SERVING), load and warm up (SERVING), drain, stop."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.sdk.trace.export import SpanExporter

from infer.clients.types import SERVICE_NAME
from infer.engine import AsyncEngine, EngineClient, EngineStats
from infer.server.gateway.app import GatewayConfig, GatewayServer, local_upstream
from infer.server.gateway.guard import HttpLimits
from infer.server.gateway.origins import parse_origins
from infer.server.lifecycle import Lifecycle
from infer.server.security import ApiKeyInterceptor, ApiKeys, server_credentials
from infer.server.servicer import InferenceServicer, add_to_server
from infer.server.settings import ServerConfig
from infer.server.signals import run_until_signal
from infer.server.telemetry import Telemetry, make_span_exporter

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


def grpc_options(config: ServerConfig) -> list[tuple[str, int]]:
    """The server's channel options: the fixed ones and the limits from the settings."""
    return [
        *GRPC_OPTIONS,
        ("grpc.max_receive_message_length", config.max_request_bytes),
        ("grpc.max_concurrent_streams", config.max_streams_per_connection),
    ]


class InferenceServer:
    def __init__(self, config: ServerConfig, span_exporter: SpanExporter | None = None) -> None:
        self.config = config
        self.lifecycle = Lifecycle()
        exporter = span_exporter if span_exporter is not None else make_span_exporter(config.traces)
        self.telemetry = Telemetry(self._stats, exporter, batch_spans=span_exporter is None)
        self._server: grpc.aio.Server | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._local_dir: tempfile.TemporaryDirectory[str] | None = None
        self.port = 0
        self.local_address: str | None = None  # the gateway's hop when TLS is on: unix:PATH
        self.api_keys: ApiKeys | None = None  # read at start, shared with the in-process gateway
        self.metrics_port: int | None = None

    @property
    def engine(self) -> EngineClient | None:
        return self.lifecycle.engine

    def _stats(self) -> EngineStats | None:
        engine = self.lifecycle.engine
        return engine.stats() if engine is not None else None

    async def start(self) -> None:
        """Listen at once, reporting NOT_SERVING until `load` is done."""
        cfg = self.config
        self.api_keys = keys = ApiKeys.from_settings(cfg.api_key, cfg.api_keys_file)
        interceptors = [ApiKeyInterceptor(keys)] if keys is not None else []
        server = grpc.aio.server(options=grpc_options(cfg), interceptors=interceptors)
        servicer = InferenceServicer(self.lifecycle, self.telemetry, cfg.limits)
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
        if cfg.metrics_port is not None:
            try:
                self.metrics_port = self.telemetry.serve_metrics(cfg.host, cfg.metrics_port, cfg.http_header_timeout_s)
            except OSError as e:
                await server.stop(None)
                raise OSError(f"cannot serve metrics on {cfg.host}:{cfg.metrics_port}: {e}") from None
            logger.info("Prometheus metrics on http://%s:%d/metrics", cfg.host, self.metrics_port)

    @property
    def gateway_upstream(self) -> str:
        """Where the in-process gateway reaches this server: the private Unix socket under TLS, else the port."""
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

    async def load(self, engine: EngineClient | None = None) -> None:
        """Load the model (in a thread: health keeps answering), warm it up, then report SERVING.

        `engine`: serve this one instead of loading `config.engine` (tests serve a fake engine this way).
        """
        if engine is None:
            engine = await asyncio.to_thread(AsyncEngine.from_config, self.config.engine)
        if self.config.warmup:
            await engine.warmup()
        info, cfg, stats = engine.model_info, engine.config, engine.stats()
        logger.info(
            "model %s from %s on %s (%s): %d KV blocks of %d tokens, max_model_len %d, max_num_seqs %d",
            info.model_id, info.model_dir, cfg.device, cfg.dtype, stats.num_blocks_used + stats.num_blocks_free,
            cfg.block_size, cfg.max_model_len, cfg.max_num_seqs,
        )  # fmt: skip
        await self.lifecycle.serve(engine)
        self._watchdog = asyncio.create_task(self.lifecycle.watch_engine(self.config.engine_stall_timeout_s))
        logger.info("SERVING on %s:%d", self.config.host, self.port)

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain (NOT_SERVING, refuse new RPCs, let in-flight ones finish within grace_s), then stop."""
        grace_s = self.config.shutdown_grace_s if grace_s is None else grace_s
        if self._watchdog is not None:
            self._watchdog.cancel()
        await self.lifecycle.drain(grace_s)
        if self._server is not None:
            await self._server.stop(grace=0.5)  # cancels what is left: their engine requests are aborted
        self.lifecycle.stopped()
        if self._local_dir is not None:
            self._local_dir.cleanup()
            self._local_dir = None
        if self.engine is not None:
            await asyncio.to_thread(self.engine.shutdown)
        self.telemetry.shutdown()
        logger.info("stopped")


async def serve(config: ServerConfig) -> int:
    """`infer serve`: run until SIGTERM or SIGINT, then drain and exit 0; 1 when the model fails to load."""
    server = InferenceServer(config)
    await server.start()
    gateway = await start_gateway(server)

    async def load_and_serve() -> None:
        await server.load()
        await asyncio.Event().wait()  # serve until a signal cancels us

    try:
        await run_until_signal(load_and_serve())  # a signal during loading: stop without serving
    except Exception as e:
        logger.error("model failed to load: %s", e)
        await asyncio.gather(server.stop(grace_s=0), *([gateway.stop()] if gateway else []))
        return 1
    logger.info("signal received: draining (grace %.1f s)", config.shutdown_grace_s)
    await asyncio.gather(server.stop(), *([gateway.stop()] if gateway else []))
    return 0


async def start_gateway(server: InferenceServer) -> GatewayServer | None:
    """The OpenAI gateway in the same process and loop: a gRPC client of this (started) server, behind the same
    door (its TLS files and API keys)."""
    config = server.config
    if config.http_port is None:
        return None
    gateway = GatewayServer(
        GatewayConfig(
            upstream=server.gateway_upstream,
            host=config.host,
            http_port=config.http_port,
            shutdown_grace_s=config.shutdown_grace_s,
            tls=config.tls,
            api_keys=server.api_keys,
            limits=HttpLimits(config.max_request_bytes, config.http_header_timeout_s, config.http_body_timeout_s),
            max_output_tokens=config.max_output_tokens,
            allowed_origins=parse_origins(config.allowed_origins),
        )
    )
    await gateway.start()
    return gateway
