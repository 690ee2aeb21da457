"""A corpus of hostile chat templates (what a model file or a `--chat-template` file may hold), and the check every
one must pass under the render bounds: a clean ChatTemplateError or an output within the size bound, within the
time bound (with some slack), and the rendering thread free again. `make fuzz-models` may run it on its mutated
files' templates too (`check_template`)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from infer.engine.chat_template import ChatTemplate, ChatTemplateError, RenderBounds

BOUNDS = RenderBounds(timeout_s=0.2, max_chars=20_000)
# a render may overrun its bound by the watchdog's wake-up and the unwinding (a 100,000-deep list freed, a busy
# machine: 0.74 s once in make test), never by this
SLACK_S = 2.0
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi!"},
    {"role": "user", "content": "Bye"},
]

HOSTILE = {
    # time
    "nested-loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "huge-ranges": "{% for i in range(10**9) %}{% for j in range(10**9) %}{% endfor %}{% endfor %}",
    "nested-loops-in-a-macro": "{% macro f() %}{% for i in range(100000) %}{% for j in range(100000) %}"
    "{% endfor %}{% endfor %}{% endmacro %}{{ f() }}",
    "loop-of-sorts": "{% for i in range(100000) %}{{ range(100000)|sort|first }}{% endfor %}",
    # output and values that grow
    "string-doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}{{ ns.s }}",
    "string-doubling-plus": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
    "{% endfor %}{{ ns.s }}",
    "a-gigabyte-out": "{% for i in range(100000) %}{% for j in range(100000) %}{{ 'x' * 100 }}{% endfor %}{% endfor %}",
    "repeat": "{{ 'x' * 10**9 }}",
    "list-repeat-join": "{{ (['x' * 1000] * 100000)|join }}",
    "center": "{{ 'x'|center(10**9) }}",
    "ljust": "{{ 'x'.ljust(10**9) }}",
    "zfill": "{{ '1'.zfill(10**9) }}",
    "percent-width": "{{ '%0999999999d' % 1 }}",
    "star-width": "{{ '%*d' % (10**9, 1) }}",
    "format-width": "{{ '{:>999999999}'.format(1) }}",
    "format-filter": "{{ '%0999999999d'|format(1) }}",
    "replace": "{{ ('x' * 10000)|replace('x', 'y' * 10000) }}",
    "expandtabs": "{{ ('\t' * 10000).expandtabs(10**6) }}",
    "indent": "{{ ('\n' * 10000)|indent(10**6) }}",
    "tojson-indent": "{{ messages|tojson(indent=10**9) }}",
    "map-join": "{{ range(100000)|map('string')|join('x' * 1000) }}",
    "set-block": "{% set s %}{% for i in range(100000) %}{% for j in range(1000) %}xxxxxxxxxx{% endfor %}"
    "{% endfor %}{% endset %}{{ s|length }}",
    "namespace-list": "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + ['x' * 1000] %}"
    "{% endfor %}",
    "big-power": "{{ 2 ** (10**9) }}",
    "squaring": "{% set ns = namespace(x=3) %}{% for i in range(64) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "deep-list": "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}"
    "{{ ns.l }}",
    # errors
    "division-by-zero": "{{ 1 // 0 }}",
    "float-division-by-zero": "{{ 1 / 0 }}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "raise-exception": "{{ raise_exception('refused') }}",
    "undefined-call": "{{ nothing() }}",
    "bad-index": "{{ messages[10**6] }}",
    "int-to-huge-str": "{{ (10 ** 4000) ~ '' }}",
    "sandbox-escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "globals-escape": "{{ raise_exception.__globals__ }}",
    "mutation": "{% set l = [1] %}{{ l.append(2) }}",
    "lipsum": "{{ lipsum(10**6) }}",
    "syntax": "{% for m in messages %}",
    "deep-syntax": "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
}


@dataclass(frozen=True)
class Outcome:
    name: str
    seconds: float
    error: str | None  # the ChatTemplateError's message, None when it rendered
    num_chars: int


def check_template(name: str, source: str, bounds: RenderBounds = BOUNDS) -> Outcome:
    """Render `source` under `bounds`; AssertionError unless it ended cleanly (a ChatTemplateError or an output
    within the size bound) within the time bound and the slack."""
    started = time.monotonic()
    try:
        text = ChatTemplate(source, name).render(bounds, {"messages": MESSAGES, "add_generation_prompt": True})
        error, num_chars = None, len(text)
    except ChatTemplateError as e:  # anything else (a 500, a crash) fails the check
        error, num_chars = str(e), 0
    seconds = time.monotonic() - started
    assert seconds <= bounds.timeout_s + SLACK_S, f"{name}: {seconds:.2f} s"
    assert num_chars <= bounds.max_chars, f"{name}: {num_chars} characters"
    return Outcome(name, seconds, error, num_chars)


def check_corpus(bounds: RenderBounds = BOUNDS) -> list[Outcome]:
    return [check_template(name, source, bounds) for name, source in HOSTILE.items()]
