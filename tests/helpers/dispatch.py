"""Counting what a forward pass does at the dispatcher: the tensors it makes and the values it waits for."""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class Allocations(TorchDispatchMode):
    """Counts the ops that make a tensor from host data (a Python value or list, a copy from another device) in
    `made`, and the ones that wait for a value on the host (a synchronisation on a GPU) in `waited`: what a
    step captured in a CUDA graph must not do (a graph replays neither; the intermediate tensors a forward
    pass makes on the device are fine: the graph's pool holds them at the same addresses every replay)."""

    FACTORIES = ("scalar_tensor", "lift_fresh", "lift_fresh_copy")
    SYNCS = ("_local_scalar_dense", "is_nonzero", "item", "equal", "nonzero")

    def __init__(self) -> None:
        super().__init__()
        self.made: list[str] = []
        self.waited: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if name in self.FACTORIES:
            self.made.append(str(func))
        if name == "_to_copy" and kwargs and kwargs.get("device") not in (None, args[0].device):
            self.made.append(str(func))
        if name == "copy_" and args[1].device != args[0].device:
            self.made.append(str(func))
        if name in self.SYNCS:
            self.waited.append(str(func))
        return func(*args, **(kwargs or {}))
