"""`make soak-tenants` (benchmarks/tenants_rss.py): its verdict on made-up samples (the real run takes the model and
minutes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

from tenants_rss import Sample, slope_mib_per_10k, verdict


def _samples(*rss_mib: float) -> list[Sample]:
    return [Sample(i * 10_000, i * 60.0, rss, {"budgets": min(i * 10_000, 10_000)}) for i, rss in enumerate(rss_mib)]


def test_rss_is_judged_from_the_first_sample_with_the_tables_full() -> None:
    # the climb while the tables fill (to 10,000 tenants) is not growth; past it, the highest sample counts
    assert verdict(_samples(1800, 1850, 1852, 1849, 1855), 10_000, 16.0) == (True, 5.0, 10_000)
    bounded, growth, _ = verdict(_samples(1800, 1850, 1860, 1870, 1880), 10_000, 16.0)
    assert not bounded and growth == 30.0


def test_too_few_samples_past_the_limit_are_no_verdict() -> None:
    with pytest.raises(ValueError, match="raise --requests"):
        verdict(_samples(1800, 1850), 10_000, 16.0)


def test_the_slope_is_per_ten_thousand_tenants() -> None:
    assert slope_mib_per_10k([(10_000, 100.0), (20_000, 102.0), (30_000, 104.0)]) == 2.0
    assert slope_mib_per_10k([(10_000, 100.0)]) == 0.0
