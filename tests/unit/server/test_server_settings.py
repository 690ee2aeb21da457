"""`infer serve` settings: flags, INFER_* variables, defaults from the config dataclasses, the docs table."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

import pytest

from infer.engine.config import EngineConfig
from infer.server.settings import (
    SETTINGS,
    ServerConfig,
    add_settings,
    config_from_args,
    num_cores,
    settings_markdown,
)

DOCS = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def parse(argv: list[str], environ: dict[str, str] | None = None) -> ServerConfig:
    parser = argparse.ArgumentParser()
    add_settings(parser, environ or {})
    return config_from_args(parser.parse_args(argv))


def test_every_config_field_has_exactly_one_setting() -> None:
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names))
    expected = {f.name for f in fields(EngineConfig)} | {f.name for f in fields(ServerConfig)} - {"engine", "warmup"}
    assert set(names) == expected


def test_defaults_are_the_dataclass_defaults() -> None:
    assert parse([]) == ServerConfig()


def test_flags_win_over_environment_over_defaults() -> None:
    env = {"INFER_MAX_MODEL_LEN": "1024", "INFER_GRPC_PORT": "6000", "INFER_ENABLE_PREFIX_CACHING": "false"}
    config = parse(["--grpc-port", "7000", "--num-blocks", "64", "--metrics-port", "off"], env)
    assert config.grpc_port == 7000 and config.metrics_port is None
    assert config.engine.max_model_len == 1024 and config.engine.num_blocks == 64
    assert config.engine.enable_prefix_caching is False
    assert parse(["--enable-prefix-caching"], env).engine.enable_prefix_caching is True


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"INFER_MAX_NUM_SEQS": "many"}, "INFER_MAX_NUM_SEQS"),
        ({"INFER_ENABLE_CHUNKED_PREFILL": "maybe"}, "INFER_ENABLE_CHUNKED_PREFILL"),
        ({"INFER_BATCHING": "dynamic"}, "INFER_BATCHING"),
    ],
)
def test_a_bad_environment_value_names_the_variable(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse([], environ)


def test_an_invalid_setting_names_the_field() -> None:
    with pytest.raises(ValueError, match="max_num_seqs"):
        parse(["--max-num-seqs", "0"])
    with pytest.raises(ValueError, match="shutdown_grace_s"):
        parse(["--shutdown-grace-s", "-1"])


def test_cpu_threads_past_the_cores_are_refused_naming_the_setting_and_the_cores() -> None:
    """100,000 crashed OpenMP (a thread-pool panic), 5,000 hung: refused at start, exit 2 (`infer serve`)."""
    cores = num_cores()
    for threads in (100_000, 5000, cores + 1):
        with pytest.raises(ValueError, match=rf"cpu_threads: {threads} is more than the {cores} cores"):
            parse(["--cpu-threads", str(threads)])
    assert parse(["--cpu-threads", str(cores)]).engine.cpu_threads == cores
    assert parse([], {"INFER_CPU_THREADS": "0"}).engine.cpu_threads == 0


def test_prompt_size_limits_reach_the_servicer_and_are_checked() -> None:
    env = {"INFER_MAX_CHAT_MESSAGES": "50", "INFER_MAX_PROMPT_CHARS": "none"}
    config = parse(["--max-pending-long-prompts", "8"], env)
    assert (config.limits.max_chat_messages, config.limits.max_prompt_chars) == (50, None)
    assert config.limits.max_pending_long_prompts == 8
    for flag in ("--max-chat-messages", "--max-prompt-chars", "--max-pending-long-prompts"):
        with pytest.raises(ValueError, match=flag.removeprefix("--").replace("-", "_")):
            parse([flag, "0"])


def test_connection_age_settings_take_none_for_off() -> None:
    env = {"INFER_MAX_CONNECTION_AGE_S": "none", "INFER_MAX_CONNECTION_AGE_GRACE_S": "45"}
    config = parse([], env)
    assert config.max_connection_age_s is None and config.max_connection_age_grace_s == 45.0
    assert parse(["--max-connection-age-s", "120.5"], env).max_connection_age_s == 120.5
    assert parse([]).max_connection_age_grace_s is None  # by default, age never cuts a stream
    with pytest.raises(ValueError, match="max_connection_age_s"):
        parse(["--max-connection-age-s", "0"])
    with pytest.raises(ValueError, match="max_connection_age_grace_s"):
        parse(["--max-connection-age-grace-s", "-1"])
    parser = argparse.ArgumentParser()
    add_settings(parser, {})
    assert "(±10%)" in parser.format_help()  # a help text with a percent sign renders


def test_docs_table_is_current() -> None:
    assert settings_markdown() in DOCS.read_text(), "docs/configuration.md: paste settings_markdown()"
    readme = DOCS.parents[1] / "README.md"
    assert settings_markdown() in readme.read_text(), "README.md: paste settings_markdown()"


def test_tenant_settings_take_the_flags_the_docs_name() -> None:
    config = parse(["--tenants", "tenants.txt", "--tenant-header", "X-Tenant"])
    assert (config.tenants_file, config.tenant_header) == ("tenants.txt", "x-tenant")  # metadata keys are lowercase
    assert parse([], {"INFER_TENANTS_FILE": "t", "INFER_TENANT_HEADER": "off"}).tenants_file == "t"
    assert parse([]).tenant_header is None
    for bad in ("grpc-tenant", "x-tenant-bin", "authorization", "x tenant"):
        with pytest.raises(ValueError, match="tenant_header"):
            parse(["--tenant-header", bad])
