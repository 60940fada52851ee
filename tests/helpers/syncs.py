"""A CPU stand-in for CUDA's sync debug mode: the operations that make the host wait for a GPU fail where they run."""

from __future__ import annotations

import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
#: Operations whose result's size or value the host reads: on a GPU each waits for every kernel queued before it.
SYNCING = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default, aten.is_nonzero.default,
           aten._unique2.default, aten.unique_consecutive.default, aten.repeat_interleave.Tensor}


class NoHostSync(TorchDispatchMode):
    """Raise on any operation that would synchronise a GPU with the host (``.item()``, ``bool(t)``, ``nonzero``,
    boolean-mask indexing, ``unique``), on whatever device the tensors are; except those called from a file named in
    ``allowed`` (another library's own), which are counted in ``allowed_syncs``."""

    def __init__(self, allowed: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.allowed = allowed
        self.allowed_syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        masks = func is aten.index.Tensor and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else []))
        if func in SYNCING or masks:
            where = [f"{frame.filename}:{frame.lineno}" for frame in traceback.extract_stack()]
            if not any(name in place for name in self.allowed for place in where):
                raise AssertionError(f"{func} reads a device value on the host: a GPU would synchronise here")
            self.allowed_syncs.append(str(func))
        return func(*args, **kwargs)
