"""Checkpoints that survive a kill: written atomically, so ``last.ckpt`` is always a whole checkpoint.

Lightning's own writer (``TorchCheckpointIO``) stages the file in the system's temporary folder and
moves it into place, which is a copy, not a rename, whenever that folder is on another filesystem
than the checkpoints (a local ``/tmp`` and a shared cluster filesystem): a job killed during that
copy leaves a truncated ``last.ckpt`` that the restarted job cannot load. :class:`AtomicCheckpointIO`
writes beside the target and renames, which a kill cannot interrupt halfway.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning_fabric.utilities.cloud_io import get_filesystem
from pytorch_lightning.plugins.io import TorchCheckpointIO

from lit_embed.files import atomic_writer


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` into a temporary file next to the checkpoint, flushed to disk, then ``os.replace``.

    Used by the shipped trainer configs (``plugins: [lit_embed.checkpoint_io.AtomicCheckpointIO]``);
    remote paths (``s3://``, ``gs://``) keep Lightning's writer, since an object store's upload is
    already all-or-nothing. It remembers the step of each file it wrote (:meth:`saved_step`), so that
    :class:`~lit_embed.callbacks.RunGuard` writes ``last.ckpt`` at the end of training only where it is behind.
    """

    def __init__(self) -> None:
        super().__init__()
        self._steps: dict[str, int | None] = {}

    def saved_step(self, path: str | os.PathLike) -> int | None:
        """The global step of the checkpoint this writer last wrote to ``path`` (``None``: it wrote none there)."""
        return self._steps.get(os.path.abspath(path))

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options (got {storage_options!r})")
        self._steps.pop(os.path.abspath(path), None)
        self._write(checkpoint, path)
        self._steps[os.path.abspath(path)] = checkpoint.get("global_step")

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        self._steps.pop(os.path.abspath(path), None)
        super().remove_checkpoint(path)

    def _write(self, checkpoint: dict[str, Any], path: str | os.PathLike) -> None:
        protocol = get_filesystem(path).protocol
        if "file" not in (protocol if isinstance(protocol, tuple) else (protocol,)):
            super().save_checkpoint(checkpoint, path)
            return
        with atomic_writer(path) as handle:
            torch.save(checkpoint, handle)


__all__ = ["AtomicCheckpointIO"]
