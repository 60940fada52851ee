"""PyTorch files read as tensors and plain data, and values made plain data: what lit-embed unpickles is never an
object whose loading runs code (``torch.load(weights_only=True)``), and what it saves is only tensors and plain data.

Below everything that reads a ``.ckpt`` or ``.bin`` (:mod:`lit_embed.checkpoints.format`, a strategy's pretrained matrix).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from typing import Any

import numpy as np
import torch

from lit_embed.errors import CheckpointError, pickled_type


def load_plain(path: str | os.PathLike, what: str) -> Any:
    """What the PyTorch file at ``path`` holds, as tensors and plain data (``weights_only=True``: nothing in it runs);
    a file holding Python objects, or a corrupt one, is refused naming it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        found = pickled_type(error)
        if found is None:
            raise CheckpointError(
                f"{what} {str(path)!r} is not a readable checkpoint (it is corrupt, or not a PyTorch file): use another"
            ) from None
        raise CheckpointError(
            f"{what} {str(path)!r} holds a Python object of type {found}, which lit-embed does not load: "
            f"unpickling it could run code. If you trust where it came from, rewrite it as plain data once with "
            f"`lit-embed convert --trust {path} NEW.ckpt` and use NEW.ckpt"
        ) from None
    except Exception as error:  # whatever a damaged file makes the reader trip over
        reason = str(error).splitlines()[0].split(". ")[0][:160] if str(error) else type(error).__name__
        raise CheckpointError(
            f"{what} {str(path)!r} is truncated or corrupt ({reason}): a copy cut short? use another one"
        ) from None


def plain(value: Any) -> Any:
    """``value`` as tensors and plain data (dataclasses and namespaces as dicts, arrays as tensors)."""
    if isinstance(value, torch.Tensor) or value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value) if type(value) in (list, tuple) else [plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, os.PathLike):
        return str(value)
    if hasattr(value, "__dict__") and type(value).__name__ in ("Namespace", "AttributeDict", "SimpleNamespace"):
        return plain(dict(vars(value)))
    if isinstance(value, torch.dtype | torch.device | torch.Size):
        return str(value) if not isinstance(value, torch.Size) else list(value)
    raise CheckpointError(f"cannot convert an object of type {type(value).__module__}.{type(value).__qualname__} to plain data")
