"""The grammar trial worker: a process of its own (`python -m infer.engine.structured.grammar_worker`) that
compiles each constraint it is sent in a child forked for that one compile, and says how it went.

It imports xgrammar once (~2 s, ~270 MB); a trial is a fork (~40 ms) whose compile runs at normal priority for
its first CHEAP_COMPILE_CPU_S of CPU time (most compiles take a few milliseconds), then at nice 19, and which
exits once it has used its CPU-time budget, or is killed when the server gives up on it. One JSON
object a line, in: {"id", "tokenizer", "kind", "text", "budget_s"} ("tokenizer_json" too, the first time a
tokenizer is named) or {"kill": id}; out: {"ready"} once, then {"id", "trial", "cpu_s"}. It exits when the
server closes its stdin.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import select
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from infer.engine.structured.grammar_budget import CHEAP_COMPILE_CPU_S, Trial, lower_priority

if TYPE_CHECKING:
    import xgrammar as xgr

OVER_BUDGET_EXIT = 75  # a trial's exit status when its compile used its budget
WATCH_INTERVAL_S = 0.005  # how often a trial checks its CPU time, and the worker its trials


def main() -> None:
    # NOTE: at normal priority: a trial forked from a process at nice 19 could not raise its own
    import xgrammar  # noqa: F401  (once, here: each trial forks with it loaded)

    os.write(sys.stdout.fileno(), json.dumps({"ready": True}).encode() + b"\n")

    backends: dict[str, xgr.GrammarCompiler] = {}
    trials: dict[int, tuple[int, float]] = {}  # pid -> (id, budget_s)
    buffer = b""
    stdin = sys.stdin.fileno()
    try:
        while True:
            readable, _, _ = select.select([stdin], [], [], WATCH_INTERVAL_S if trials else None)
            if readable:
                chunk = os.read(stdin, 1 << 16)
                if not chunk:
                    return  # the server is gone
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    _handle(json.loads(line), backends, trials)
            _reap(trials)
    finally:
        for pid in trials:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _handle(
    message: dict[str, Any], backends: dict[str, xgr.GrammarCompiler], trials: dict[int, tuple[int, float]]
) -> None:
    if "kill" in message:
        for pid, (job_id, _) in trials.items():
            if job_id == message["kill"]:
                os.kill(pid, signal.SIGKILL)
        return
    import xgrammar as xgr

    key = message["tokenizer"]
    if key not in backends:
        info = xgr.TokenizerInfo.deserialize_json(message["tokenizer_json"])
        backends[key] = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    # NOTE: xgrammar's import leaves a native thread idle; the fork copies this thread alone, which is all it uses
    pid = os.fork()
    if pid == 0:
        _trial(backends[key], message["kind"], message["text"], float(message["budget_s"]))
    trials[pid] = (int(message["id"]), float(message["budget_s"]))


def _trial(backend: xgr.GrammarCompiler, kind: str, text: str, budget_s: float) -> None:
    """In the forked child: compile, then exit; exit OVER_BUDGET_EXIT as soon as it has used budget_s of CPU
    time (and the kernel's CPU limit, a second on, kills it if the watch cannot)."""
    status = 1
    try:
        limit_s = math.ceil(budget_s) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (limit_s, limit_s + 1))
        threading.Thread(target=_watch, args=(budget_s, threading.get_native_id()), daemon=True).start()
        from infer.engine.structured.compiler import _compile
        from infer.engine.structured.constraint import Constraint

        with contextlib.suppress(Exception):  # NOTE: the server's own compile fails the same way and says how
            _compile(backend, Constraint.of(kind, text))
        status = 0
    finally:
        os._exit(status)


def _watch(budget_s: float, compiling_tid: int) -> None:
    """The compiling thread to nice 19 past CHEAP_COMPILE_CPU_S; the process ended past budget_s."""
    while time.process_time() <= CHEAP_COMPILE_CPU_S:
        time.sleep(WATCH_INTERVAL_S)
    lower_priority(compiling_tid)
    while time.process_time() <= budget_s:
        time.sleep(WATCH_INTERVAL_S)
    os._exit(OVER_BUDGET_EXIT)


def _reap(trials: dict[int, tuple[int, float]]) -> None:
    for pid, (job_id, budget_s) in list(trials.items()):
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done == 0:
            continue
        del trials[pid]
        cpu_s = usage.ru_utime + usage.ru_stime
        answer = {"id": job_id, "trial": _outcome(status, cpu_s, budget_s).value, "cpu_s": cpu_s}
        os.write(sys.stdout.fileno(), json.dumps(answer).encode() + b"\n")


def _outcome(status: int, cpu_s: float, budget_s: float) -> Trial:
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
        return Trial.OVER_BUDGET
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) not in (0, OVER_BUDGET_EXIT):
        return Trial.CRASHED
    return Trial.OVER_BUDGET if os.WEXITSTATUS(status) == OVER_BUDGET_EXIT or cpu_s > budget_s else Trial.FINISHED


if __name__ == "__main__":
    main()
