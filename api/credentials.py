"""The files both doors read: a TLS file, and a file of API keys (one a line). The server (`infer serve`,
`infer gateway`) and the clients (`infer client --api-key-file`) read them alike."""

from __future__ import annotations

from pathlib import Path


def read_file(path: str, what: str) -> bytes:
    """The bytes of a TLS or keys file; OSError naming the setting when it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise OSError(f"{what}: cannot read {path}: {e.strerror or e}") from None


def read_keys(path: str, what: str) -> list[str]:
    """The API keys of a keys file: one a line; blank lines and `#` comments skipped; ValueError when none."""
    lines = [line.strip() for line in read_file(path, what).decode("utf-8").splitlines()]
    keys = [line for line in lines if line and not line.startswith("#")]
    if not keys:
        raise ValueError(f"{what}: no key in {path}")
    return keys
