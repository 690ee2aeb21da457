"""The scheduling settings of `infer serve` (issue 30's engine side): the policy, its aging, tenant weights."""

from __future__ import annotations

import argparse

import pytest

from infer.engine import SCHEDULING_POLICIES
from infer.server.settings import SETTINGS, ServerConfig, add_settings, config_from_args


def parse(argv: list[str], environ: dict[str, str] | None = None) -> ServerConfig:
    parser = argparse.ArgumentParser()
    add_settings(parser, environ or {})
    return config_from_args(parser.parse_args(argv))


def test_scheduling_settings_reach_the_engine_config() -> None:
    env = {"INFER_TENANT_WEIGHTS": "gold=2, free=0.5", "INFER_PRIORITY_AGING_S": "30"}
    engine = parse(["--scheduling-policy", "fair"], env).engine
    assert engine.scheduling_policy == "fair" and engine.priority_aging_s == 30.0
    assert engine.tenant_weights == (("gold", 2.0), ("free", 0.5))
    assert parse([], {"INFER_TENANT_WEIGHTS": "none"}).engine.tenant_weights == ()
    assert parse([]).engine.scheduling_policy == "fcfs"


def test_bad_scheduling_settings_are_refused() -> None:
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        parse(["--scheduling-policy", "lottery"])
    with pytest.raises(SystemExit):  # argparse: the parse function's ValueError
        parse(["--tenant-weights", "gold"])
    with pytest.raises(ValueError, match="tenant_weights"):
        parse(["--tenant-weights", "gold=0"])


def test_the_policy_setting_offers_the_names_of_the_engines_table() -> None:
    choices = next(s.choices for s in SETTINGS if s.name == "scheduling_policy")
    assert choices == tuple(SCHEDULING_POLICIES) == ("fcfs", "priority", "fair")
