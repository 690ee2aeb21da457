"""What the process's environment says about the kernels, read by the backend and the kernels alike: a leaf (it
imports no other kernel module), so a kernel module can ask without importing the backend that imports it."""

from __future__ import annotations

import os

_TRUE = ("1", "true", "yes", "on", "y")


def is_interpreted() -> bool:
    """True when Triton kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in _TRUE
