"""What a grammar compile may cost: a trial in a worker process under a CPU-time budget, and refusals.

xgrammar's compile is C++ that cannot be stopped, and its time grows faster than the constraint: a 63.7 KB
JSON schema of 1,800 integer properties took ~68 s. So the compiler first tries each constraint in the trial
worker (`grammar_worker`), a process that compiles it in a child of its own, killed once that compile has
used `budget_s` of CPU time, or once no caller waits for it. Only a constraint whose trial finished is
compiled in the server. A compile (trial or not) runs at normal priority for its first CHEAP_COMPILE_CPU_S of
CPU time, then at nice 19: a small schema compiles in milliseconds even while the engine decodes on every
core, and a large one takes from decoding ~1.5% of a core (a nice-0 thread weighs 1024, a nice-19 one 15).

NOTE: the trial's compiled grammar is not sent back: its JSON form grows with the square of the schema (600
integer properties: 123 MB, 13 s to write, for a grammar that compiles in 0.2 s), so compiling it again costs
less than the copy. CPU time, not wall time, is the budget: a trial that waits for busy cores is not refused
for it, and a refusal is the same on every try (the compiler remembers it).
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import itertools
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from infer.engine.validation import InvalidInput, QueueFullError

if TYPE_CHECKING:
    from infer.engine.structured.constraint import Constraint

logger = logging.getLogger(__name__)

MAX_REFUSED = 4096  # constraints refused for their cost, remembered by digest
START_TIMEOUT_S = 120.0  # for the worker's import of xgrammar (~2 s)
POLL_INTERVAL_S = 0.05  # how often a thread waiting for a trial asks whether it is still wanted
# NOTE: most compiles take a few ms; a compile gets this much CPU at normal priority, then only nice 19
CHEAP_COMPILE_CPU_S = 0.1


class Trial(enum.Enum):
    FINISHED = "finished"  # compiled, or failed to: the server's own compile says how
    OVER_BUDGET = "over budget"  # killed at its CPU-time budget
    CRASHED = "crashed"  # the compile died: compiling it in the server would take the server down
    NO_ANSWER = "no answer"  # none within the wall-clock limit: not the constraint's fault
    DROPPED = "dropped"  # given up: no caller waits for it any more, or the compiler stopped


class CompileRefused(InvalidInput):
    """A constraint refused for what compiling it costs (CPU time, a crash): remembered, never tried again."""


class CompileDroppedError(RuntimeError):
    """No caller waited for the compile any more (or the compiler stopped): given up, not remembered."""


def refusal(kind: str, trial: Trial, budget_s: float, wall_limit_s: float) -> Exception:
    """The error of a trial that did not finish: CompileRefused; QueueFullError when the worker gave no
    answer (busy: try again later); CompileDroppedError."""
    if trial is Trial.DROPPED:
        return CompileDroppedError(f"{kind}: compile given up: no caller waits for it")
    if trial is Trial.NO_ANSWER:
        return QueueFullError(f"grammar compiles are too slow now: no answer in {wall_limit_s:.0f} s")
    if trial is Trial.CRASHED:
        return CompileRefused(kind, "does not compile: the grammar compiler crashed on it")
    return CompileRefused(kind, f"does not compile within {budget_s:g} s of CPU time (grammar_compile_budget_s)")


class Refusals:
    """The constraints refused for their cost, by digest of (kind, text), the oldest forgotten first."""

    def __init__(self) -> None:
        self._errors: OrderedDict[bytes, CompileRefused] = OrderedDict()

    def get(self, constraint: Constraint) -> CompileRefused | None:
        return self._errors.get(_digest(constraint))

    def add(self, constraint: Constraint, error: CompileRefused) -> None:
        self._errors[_digest(constraint)] = error
        while len(self._errors) > MAX_REFUSED:
            self._errors.popitem(last=False)


def _digest(constraint: Constraint) -> bytes:
    return hashlib.sha256(f"{constraint.kind}\0{constraint.text}".encode()).digest()


@dataclass(frozen=True)
class CompileStats:
    num_pending: int  # compiles queued or running (what max_pending_grammars bounds)
    num_compiled_total: int  # compiles run, whatever their outcome
    num_refused_total: int  # constraints refused for their cost (CPU time, a crash)
    compile_s_total: float  # the compiles' time, trial included


def lower_priority(tid: int | None = None) -> None:
    """A thread (the calling one by default; Linux schedules threads, not processes) to nice 19, for good."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id() if tid is None else tid, 19)


@dataclass(frozen=True)
class TrialTokenizer:
    """The vocabulary a trial compiles for, as xgrammar's JSON, and its digest (sent once per worker)."""

    json: str = field(repr=False)
    key: str

    @classmethod
    def of(cls, tokenizer_json: str) -> TrialTokenizer:
        return cls(tokenizer_json, hashlib.sha256(tokenizer_json.encode()).hexdigest()[:16])


@dataclass
class _Job:
    done: threading.Event = field(default_factory=threading.Event)
    trial: Trial = Trial.NO_ANSWER
    cpu_s: float = 0.0


class TrialWorker:
    """The worker process, shared by every compiler of this process: started on first use, and again after
    it dies. Thread-safe; `run` blocks its caller (a compile thread) until the trial is done."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._tokenizers: set[str] = set()  # those the running process has been sent
        self._jobs: dict[int, _Job] = {}
        self._ready = threading.Event()  # the running process has imported xgrammar
        self._ids = itertools.count()

    def run(
        self, constraint: Constraint, tokenizer: TrialTokenizer, budget_s: float, wall_limit_s: float,
        is_wanted: Callable[[], bool],
    ) -> tuple[Trial, float]:  # fmt: skip
        """The trial's outcome and CPU seconds; DROPPED as soon as `is_wanted()` turns False."""
        job_id, job = next(self._ids), _Job()
        message = {"id": job_id, "tokenizer": tokenizer.key, "kind": str(constraint.kind), "text": constraint.text,
                   "budget_s": budget_s}  # fmt: skip
        with self._lock:
            stdin = self._stdin()
            if tokenizer.key not in self._tokenizers:
                message["tokenizer_json"] = tokenizer.json
                self._tokenizers.add(tokenizer.key)
            self._jobs[job_id] = job
            try:
                _send(stdin, message)
            except OSError:  # the process died after it was checked: its reader ends the job (no answer)
                logger.warning("the grammar trial worker is gone; it starts again on the next compile")
        deadline_s = time.monotonic() + wall_limit_s
        while not job.done.wait(POLL_INTERVAL_S):
            if not is_wanted() or time.monotonic() > deadline_s:
                self._give_up(job_id)
                return (Trial.DROPPED if not is_wanted() else Trial.NO_ANSWER), 0.0
        return job.trial, job.cpu_s

    @property
    def pid(self) -> int | None:
        """The running process's id; None before it starts."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def warm(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the process now (else the first trial does), and wait until it has imported xgrammar."""
        with self._lock:
            self._stdin()
            ready = self._ready
        ready.wait(timeout_s)

    def _stdin(self) -> IO[bytes]:
        """The running process's stdin: started now unless it runs."""
        if self._process is None or self._process.poll() is not None:
            self._tokenizers.clear()
            self._ready = threading.Event()
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            self._process = subprocess.Popen(
                [sys.executable, "-m", "infer.engine.structured.grammar_worker"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, env=env,
            )  # fmt: skip
            reader = threading.Thread(target=self._read, args=(self._process, self._ready), name="infer-grammar-trials",
                                      daemon=True)  # fmt: skip
            reader.start()
        assert self._process.stdin is not None
        return self._process.stdin

    def _read(self, process: subprocess.Popen[bytes], ready: threading.Event) -> None:
        """The process's answers to the jobs that wait; when it exits, the jobs it had get no answer."""
        assert process.stdout is not None
        for line in process.stdout:
            answer = json.loads(line)
            if answer.get("ready"):
                ready.set()
                continue
            with self._lock:
                job = self._jobs.pop(answer["id"], None)
            if job is not None:
                job.trial, job.cpu_s = Trial(answer["trial"]), float(answer["cpu_s"])
                job.done.set()
        process.wait()
        ready.set()  # NOTE: one waiting in `warm` need not wait for a process that is gone
        logger.warning("the grammar trial worker exited (status %s)", process.returncode)
        with self._lock:
            if self._process is process:
                for job in self._jobs.values():
                    job.done.set()
                self._jobs.clear()

    def _give_up(self, job_id: int) -> None:
        with self._lock:
            if self._jobs.pop(job_id, None) is not None and self._process is not None:
                with contextlib.suppress(OSError):
                    _send(self._process.stdin, {"kill": job_id})


def _send(stdin: IO[bytes] | None, message: dict[str, object]) -> None:
    assert stdin is not None
    stdin.write(json.dumps(message).encode() + b"\n")
    stdin.flush()


_worker = TrialWorker()


def trial_worker() -> TrialWorker:
    """The process's trial worker (one for all its compilers: one xgrammar import, one process)."""
    return _worker
