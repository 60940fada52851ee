"""Checkpoints that survive a kill: written atomically, so ``last.ckpt`` is always a whole checkpoint.

Lightning's own writer (``TorchCheckpointIO``) stages the file in the system's temporary folder and
moves it into place, which is a copy, not a rename, whenever that folder is on another filesystem
than the checkpoints (a local ``/tmp`` and a shared cluster filesystem): a job killed during that
copy leaves a truncated ``last.ckpt`` that the restarted job cannot load. :class:`AtomicCheckpointIO`
writes beside the target and renames, which a kill cannot interrupt halfway. Its tensors are written from
the CPU, so a checkpoint trained on GPUs loads on a machine without one (and on any GPU, not only ``cuda:N``).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning_fabric.utilities.apply_func import move_data_to_device
from lightning_fabric.utilities.cloud_io import get_filesystem
from pytorch_lightning.plugins.io import TorchCheckpointIO

from lit_embed.storage.files import atomic_writer


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` into a temporary file next to the checkpoint, flushed to disk, then ``os.replace``.

    :class:`~lit_embed.callbacks.RunGuard` installs it in every run whose trainer has Lightning's own writer (a config
    may name it too: ``plugins: [lit_embed.checkpoints.atomic_io.AtomicCheckpointIO]``); remote paths (``s3://``,
    ``gs://``) keep Lightning's writer, since an object store's upload is already all-or-nothing. It remembers the step of each file it wrote (:meth:`saved_step`), so that
    :class:`~lit_embed.callbacks.RunGuard` writes ``last.ckpt`` at the end of training only where it is behind.
    A checkpoint the command has read already (``--ckpt_path``, read and checked once by the command layer) is
    handed over (:meth:`hand_over`) and given to Lightning when it asks for that file, instead of reading it again.
    """

    def __init__(self) -> None:
        super().__init__()
        self._steps: dict[str, int | None] = {}
        self._read: dict[str, dict[str, Any]] = {}

    def hand_over(self, path: str | os.PathLike, checkpoint: dict[str, Any]) -> None:
        """Give ``checkpoint``, read from ``path`` (by :func:`~lit_embed.checkpoints.format.read_checkpoint`), to Lightning's
        next load of ``path``: once, so a later load (the best checkpoint after a fit) reads the file as it is then."""
        self._read[os.path.abspath(path)] = checkpoint

    def load_checkpoint(self, path: str | os.PathLike, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        read = self._read.pop(os.path.abspath(path), None)
        if read is not None:
            return read
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def saved_step(self, path: str | os.PathLike) -> int | None:
        """The global step of the checkpoint this writer last wrote to ``path`` (``None``: it wrote none there)."""
        return self._steps.get(os.path.abspath(path))

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options (got {storage_options!r})")
        self._steps.pop(os.path.abspath(path), None)
        self._write(move_data_to_device(checkpoint, torch.device("cpu")), path)
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
