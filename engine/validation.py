"""One way to reject bad input: a ValueError that names the field."""


def check(field: str, ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"{field}: {message}")
