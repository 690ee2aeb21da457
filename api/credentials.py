"""The files both doors read: a TLS file, and a file of API keys (one a line, `name: key` to name its tenant).
The server (`infer serve`, `infer gateway`) and the clients (`infer client --api-key-file`) read them alike."""

from __future__ import annotations

from pathlib import Path


def read_file(path: str, what: str) -> bytes:
    """The bytes of a TLS or keys file; OSError naming the setting when it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise OSError(f"{what}: cannot read {path}: {e.strerror or e}") from None


def read_named_keys(path: str, what: str) -> list[tuple[str | None, str]]:
    """The (name, key) pairs of a keys file: a line is a key, or `name: key` (a name, a colon, whitespace, the
    key; keys hold no whitespace, so a one-word line is always a key, colons and all); blank lines and `#`
    comments skipped. ValueError naming the line (never its key) when one is neither, or when none is given."""
    pairs: list[tuple[str | None, str]] = []
    for number, line in enumerate(read_file(path, what).decode("utf-8").splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) == 1:
            pairs.append((None, words[0]))
        elif len(words) == 2 and len(words[0]) > 1 and words[0].endswith(":"):
            pairs.append((words[0][:-1], words[1]))
        else:
            raise ValueError(f"{what}: {path} line {number}: expected a key, or 'name: key'")
    if not pairs:
        raise ValueError(f"{what}: no key in {path}")
    return pairs


def read_keys(path: str, what: str) -> list[str]:
    """The API keys of a keys file (`read_named_keys`), without their names."""
    return [key for _, key in read_named_keys(path, what)]
