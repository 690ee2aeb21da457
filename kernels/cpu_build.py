"""Build the compiled CPU kernels ahead of time: `python -m infer.kernels.cpu_build`.

Run by `make setup` (and `make test`) after the package is installed, against
the virtual environment's torch (pip's isolated build would pull another
torch). By default it builds for this machine's CPU (`-march=native`);
`--portable` builds one library per x86-64 feature level instead (`cpu.LEVELS`),
for an image or a shared disk whose CPU is not known at build time. A no-op for
each library that exists already. When a build fails (no compiler), it says so
and exits 0: the PyTorch references run instead. `--strict` makes a failure
exit 1.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from infer.kernels import cpu

NATIVE = "native"


def compile_flags(target: str, flags: frozenset[str]) -> list[str]:
    """-O3 for the target ISA; 512-bit vectors where AVX-512 is there (GCC prefers 256 otherwise)."""
    common = ["-O3", "-fopenmp", "-fno-math-errno", "-DNDEBUG"]
    if target == NATIVE:
        return [*common, "-march=native", *(["-mprefer-vector-width=512"] if "avx512f" in flags else [])]
    level = _level(target)
    wide = "avx512f" in level.required_flags
    return [*common, *level.cflags, *(["-mprefer-vector-width=512"] if wide else [])]


def _level(name: str) -> cpu.Level:
    return next(lv for lv in cpu.LEVELS if lv.name == name)


def _target_path(target: str) -> Path:
    return cpu.library_path() if target == NATIVE else cpu.library_path(_level(target))


def build(target: str = NATIVE, verbose: bool = False) -> Path:
    """Compile the sources for `target` (native, or a level's name) into its library path; return the path.

    NOTE: torch's extension loader also loads what it built, and the ops register once per process: call this
    in a fresh process per target (`main` does).
    """
    from torch.utils import cpp_extension

    path = _target_path(target)
    work = path.parent / "build"
    work.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(
        name=cpu.LIBRARY_NAME,
        sources=[str(cpu.CSRC_DIR / s) for s in cpu.SOURCES],
        extra_cflags=compile_flags(target, cpu.cpu_flags()),
        extra_ldflags=["-fopenmp"],
        build_directory=str(work),
        is_python_module=False,
        verbose=verbose,
    )
    shutil.copyfile(work / f"{cpu.LIBRARY_NAME}.so", path)
    shutil.rmtree(work, ignore_errors=True)
    return path


def _build_in_child(target: str, verbose: bool) -> str | None:
    """Build one target in a fresh interpreter; None on success, else the reason it failed."""
    argv = [sys.executable, "-m", "infer.kernels.cpu_build", "--only", target, *(["--verbose"] if verbose else [])]
    run = subprocess.run(argv, capture_output=not verbose, text=True)
    if run.returncode == 0:
        return None
    lines = (run.stderr or "").strip().splitlines()
    return lines[-1] if lines else f"exit status {run.returncode}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--portable", action="store_true", help="one library per x86-64 level, not -march=native")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a build fails")
    parser.add_argument("--verbose", action="store_true", help="show the compiler's commands")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # one target, in this process (used by the parent)
    args = parser.parse_args(argv)
    if args.only:
        build(args.only, args.verbose)
        return 0
    targets = [lv.name for lv in cpu.portable_levels()] if args.portable else [NATIVE]
    if not targets:
        print("compiled CPU kernels: no portable levels for this architecture; the PyTorch references will run")
    failed = 0
    for target in targets:
        path = _target_path(target)
        if path.is_file():
            print(f"compiled CPU kernels ({target}): up to date ({path})")
            continue
        start = time.perf_counter()
        print(f"compiled CPU kernels ({target}): building {path} (a minute or two) ...", flush=True)
        problem = _build_in_child(target, args.verbose)
        if problem is None:
            print(f"compiled CPU kernels ({target}): built in {time.perf_counter() - start:.0f} s")
        else:
            failed += 1
            print(f"compiled CPU kernels ({target}): build failed ({problem}); the PyTorch references will run")
    return 1 if failed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
