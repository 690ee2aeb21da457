"""`infer gateway`'s TLS, key and limit flags, and their INFER_* variables."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from infer.clients.channel import ClientTls
from infer.server.gateway import add_gateway_parser
from infer.server.gateway.cli import config_from_args, run_gateway_command
from infer.server.gateway.guard import HttpLimits
from infer.server.security import TlsFiles


def _args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_gateway_parser(parser.add_subparsers())
    return parser.parse_args(["gateway", *flags])


def test_security_and_limit_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("INFER_API_KEY", "k1,k2")
    monkeypatch.setenv("INFER_HTTP_BODY_TIMEOUT_S", "7")
    config = config_from_args(
        _args("--tls-cert", "c.pem", "--tls-key", "k.pem", "--upstream-tls-ca", "ca.pem",
              "--max-request-bytes", "9999", "--http-header-timeout-s", "3")
    )  # fmt: skip
    assert config.tls == TlsFiles("c.pem", "k.pem")
    assert config.upstream_tls == ClientTls(ca_file="ca.pem")
    assert config.api_keys is not None and config.api_keys.is_valid("k2") and not config.api_keys.is_valid("k3")
    assert config.limits == HttpLimits(9999, 3.0, 7.0)
    assert "k1" not in repr(config)  # keys never show in logs of the config
    plain = config_from_args(_args())
    assert plain.tls is None and plain.upstream_tls is None and plain.limits == HttpLimits(body_timeout_s=7.0)
    assert config_from_args(_args("--upstream-tls")).upstream_tls == ClientTls()


def test_half_a_key_pair_exits_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("INFER_API_KEY", raising=False)
    assert run_gateway_command(_args("--tls-cert", "c.pem")) == 2
    assert "tls_cert and tls_key" in capsys.readouterr().err


def test_the_tenant_header_flag(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Forwarded to the upstream, which reads its tenant from it (`infer serve --tenant-header`)."""
    monkeypatch.delenv("INFER_TENANT_HEADER", raising=False)
    assert config_from_args(_args()).tenant_header is None
    assert config_from_args(_args("--tenant-header", "X-Tenant")).tenant_header == "x-tenant"
    monkeypatch.setenv("INFER_TENANT_HEADER", "x-team")
    assert config_from_args(_args()).tenant_header == "x-team"
    assert run_gateway_command(_args("--tenant-header", "authorization")) == 2
    assert "tenant_header: 'authorization' is reserved" in capsys.readouterr().err
