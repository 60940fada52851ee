"""Buffers whose shape the checkpoint gives, handled once for strategies and hashers alike.

:class:`CheckpointSized`: persistent buffers whose shape is not known when the module is built (a
fitted LSH n-gram vocabulary, a grown vocabulary's codes, a hasher key) take the shape of the state
dict loaded into them. A module lists them in ``sized_by_checkpoint``; strategies and hashers share it.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn


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


__all__ = ["CheckpointSized"]
