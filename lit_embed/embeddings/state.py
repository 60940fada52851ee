"""What a strategy or hasher is, as data: buffers a checkpoint sizes, and the config that rebuilds it.

Two things every stateful piece of the seam shares:

* :class:`CheckpointSized`: persistent buffers whose shape is not known when the module is built (a
  fitted LSH n-gram vocabulary, a grown vocabulary's codes, a hasher key) take the shape of the
  state dict loaded into them. A module lists them in ``sized_by_checkpoint``.
* :func:`init_args_of` and :func:`config_of`: the constructor arguments read back from the attributes
  that hold them under the same names, as plain data a YAML file or jsonargparse holds, with nested
  objects (an assignment, a hasher) as ``{"class_path", "init_args"}``.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Iterable
from pathlib import PurePath
from typing import Any, ClassVar

import torch
from torch import nn

PLAIN = (bool, int, float, str, type(None))


class CheckpointSized(nn.Module):
    """A module whose buffers named in ``sized_by_checkpoint`` take their shape from the state dict loaded.

    After loading, :meth:`on_sized_load` is told which of them the state dict held (a hook for state
    that follows from them, such as the vocabulary size of a grown vocabulary's codes).
    """

    #: Names of persistent buffers whose shape comes from the checkpoint.
    sized_by_checkpoint: ClassVar[tuple[str, ...]] = ()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        held = [name for name in self.sized_by_checkpoint if prefix + name in state_dict]
        for name in held:
            current, value = getattr(self, name), state_dict[prefix + name]
            if value.shape != current.shape:
                setattr(self, name, torch.empty(value.shape, dtype=current.dtype, device=current.device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if held:
            self.on_sized_load(held)

    def on_sized_load(self, names: list[str]) -> None:
        """Called after loading a state dict that held the buffers ``names`` (of ``sized_by_checkpoint``)."""

    def shaped_by_checkpoint(self) -> set[str]:
        """Names (in this module's state dict) whose shape a loaded checkpoint decides: the buffers of
        ``sized_by_checkpoint`` and what :meth:`on_sized_load` resizes after them."""
        return set(self.sized_by_checkpoint)


def fixed_shapes(module: nn.Module) -> set[str]:
    """The keys of ``module``'s state dict whose shapes its config fixes (a checkpoint must match them): all
    but those a :class:`CheckpointSized` submodule takes from the checkpoint."""
    free = {f"{prefix}.{name}" if prefix else name for prefix, sub in module.named_modules()
            if isinstance(sub, CheckpointSized) for name in sub.shaped_by_checkpoint()}
    return set(module.state_dict()) - free


def public_class_path(cls: type) -> str:
    """The stable name of a class: ``lit_embed.<package>.<Name>`` where that package exports it
    (``lit_embed.embeddings.SubspaceEmbedding``, ``lit_embed.models.Encoder``), else ``module.qualname``.

    A checkpoint records this name, so moving a class between modules does not break it.
    """
    import importlib
    import sys

    parts = cls.__module__.split(".")
    if parts[0] == "lit_embed" and len(parts) > 2:
        package = sys.modules.get(".".join(parts[:2])) or importlib.import_module(".".join(parts[:2]))
        if getattr(package, cls.__name__, None) is cls:
            return f"{package.__name__}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def init_args_of(obj: Any, skip: Iterable[str] = ()) -> dict[str, Any]:
    """``obj``'s constructor arguments (those not in ``skip``), read back from its same-named attributes.

    Raises ``TypeError`` naming the argument where an attribute is missing or is not what was given (a
    method, a tensor): such a class stores it under another name and overrides ``init_args``.
    """
    skipped = set(skip)
    owner = type(obj).__name__
    args = {}
    for name, parameter in inspect.signature(type(obj)).parameters.items():
        if name in skipped:
            continue
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"{owner} takes *{name}: override init_args() to say which arguments rebuild it")
        value = getattr(obj, name, inspect.Parameter.empty)
        if value is inspect.Parameter.empty or callable(value) and not hasattr(value, "init_args"):
            raise TypeError(
                f"{owner} does not keep its constructor argument {name!r} as self.{name}: store it under that name "
                f"or override init_args()"
            )
        args[name] = as_plain(value, f"{owner}.{name}")
    return args


def config_of(obj: Any) -> dict[str, Any]:
    """``{"class_path", "init_args"}`` that rebuilds ``obj`` (its ``init_args()`` where it has one)."""
    init_args = obj.init_args() if hasattr(obj, "init_args") else init_args_of(obj)
    return {"class_path": public_class_path(type(obj)), "init_args": init_args}


def as_plain(value: Any, where: str) -> Any:
    """``value`` as YAML-ready data: numbers, strings, lists, dicts, nested objects as their config."""
    if isinstance(value, PLAIN):
        return value
    if isinstance(value, numbers.Integral):  # NumPy's integers
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [as_plain(item, where) for item in value]
    if isinstance(value, dict):
        return {str(key): as_plain(item, where) for key, item in value.items()}
    if isinstance(value, torch.Tensor) or not hasattr(value, "__dict__"):
        raise TypeError(f"{where} holds a {type(value).__name__}, which a config cannot: override init_args()")
    return value.config() if hasattr(value, "config") else config_of(value)


__all__ = ["CheckpointSized", "as_plain", "config_of", "fixed_shapes", "init_args_of", "public_class_path"]
