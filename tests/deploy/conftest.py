"""Fixtures of the deployment tests: helm, and the chart rendered once per value file."""

from __future__ import annotations

import pytest

from tests.deploy.chart import CASES, Manifest, render, tool, values_args


@pytest.fixture(scope="session")
def helm() -> str:
    return tool("helm")


@pytest.fixture(scope="session")
def rendered(helm: str) -> dict[str, list[Manifest]]:
    """Every case's manifests (`helm template` of the defaults and of each charts/infer/ci/*-values.yaml)."""
    return {case: render(helm, *values_args(case)) for case in CASES}
