"""engine/chat_template.py: a chat template renders within a time and a size bound, whatever it does."""

from __future__ import annotations

import resource
import threading
import time

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from infer.engine.chat_template import ChatTemplate, RenderBounds, TemplateFailed, TemplateTooLong

BOUNDS = RenderBounds(timeout_s=0.2, max_chars=10_000)  # NOTE: a short bound, for tests only
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
DOUBLING = "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
GIGABYTE = "{% for i in range(100000) %}{% for j in range(100000) %}{{ 'x' * 100 }}{% endfor %}{% endfor %}"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
# what real templates use: loops, namespace, macros, tojson, string methods, `~`, `+`, filters
RICH = """{%- set ns = namespace(system='') -%}
{%- macro turn(role, text) %}<|im_start|>{{ role }}
{{ text | trim }}<|im_end|>
{% endmacro -%}
{%- for m in messages -%}
{%- if m.role == 'system' %}{% set ns.system = m.content ~ ' (' ~ loop.length ~ ')' %}{% continue %}{% endif -%}
{{ turn(m.role, m.content) }}{{ (m | tojson) + '\\n' }}{{ '%s|%d' % (m.role.upper(), loop.index) }}
{%- endfor -%}
{{ ns.system | replace('Be', 'be') | center(30) }}{{ messages | map(attribute='role') | join(', ') }}"""


def _render(source: str, bounds: RenderBounds = BOUNDS) -> str:
    return ChatTemplate(source, "test-template").render(bounds, {"messages": MESSAGES})


def test_a_render_is_what_the_plain_sandbox_renders() -> None:
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    plain.filters["tojson"] = ChatTemplate(RICH)._template.environment.filters["tojson"]
    assert _render(RICH) == plain.from_string(RICH).render(messages=MESSAGES)


def test_nested_loops_stop_at_the_time_bound_and_the_thread_renders_again() -> None:
    started = time.monotonic()
    with pytest.raises(TemplateFailed, match=r"test-template ran past its time bound \(0.2 s\)"):
        _render(NESTED_LOOPS)
    assert time.monotonic() - started < 0.7
    assert _render("{{ messages | length }}") == "2"
    time.sleep(0.05)  # nothing raised late in this thread
    assert sum(range(100_000)) == 4_999_950_000


def test_a_timeout_in_one_thread_leaves_the_others_alone() -> None:
    results: list[str] = []
    slow = "{% for i in range(100) %}{% for j in range(300) %}{% endfor %}{% endfor %}ok"

    def render_plain() -> None:
        for _ in range(20):
            results.append(_render(slow, RenderBounds(5.0, 10_000)))

    other = threading.Thread(target=render_plain)
    other.start()
    with pytest.raises(TemplateFailed, match="time bound"):
        _render(NESTED_LOOPS)
    other.join()
    assert results == ["ok"] * 20


@pytest.mark.parametrize("source", [DOUBLING, DOUBLING.replace("~", "+"), GIGABYTE])
def test_growth_stops_at_the_size_bound_without_memory(source: str) -> None:
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises((TemplateFailed, TemplateTooLong), match="10000 characters"):
        _render(source)
    assert time.monotonic() - started < 0.5  # stopped by its size, not its time
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_kib < 20_000


def test_the_output_bound_is_exact() -> None:
    bounds = RenderBounds(1.0, 100)
    assert len(_render("{{ 'x' * 100 }}", bounds)) == 100
    with pytest.raises(TemplateTooLong, match="more than 100 characters") as e:
        _render("{{ 'x' * 60 }}{{ 'x' * 41 }}", bounds)
    assert e.value.max_chars == 100


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("{{ 1 // 0 }}", "ZeroDivisionError"),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
        ("{{ raise_exception('Roles must alternate') }}", "Roles must alternate"),
        ("{{ 2 ** (10 ** 9) }}", "integer of more than"),
        ("{{ '%0999999999d' % 1 }}", "format width"),
    ],
    ids=["zero", "recursion", "raise", "power", "width"],
)
def test_what_a_template_raises_is_a_template_failure_naming_it(source: str, error: str) -> None:
    with pytest.raises(TemplateFailed, match=f"^test-template failed: .*{error}"):
        _render(source)


def test_a_syntax_error_names_the_template() -> None:
    with pytest.raises(TemplateFailed, match=r"^invalid chat template \(test-template\)"):
        ChatTemplate("{% for m in messages %}", "test-template")
