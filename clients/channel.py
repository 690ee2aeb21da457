"""Channels to an infer server: plaintext or TLS (with a client certificate for mTLS), and the API key header.

secure = ClientTls(ca_file="ca.pem")               # trust this CA; ClientTls() trusts the system's roots
with InferClient("infer.example:50051", tls=secure, api_key="...") as client: ...

Every channel balances round robin over the addresses its target resolves to and retries a call that fails
UNAVAILABLE before any response (a replica that is loading, draining or gone). Given several servers
(`ipv4:10.0.0.1:50051,10.0.0.2:50051`, or a `dns:///name:port` target, e.g. a headless Service), it also
watches each one's grpc.health.v1 status and sends nothing to one that is NOT_SERVING: a client pinned to a
draining replica moves to the others.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc

from infer.api import API_KEY_METADATA, SERVICE_NAME, UNARY_METHODS, bearer, pb_grpc
from infer.api.credentials import read_file as read_file  # NOTE: also the gateway's, from here
from infer.api.credentials import read_keys as read_keys  # NOTE: also `infer client --api-key-file`'s, from here

Metadata = Sequence[tuple[str, str]]
MAX_ATTEMPTS, INITIAL_BACKOFF_S, MAX_BACKOFF_S, BACKOFF_MULTIPLIER = 5, 0.1, 2.0, 2
# NOTE: gRPC retries a call only until its first response arrives: a stream that has started is never replayed
RETRY_POLICY = {
    "maxAttempts": MAX_ATTEMPTS,
    "initialBackoff": f"{INITIAL_BACKOFF_S}s",
    "maxBackoff": f"{MAX_BACKOFF_S}s",
    "backoffMultiplier": BACKOFF_MULTIPLIER,
    "retryableStatusCodes": ["UNAVAILABLE"],
}


def _read(path: str | None, what: str) -> bytes | None:
    return None if path is None else read_file(path, what)


@dataclass(frozen=True)
class ClientTls:
    """TLS to the server: trust ca_file (PEM; None = the system's roots); cert_file + key_file for mTLS."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None  # the name the server's certificate must carry, when not the address's host

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls cert_file and key_file: give both, or neither")

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, "tls ca_file"),
            private_key=_read(self.key_file, "tls key_file"),
            certificate_chain=_read(self.cert_file, "tls cert_file"),
        )

    def options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def is_multi_address(address: str) -> bool:
    """Whether a target names several servers: an address list (`ipv4:a:p,b:q`) or a `dns:` name."""
    return address.startswith("dns:") or "," in address


def service_config(address: str, retry_streams: bool = True) -> dict[str, Any]:
    """The channel's gRPC service config: round robin, retries of UNAVAILABLE (of every method, or of the unary
    ones only), and client-side health checking of each server when the target names several (with one, a
    NOT_SERVING server would hide its own reason)."""
    names = (
        [{"service": SERVICE_NAME}]
        if retry_streams
        else [{"service": SERVICE_NAME, "method": m} for m in UNARY_METHODS]
    )
    config: dict[str, Any] = {
        "loadBalancingConfig": [{"round_robin": {}}],
        "methodConfig": [{"name": names, "retryPolicy": RETRY_POLICY}],
    }
    if is_multi_address(address):
        config["healthCheckConfig"] = {"serviceName": SERVICE_NAME}
    return config


def retry_backoff_s(retry: int) -> float:
    """How long to wait before retry number `retry` (1, 2, ...), as gRPC's retry policy does: a random time up
    to the initial backoff times the multiplier per earlier retry, capped."""
    return random.uniform(0, min(MAX_BACKOFF_S, INITIAL_BACKOFF_S * BACKOFF_MULTIPLIER ** (retry - 1)))


def channel_options(
    address: str, options: Sequence[tuple[str, Any]] = (), retry_streams: bool = True
) -> list[tuple[str, Any]]:
    """gRPC channel args for `address`: the service config, then `options` (which win)."""
    config = json.dumps(service_config(address, retry_streams))
    defaults = [("grpc.service_config", config), ("grpc.enable_retries", 1)]
    names = {name for name, _ in options}
    return [*(o for o in defaults if o[0] not in names), *options]


def channel(address: str, tls: ClientTls | None = None, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """A blocking channel: plaintext unless `tls`; `options`: gRPC channel args.

    NOTE: gRPC's retries of its streaming calls are off here (InferClient retries Generate itself): with grpcio
    1.85, a blocking server-streaming call whose retry spans the server's GOAWAY never returns, past its deadline.
    """
    if tls is None:
        return grpc.insecure_channel(address, options=channel_options(address, options, retry_streams=False))
    all_options = channel_options(address, [*tls.options(), *options], retry_streams=False)
    return grpc.secure_channel(address, tls.credentials(), options=all_options)


def aio_channel(
    address: str, tls: ClientTls | None = None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.aio.Channel:
    """An asyncio channel (belongs to the running loop): plaintext unless `tls`; `options`: gRPC channel args."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=channel_options(address, options))
    return grpc.aio.secure_channel(
        address, tls.credentials(), options=channel_options(address, [*tls.options(), *options])
    )


# NOTE: grpc shares one connection among the channels to a target that have the same arguments (its global
# subchannel pool); a pooled channel keeps its own, or the pool would stack every call on one connection
OWN_CONNECTIONS = ("grpc.use_local_subchannel_pool", 1)


@dataclass(eq=False)
class Lane:
    """One channel of a ChannelPool, its stubs, and the calls it carries now."""

    channel: grpc.aio.Channel
    stub: pb_grpc.InferenceServiceStub
    health: health_pb2_grpc.HealthStub
    num_calls: int = 0


class ChannelPool:
    """asyncio channels to one target, opened as calls need them: a call goes on the first channel with fewer than
    `max_calls` calls in flight, else on a new channel (its own connection). So no call waits behind a server's
    cap on the concurrent streams of one connection (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS), which would queue
    it ahead of the server's scheduler. A channel left idle while another is idle too is closed.
    `max_calls` None: one channel for everything. Opened in the running loop, on first use.
    """

    def __init__(self, address: str, tls: ClientTls | None = None, max_calls: int | None = None) -> None:
        if max_calls is not None and max_calls < 1:
            raise ValueError("max_streams_per_channel: must be >= 1 (or none)")
        if max_calls is not None and max_calls > 1 and is_multi_address(address):
            max_calls -= 1  # NOTE: each connection also carries the health Watch stream of client-side checking
        self.address, self.tls, self.max_calls = address, tls, max_calls
        self.lanes: list[Lane] = []
        self._closing: set[asyncio.Task[None]] = set()

    def acquire(self) -> Lane:
        """The channel for one more call; `release` it when the call ends."""
        lane = next((lane for lane in self.lanes if self.max_calls is None or lane.num_calls < self.max_calls), None)
        if lane is None:
            lane = self._open()
        lane.num_calls += 1
        return lane

    def release(self, lane: Lane) -> None:
        lane.num_calls -= 1
        if lane.num_calls == 0 and lane in self.lanes and sum(other.num_calls == 0 for other in self.lanes) > 1:
            self.lanes.remove(lane)  # NOTE: one idle channel is kept for the next calls
            task = asyncio.ensure_future(lane.channel.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _open(self) -> Lane:
        options = [OWN_CONNECTIONS] if self.max_calls is not None else []
        ch = aio_channel(self.address, self.tls, options)
        lane = Lane(ch, pb_grpc.InferenceServiceStub(ch), health_pb2_grpc.HealthStub(ch))  # type: ignore[no-untyped-call]
        self.lanes.append(lane)
        return lane

    async def close(self) -> None:
        """Close every channel (their calls end CANCELLED); a later call opens a new one."""
        lanes, self.lanes = self.lanes, []
        for lane in lanes:
            await lane.channel.close()
        if self._closing:
            await asyncio.gather(*self._closing)


def with_api_key(metadata: Metadata, api_key: str | None) -> Metadata:
    """`metadata` plus `authorization: Bearer <api_key>`, unless it carries one already or there is no key."""
    if api_key is None or any(name == API_KEY_METADATA for name, _ in metadata):
        return metadata
    return [*metadata, (API_KEY_METADATA, bearer(api_key))]
