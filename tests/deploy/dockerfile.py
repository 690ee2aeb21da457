"""A reader of the repository's Dockerfile: instructions by stage, ARG defaults, ENV, exec-form commands."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from tests.deploy.chart import REPO

DOCKERFILE = REPO / "Dockerfile"
_VARIABLE = re.compile(r"\$\{?(\w+)\}?")


@dataclass(frozen=True)
class Instruction:
    stage: str  # the stage's name ("" before the first FROM)
    keyword: str  # upper case: FROM, RUN, ENV, ...
    args: str


def _logical_lines(text: str) -> list[str]:
    """Lines with their `\\` continuations joined; comments and blank lines dropped."""
    lines, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    return lines


def instructions(path: Path = DOCKERFILE) -> list[Instruction]:
    stage, found = "", list[Instruction]()
    for line in _logical_lines(path.read_text()):
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = args.split()
            stage = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else str(len(found))
        found.append(Instruction(stage, keyword, args.strip()))
    return found


def of(stage: str, keyword: str, path: Path = DOCKERFILE) -> list[str]:
    return [i.args for i in instructions(path) if i.stage == stage and i.keyword == keyword]


def arg_defaults(stage: str) -> dict[str, str]:
    """ARG defaults visible in a stage: the global ones, then the stage's own."""
    defaults: dict[str, str] = {}
    for i in instructions():
        if i.keyword == "ARG" and i.stage in ("", stage) and "=" in i.args:
            name, _, value = i.args.partition("=")
            defaults[name] = value.strip('"')
    return defaults


def stage_env(stage: str) -> dict[str, str]:
    """The stage's ENV, with ARG defaults and earlier variables substituted (PATH keeps `$PATH` unexpanded)."""
    known, env = arg_defaults(stage), {}
    for args in of(stage, "ENV"):
        for item in shlex.split(args):
            name, _, value = item.partition("=")
            env[name] = _VARIABLE.sub(lambda m: known.get(m[1], m[0]), value)
    return env


def index_of(stage: str, keyword: str, needle: str) -> int:
    """Where the stage's first `keyword` instruction containing `needle` is among all instructions (-1: none)."""
    for n, i in enumerate(instructions()):
        if i.stage == stage and i.keyword == keyword and needle in i.args:
            return n
    return -1


def exec_form(stage: str, keyword: str) -> list[str]:
    """The JSON array of the stage's last CMD / ENTRYPOINT (HEALTHCHECK: the part after CMD)."""
    args = of(stage, keyword)[-1]
    if keyword == "HEALTHCHECK":
        args = args.split(" CMD ", 1)[1]
    command: list[str] = json.loads(args)
    return command
