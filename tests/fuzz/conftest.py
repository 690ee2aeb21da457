"""Hypothesis profiles: `ci` (the default: a short run in make test) and `fuzz` (make fuzz: a long one)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}
settings.register_profile("ci", max_examples=60, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("fuzz", max_examples=3000, **_COMMON)  # type: ignore[arg-type]
settings.load_profile("ci")
