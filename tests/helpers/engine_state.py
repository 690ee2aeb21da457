"""What a test on another thread may ask a running engine core: only its published snapshot and its inbox."""

from __future__ import annotations

from infer.engine.core import EngineCore


def is_idle(core: EngineCore) -> bool:
    """No request accepted, waiting or running, and no KV block in use, as of the last published step."""
    s = core.stats()
    return s.num_waiting == s.num_running == s.num_blocks_used == 0
