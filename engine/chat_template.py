"""Chat templates are code from strangers (a model file, a `--chat-template` file): each render is bounded.

A template renders in jinja2's immutable sandbox (no attribute past `_`, no mutating methods, `range` up to
100,000) with two bounds per render (`RenderBounds`):
- time: a watchdog raises `_Timeout` in the rendering thread once its deadline passes (CPython's
  `PyThreadState_SetAsyncExc`), so a loop of loops stops at the next bytecode, and the thread is free again.
  Nothing is paid on a render that ends in time but arming and disarming (a heap push, two lock round trips).
- size: no value the template makes, and not its output, may hold more than `max_chars` characters (a list
  counts its items' characters). What grows a value is checked before it runs where one step could make a
  large one at once (`*`, `**`, `%`, `~`, `+`, `join`, `replace`, padding widths, format widths) and its result
  after; the output is rendered as a stream (`generate()`) and counted as it grows, as is every block,
  macro and `{% set %}` body (a counted buffer), and a namespace's attributes as they are set.
Whatever a template raises (ZeroDivisionError, RecursionError, a sandbox violation, `raise_exception`) ends as
`TemplateFailed`; an output over the bound as `TemplateTooLong`. Both are ChatTemplateError (a ValueError).
"""

from __future__ import annotations

import ctypes
import functools
import heapq
import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

DEFAULT_TIMEOUT_S = 2.0  # a real template renders in about a millisecond
DEFAULT_MAX_CHARS = 1 << 22  # when the caller gives no bound (the loader's probe, a tokenizer on its own)
MAX_INT_BITS = 1 << 12  # an int a template makes: 1,233 digits (a chat needs a few)
MAX_JSON_INDENT = 64  # tojson's indent, spaces or characters
_DIGITS = re.compile(r"\d+")


class ChatTemplateError(ValueError):
    """The model has no chat template, or the template failed on the messages."""


class TemplateFailed(ChatTemplateError):  # noqa: N818 (says what happened, like the other refusals)
    """The template raised, broke a bound other than its output's, or ran out of time."""


class TemplateTooLong(ChatTemplateError):  # noqa: N818
    """The template's output grew past `max_chars` (it was stopped there)."""

    def __init__(self, message: str, max_chars: int) -> None:
        super().__init__(message)
        self.max_chars = max_chars


class _Timeout(BaseException):
    """Raised in a rendering thread by the watchdog. A BaseException: nothing in jinja catches it."""


class _TooLargeError(Exception):
    """A value (or the output) over the render's size bound."""


@dataclass(frozen=True)
class RenderBounds:
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_chars: int = DEFAULT_MAX_CHARS

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError("chat_template_timeout_s: must be > 0")
        if self.max_chars < 1:
            raise ValueError("max_chars: must be >= 1")


class ChatTemplate:
    """One template, compiled once in its own bounded sandbox; `render` is thread-safe. `origin` names it in
    errors (`the chat template of model.gguf`, `--chat-template FILE`)."""

    def __init__(self, source: str, origin: str = "the chat template") -> None:
        self.source, self.origin = source, origin
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as e:
            raise TemplateFailed(f"invalid chat template ({origin}): {e}") from None
        except (RecursionError, MemoryError) as e:  # nested thousands deep
            raise TemplateFailed(f"invalid chat template ({origin}): {type(e).__name__}") from None

    def render(self, bounds: RenderBounds, variables: dict[str, Any]) -> str:
        try:
            render = _WATCHDOG.arm(bounds.timeout_s)
            try:
                return self._render(bounds.max_chars, variables)
            finally:
                _WATCHDOG.disarm(render)
        except _Timeout:  # NOTE: it may land anywhere in here, arm and disarm included: caught all the same
            raise TemplateFailed(f"{self.origin} ran past its time bound ({bounds.timeout_s:g} s)") from None

    def _render(self, max_chars: int, variables: dict[str, Any]) -> str:
        _bound.max_chars = max_chars
        try:
            return _joined(self._template.generate(**variables), max_chars)
        except _TooLargeError as e:
            if str(e) == "output":
                raise TemplateTooLong(f"{self.origin} rendered more than {max_chars} characters", max_chars) from None
            raise TemplateFailed(f"{self.origin} failed: {e}") from None
        except jinja2.TemplateError as e:  # raise_exception(...), sandbox violations, syntax met at run time
            raise TemplateFailed(f"{self.origin} failed: {e}") from None
        except Exception as e:  # whatever the template's code raises: ZeroDivisionError, RecursionError, ...
            raise TemplateFailed(f"{self.origin} failed: {type(e).__name__}: {e}") from None
        finally:
            _bound.max_chars = DEFAULT_MAX_CHARS


def _joined(chunks: Iterable[str], max_chars: int) -> str:
    """The output, counted as it grows."""
    parts, num_chars = [], 0
    for chunk in chunks:
        num_chars += len(chunk)
        if num_chars > max_chars:
            raise _TooLargeError("output")
        parts.append(chunk)
    return "".join(parts)


# --- time: a watchdog that raises in the rendering thread


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Schedule `exc` in the thread (None: drop one scheduled and not yet raised)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), None if exc is None else ctypes.py_object(exc)
    )


@dataclass(eq=False)
class _Render:
    thread_id: int
    is_done: bool = False
    is_fired: bool = False


@dataclass
class _Watchdog:
    """One daemon thread for every render: sleeps until the earliest deadline, then raises `_Timeout` in each
    thread whose render has not ended. NOTE: a raise lands at the thread's next bytecode; a long C call (none
    a bounded template can make) would finish first."""

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _heap: list[tuple[float, int, _Render]] = field(default_factory=list)
    _order: Iterator[int] = field(default_factory=itertools.count)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self._wake = threading.Condition(self._lock)

    def arm(self, timeout_s: float) -> _Render:
        render = _Render(threading.get_ident())
        with self._lock:
            heapq.heappush(self._heap, (time.monotonic() + timeout_s, next(self._order), render))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="infer-template-watchdog", daemon=True)
                self._thread.start()
            if self._heap[0][2] is render:  # the earliest deadline now: wake the watchdog to sleep less
                self._wake.notify()
        return render

    def disarm(self, render: _Render) -> None:
        with self._lock:  # NOTE: a C lock: no bytecode (so no raise) between acquiring and entering
            render.is_done = True
            if render.is_fired:  # raised already (we are unwinding it), or about to be: drop it
                _raise_in(render.thread_id, None)

    def _run(self) -> None:
        with self._lock:
            while True:
                now = time.monotonic()
                while self._heap and (self._heap[0][2].is_done or self._heap[0][0] <= now):
                    _, _, render = heapq.heappop(self._heap)
                    if not render.is_done:
                        render.is_fired = True
                        _raise_in(render.thread_id, _Timeout)
                self._wake.wait(self._heap[0][0] - now if self._heap else None)


_WATCHDOG = _Watchdog()


# --- size: every value a template makes is bounded

_bound = threading.local()  # the running render's max_chars (renders run on several threads)


def _max_chars() -> int:
    return getattr(_bound, "max_chars", DEFAULT_MAX_CHARS)


def _size(value: Any) -> int:
    """Characters a value holds: a string's length; a container's items', and one per item."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list | tuple | set | frozenset):
        return len(value) + sum(map(_size, value))
    if isinstance(value, dict):
        return len(value) + sum(_size(k) + _size(v) for k, v in value.items())
    if isinstance(value, Namespace):
        return _size(value._Namespace__attrs)
    return 1


def _check_size(num_chars: int, what: str) -> None:
    if num_chars > (limit := _max_chars()):
        raise _TooLargeError(f"{what} would hold more than {limit} characters")


def _checked(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise _TooLargeError(f"an integer of more than {MAX_INT_BITS} bits")
    _check_size(_size(value), "a value")
    return value


def _check_int(value: Any, what: str) -> None:
    if isinstance(value, int) and not isinstance(value, bool):
        _check_size(value, what)


def _check_format(text: Any, args: Any = ()) -> None:
    """A format string's widths and precisions (`%0999999999d`, `{:>999999999}`), and `*` widths among its args."""
    if not isinstance(text, str):
        return
    limit = _max_chars()
    for digits in _DIGITS.findall(text):
        if len(digits) > len(str(limit)) or int(digits) > limit:
            raise _TooLargeError(f"a format width over {limit}")
    for arg in args if isinstance(args, tuple) else (args,):
        _check_int(arg, "a format width")


class _Counted:
    """An iterator a filter or method consumes, its items' characters counted as they come."""

    def __init__(self, items: Iterable[Any]) -> None:
        self._items, self._num_chars = iter(items), 0

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> Any:
        item = next(self._items)
        self._num_chars += _size(item) + 1
        _check_size(self._num_chars, "a sequence")
        return item


def _counted(value: Any) -> Any:
    """A lazy sequence (a generator from `map`, `select`, ...) counted as it is consumed; others as they are."""
    if isinstance(value, Iterator):
        return _Counted(value)
    return value


def _check_join(sep: Any, items: Any) -> Any:
    if isinstance(items, list | tuple):
        _check_size(sum(map(_size, items)) + len(items) * _size(sep), "a join")
        return items
    return _counted(items)


def _check_replace(text: Any, old: Any, new: Any) -> None:
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        _check_size(len(text) + text.count(old) * max(len(new) - len(old), 0), "a replace")


def _check_binop(operator: str, left: Any, right: Any) -> None:
    is_int = isinstance(left, int) and isinstance(right, int)
    if operator == "*" and is_int:
        if left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise _TooLargeError(f"an integer of more than {MAX_INT_BITS} bits")
    elif operator == "*":
        seq, count = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(count, int) and isinstance(seq, str | list | tuple):
            _check_size(_size(seq) * max(count, 0), "a repeat")
    elif operator == "**" and is_int and right > 0:
        if left.bit_length() * right > MAX_INT_BITS:
            raise _TooLargeError(f"an integer of more than {MAX_INT_BITS} bits")
    elif operator == "%":
        _check_format(left, right)
    elif operator == "+" and isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple):
        _check_size(_size(left) + _size(right), "a sum")


def _check_call(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A str method that makes a large string at once, checked before it runs; lazy arguments counted."""
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if isinstance(owner, str):
        if name in ("center", "ljust", "rjust", "zfill") and args:
            _check_int(args[0], f"str.{name}'s width")
        elif name == "expandtabs":
            tab = args[0] if args else kwargs.get("tabsize", 8)
            if isinstance(tab, int):
                _check_size(len(owner) + owner.count("\t") * tab, "str.expandtabs")
        elif name == "replace" and len(args) >= 2:
            _check_replace(owner, args[0], args[1])
        elif name == "join" and args:
            return (_check_join(owner, args[0]), *args[1:])
    return tuple(_counted(a) for a in args)


class _Buffer(list[str]):
    """Where a block, a macro or a `{% set %}` body gathers its output, counted as it grows."""

    def __init__(self) -> None:
        super().__init__()
        self._num_chars = 0

    def append(self, chunk: str) -> None:
        self._count(len(chunk))
        super().append(chunk)

    def extend(self, chunks: Iterable[str]) -> None:
        chunks = tuple(chunks)
        self._count(sum(map(len, chunks)))
        super().extend(chunks)

    def _count(self, num_chars: int) -> None:
        self._num_chars += num_chars
        _check_size(self._num_chars, "a block's output")


class _BoundedNamespace(Namespace):
    """`namespace()`, its attributes checked as they are set (`{% set ns.text = ... %}`)."""

    def __setitem__(self, name: str, value: Any) -> None:
        super().__setitem__(name, value)
        _checked(self)


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "+" and type(left) is str and type(right) is str:  # the common case, kept short
            _check_size(len(left) + len(right), "a sum")
            return left + right
        _check_binop(operator, left, right)
        return _checked(super().call_binop(context, operator, left, right))

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        args = _check_call(obj, args, kwargs)
        return _checked(super().call(context, obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is not None:
            _check_format(value.__self__)
        return wrapped

    output_buffer = _Buffer

    @staticmethod
    def bounded_join(values: tuple[Any, ...]) -> str:
        """`a ~ b ~ c`."""
        parts = [str(v) for v in values]
        _check_size(sum(map(len, parts)), "a concatenation")
        return "".join(parts)


class _BoundedCodeGenerator(CodeGenerator):
    """`~` through the environment's `bounded_join` (jinja writes a plain join of its own); block output into a
    counted buffer (jinja's is a plain list)."""

    def buffer(self, frame: Frame) -> None:
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.output_buffer()")

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:  # noqa: N802 (jinja's visitor names)
        self.write("environment.bounded_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


_BoundedEnvironment.code_generator_class = _BoundedCodeGenerator


def _bounded_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A filter whose arguments are checked before it runs (where one call could make a large value) and
    whose result after."""

    @functools.wraps(fn)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        skip = 1 if hasattr(fn, "jinja_pass_arg") else 0  # the context, eval context or environment
        value, rest = (args[skip], args[skip + 1 :]) if len(args) > skip else (None, ())
        if name == "center" and rest:
            _check_int(rest[0], "center's width")
        elif name == "indent" and isinstance(value, str):
            width = rest[0] if rest else kwargs.get("width", 4)
            pad = width if isinstance(width, int) else _size(width)
            _check_size(len(value) + (value.count("\n") + 1) * pad, "indent")
        elif name == "replace" and len(rest) >= 2:
            _check_replace(value, rest[0], rest[1])
        elif name == "format":
            _check_format(value, rest)
        if name == "join" and len(args) > skip:
            sep = rest[0] if rest else kwargs.get("d", "")
            args = (*args[:skip], _check_join(sep, value), *rest)
        else:
            args = tuple(_counted(a) for a in args)
        return _checked(fn(*args, **kwargs))

    return bounded


# --- the globals and filters transformers gives templates


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks: render the body."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's class attribute)

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """json.dumps without jinja's HTML escaping, non-ASCII kept as-is (transformers' `tojson`)."""
    if indent is not None and (indent if isinstance(indent, int) else len(str(indent))) > MAX_JSON_INDENT:
        raise _TooLargeError(f"tojson's indent over {MAX_JSON_INDENT}")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> _BoundedEnvironment:
    env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters = {name: _bounded_filter(name, fn) for name, fn in env.filters.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _BoundedNamespace
    del env.globals["lipsum"]  # paragraphs by the thousand, and no chat template's
    return env
