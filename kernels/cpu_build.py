"""Build the compiled CPU kernels ahead of time: `python -m infer.kernels.cpu_build`.

Run by `make setup` (and `make test`) after the package is installed, against
the virtual environment's torch (pip's isolated build would pull another
torch). A no-op when the library for these sources and this CPU exists. When
the build fails (no compiler), it says so and exits 0: the PyTorch references
run instead. `--strict` makes a failure exit 1.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from infer.kernels import cpu


def compile_flags(flags: frozenset[str]) -> list[str]:
    """-O3 for this machine's ISA; 512-bit vectors where AVX-512 exists (GCC prefers 256 otherwise)."""
    extra = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-DNDEBUG"]
    return extra + (["-mprefer-vector-width=512"] if "avx512f" in flags else [])


def build(verbose: bool = False) -> Path:
    """Compile the sources into `cpu.library_path()` and return that path."""
    from torch.utils import cpp_extension

    target = cpu.library_path()
    work = target.parent / "build"
    work.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(
        name=cpu.LIBRARY_NAME,
        sources=[str(cpu.CSRC_DIR / s) for s in cpu.SOURCES],
        extra_cflags=compile_flags(cpu.cpu_flags()),
        extra_ldflags=["-fopenmp"],
        build_directory=str(work),
        is_python_module=False,
        verbose=verbose,
    )
    shutil.copyfile(work / f"{cpu.LIBRARY_NAME}.so", target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strict", action="store_true", help="exit 1 when the build fails")
    parser.add_argument("--verbose", action="store_true", help="show the compiler's commands")
    args = parser.parse_args(argv)
    target = cpu.library_path()
    if target.is_file():
        print(f"compiled CPU kernels: up to date ({target})")
        return 0
    start = time.perf_counter()
    print(f"compiled CPU kernels: building {target} (a minute or two) ...", flush=True)
    try:
        build(args.verbose)
    except Exception as e:  # any build failure: the references run
        print(f"compiled CPU kernels: build failed ({type(e).__name__}: {e}); the PyTorch references will run")
        return 1 if args.strict else 0
    print(f"compiled CPU kernels: built in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
