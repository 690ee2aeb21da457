"""benchmarks/soak.py: a new run rewrites its report but keeps the hand-written part after the marker."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SOAK = Path(__file__).parents[2] / "benchmarks" / "soak.py"


def _soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_hand_written_part_of_the_report_is_kept(tmp_path: Path) -> None:
    soak = _soak()
    report = tmp_path / "reliability.md"
    assert soak._kept(report) == ""  # no report yet
    by_hand = f"{soak.KEPT_MARKER}\n\n## Memory\n\nmeasured by hand\n"
    report.write_text(f"# Reliability: soak run\n\nold figures\n\n{by_hand}")
    assert soak._kept(report) == f"\n{by_hand}"
    report.write_text("# Reliability: soak run\n\nno hand-written part\n")
    assert soak._kept(report) == ""


def test_the_docs_report_has_its_hand_written_part() -> None:
    assert _soak().KEPT_MARKER in (SOAK.parents[1] / "docs" / "reliability.md").read_text()
