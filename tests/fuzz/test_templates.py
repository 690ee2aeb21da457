"""Every hostile chat template of the corpus (tests/fuzz/templates.py) ends cleanly under a short bound: a
ChatTemplateError or a bounded output, in time. And the thread that rendered it renders the next one."""

from __future__ import annotations

import pytest

from tests.fuzz.templates import HOSTILE, MESSAGES, check_template

pytestmark = pytest.mark.fuzz

MUST_FAIL = set(HOSTILE) - {"globals-escape", "bad-index"}  # undefined: rendered as nothing


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_template_ends_cleanly_in_time(name: str) -> None:
    outcome = check_template(name, HOSTILE[name])
    assert (outcome.error is not None) == (name in MUST_FAIL), outcome
    if outcome.error is not None:
        assert name in outcome.error  # the template is named
    plain = check_template("plain", "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    assert plain.error is None and plain.num_chars == sum(len(m["role"]) + len(m["content"]) + 3 for m in MESSAGES)
