"""`make test-mutants`: deliberate bugs that the invariance and parity tests must catch (issue 28, finding 9).

Each mutant is one documented edit of the source (a string replaced once) and the tests it must turn red.
For each: the tree (tracked files and new ones not ignored) is copied into a temporary folder, the edit is
applied there, an `infer` import root is laid over that copy (as `make typecheck` does), and pytest runs the
named tests from it; a mutant of `kernels/csrc` first builds its own compiled kernels into a cache of its own
(`INFER_KERNEL_CACHE`), so neither the checkout nor its kernel cache ever sees a mutation. A mutant is killed
when its tests fail; it survives when they pass. Exit status 1 if any survives (or could not be tried).

    .venv/bin/python tests/mutants/run.py [--ref HEAD] [NAME ...]   # all mutants, or the named ones
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUBPACKAGES = ("api", "engine", "kernels", "server", "clients")  # pyproject.toml's package-dir: infer.<name>
# built mutant kernels, kept between runs (a build's tag hashes its sources: a changed mutant builds anew)
MUTANT_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "infer" / "kernel-mutants"


@dataclass(frozen=True)
class Mutant:
    name: str
    why: str  # the bug it stands for
    path: str  # the file edited, relative to the checkout
    old: str  # replaced once; a mutant whose `old` is gone is stale, and reported so
    new: str
    tests: tuple[str, ...]  # pytest node ids (or files) that must fail

    @property
    def is_kernel(self) -> bool:
        return self.path.startswith("kernels/csrc/")


MUTANTS = (
    Mutant(
        "dense-full-tile-ulp",
        "dense fp32 linear: every output of a full 4-row tile one ulp up, so a row alone differs from the same "
        "row among 8 (issue 28's mutation; the row under test used to sit in a leftover tile only)",
        "kernels/csrc/dense_linear.cpp",
        "  for (int r = 0; r < R; ++r)\n"
        "    for (int c = 0; c < kChannels; ++c) finish(P, acc[r][c], m0 + r, n0 + c, k_vec);\n"
        "}\n#endif\n\n#if defined(__AVX512F__) && defined(__AVX512BF16__)",
        "  for (int r = 0; r < R; ++r)\n"
        "    for (int c = 0; c < kChannels; ++c) finish(P, acc[r][c], m0 + r, n0 + c, k_vec);\n"
        "  if (R == kRows)\n"
        "    for (int r = 0; r < R; ++r)\n"
        "      for (int c = 0; c < kChannels; ++c) {\n"
        "        float& y = P.y[(m0 + r) * P.N + n0 + c];\n"
        "        y = std::nextafter(y, INFINITY);\n"
        "      }\n"
        "}\n#endif\n\n#if defined(__AVX512F__) && defined(__AVX512BF16__)",
        ("tests/unit/kernels/test_batch_invariance.py::test_linear_rows_do_not_depend_on_the_row_count",),
    ),
    Mutant(
        "int4-full-tile-ulp",
        "int4 and int5 linear: the first channel of each row of a full 8-row tile one ulp up",
        "kernels/csrc/int4_linear.cpp",
        "      case 8: tile<Scale, Bits, 8>(P, strip, m0, n0); break;",
        "      case 8:\n"
        "        tile<Scale, Bits, 8>(P, strip, m0, n0);\n"
        "        for (int64_t r = 0; r < 8; ++r) P.y[(m0 + r) * P.N + n0] = std::nextafter(P.y[(m0 + r) * P.N + n0], "
        "INFINITY);\n"
        "        break;",
        ("tests/unit/kernels/test_batch_invariance.py::test_linear_rows_do_not_depend_on_the_row_count",),
    ),
    Mutant(
        "attention-every-fourth-sequence",
        "paged attention: the output of every fourth sequence of a call (index 3, 7, ...) one ulp off, as a kernel "
        "that grouped sequences by 4 could (the decode under test used to sit at index 6, 8 or 32 only)",
        "kernels/csrc/paged_attention.cpp",
        "    scale_in_place(1.f / S.l[r], acc, D);",
        "    scale_in_place(w.seq % 4 == 3 ? std::nextafter(1.f / S.l[r], 2.f / S.l[r]) : 1.f / S.l[r], acc, D);",
        ("tests/unit/kernels/test_batch_invariance.py::test_attention_rows_do_not_depend_on_the_batch",),
    ),
    Mutant(
        "engine-batched-logprob-ulp",
        "sampler: a sampled token's logprob one ulp off in every row but the first of a step, so a request's "
        "logprobs move with its batch while its tokens do not",
        "engine/sampler.py",
        "        out.append(TokenLogprob(token_ids[i], float(logprobs[i, token_ids[i]]), top))",
        "        lp = logprobs[i, token_ids[i]]\n"
        "        lp = torch.nextafter(lp, torch.zeros_like(lp)) if i > 0 else lp\n"
        "        out.append(TokenLogprob(token_ids[i], float(lp), top))",
        ("tests/unit/engine/test_core_invariance.py::test_tokens_equal_alone[fp32-batched]",),
    ),
    Mutant(
        "int6-top-bit-shift",
        "int6 linear (AVX-512): the top bits of codes 4..7 of each group of eight shifted one bit off",
        "kernels/csrc/int6_linear.cpp",
        "_mm512_and_si512(_mm512_slli_epi32(t, 2), top)",
        "_mm512_and_si512(_mm512_slli_epi32(t, 3), top)",
        ("tests/unit/kernels/test_int6_cpu.py",),
    ),
)


def copy_tree(dest: Path, ref: str | None = None) -> None:
    """The checkout's tracked files and new ones not ignored (work in progress included), or a commit's files."""
    if ref is not None:
        archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    else:
        listing = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, check=True,
        )  # fmt: skip
        for name in filter(None, listing.stdout.decode().split("\0")):
            source = ROOT / name
            if source.is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, dest / name)
    for name in SUBPACKAGES:  # the `infer` import root over the copy: pytest's pythonpath "." finds it first
        (dest / "infer" / name).symlink_to(Path("..") / name)


def mutate(tree: Path, mutant: Mutant) -> None:
    path = tree / mutant.path
    text = path.read_text()
    if text.count(mutant.old) != 1:
        raise RuntimeError(f"stale mutant: {mutant.path} no longer holds its text once ({text.count(mutant.old)})")
    path.write_text(text.replace(mutant.old, mutant.new))


def run(tree: Path, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)


def try_mutant(mutant: Mutant, ref: str | None) -> tuple[str, str]:
    """(killed | survived | error, detail)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "INFER_KERNELS")}
    with tempfile.TemporaryDirectory(prefix=f"infer-mutant-{mutant.name}-") as tmp:
        tree = Path(tmp)
        copy_tree(tree, ref)
        mutate(tree, mutant)
        if mutant.is_kernel:
            env["INFER_KERNEL_CACHE"] = str(MUTANT_CACHE)
            build = run(tree, [sys.executable, "-m", "infer.kernels.cpu_build", "--strict"], env)
            if build.returncode != 0:
                return "error", "the mutant's kernels did not build: " + (build.stdout + build.stderr)[-2000:]
        check = [sys.executable, "-c", "import infer.kernels.cpu as c; print(c.CSRC_DIR)"]
        where = run(tree, check, env).stdout.strip()
        if not where.startswith(str(tree)):
            return "error", f"infer imported from {where or '?'}, not the mutant's copy"
        pytest = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-rf", *mutant.tests]
        tests = run(tree, pytest, env)
        lines = tests.stdout.splitlines()
        tail = "\n".join(lines[-15:])
        if tests.returncode == 1 and " error" not in lines[-1]:  # failed assertions, not a broken setup
            return "killed", "\n".join(line for line in lines if line.startswith("FAILED"))
        if tests.returncode == 0:
            return "survived", tail
        return "error", f"pytest exit status {tests.returncode}\n{tail}\n{tests.stderr[-1000:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="mutants to try (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--ref", help="mutate a commit's files (e.g. HEAD), not the working tree's")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    if args.list or not chosen:
        for m in MUTANTS:
            print(f"{m.name}: {m.why}\n    {m.path}; must fail: {' '.join(m.tests)}")
        return 0 if args.list else 2
    outcomes = []
    for mutant in chosen:
        started = time.monotonic()
        print(f"mutant {mutant.name} ({mutant.path}) ...", flush=True)
        outcome, detail = try_mutant(mutant, args.ref)
        outcomes.append(outcome)
        print(f"mutant {mutant.name}: {outcome} in {time.monotonic() - started:.0f} s")
        print(detail)
    print(f"{outcomes.count('killed')} of {len(chosen)} mutants killed")
    return 0 if all(o == "killed" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
