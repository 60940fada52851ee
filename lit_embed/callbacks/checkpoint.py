"""Periodic checkpoints a restarted job finds: ``last.ckpt`` in a folder that outlives the run's version."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint


class PeriodicCheckpoint(ModelCheckpoint):
    """``last.ckpt`` every ``every_n_train_steps`` optimiser steps, for resuming after a fault.

    Lightning's default folder is the logger's ``version_N/checkpoints``, which a restarted job does
    not look in (it starts ``version_N+1``). This one defaults to ``<save_dir>/<name>/checkpoints``
    of the first logger (``runs/demo/checkpoints`` for the demo), or ``<default_root_dir>/checkpoints``
    without a logger: the same folder for every restart of an experiment, so ``--ckpt_path last``
    resumes the newest one (and starts fresh, with a warning, when there is none yet). Give each
    experiment its own ``trainer.default_root_dir`` or logger name. A checkpoint Lightning saved
    before a SLURM requeue (``hpc_ckpt_N.ckpt`` in ``default_root_dir``) is a candidate too.

    With :class:`~lit_embed.checkpointing.AtomicCheckpointIO` (on in the shipped trainer configs) a
    kill during a save leaves the previous ``last.ckpt`` whole.

    Args:
        every_n_train_steps: optimiser steps between saves.
        save_top_k: other checkpoints kept besides ``last.ckpt`` (0: none; with ``monitor``, the best k).
        dirpath: the folder, if not the default above.
        The rest: see ``ModelCheckpoint``.
    """

    def __init__(
        self,
        every_n_train_steps: int = 1000,
        save_top_k: int = 0,
        dirpath: str | None = None,
        monitor: str | None = None,
        mode: Literal["min", "max"] = "min",
        filename: str | None = None,
        save_last: bool | Literal["link"] = True,
    ) -> None:
        if every_n_train_steps < 1:
            raise ValueError(f"every_n_train_steps={every_n_train_steps} must be at least 1")
        super().__init__(
            dirpath=dirpath, every_n_train_steps=every_n_train_steps, save_top_k=save_top_k, monitor=monitor,
            mode=mode, filename=filename, save_last=save_last,
        )

    def stable_dir(self, trainer: pl.Trainer) -> str:
        if trainer.loggers and trainer.loggers[0].save_dir is not None:
            logger = trainer.loggers[0]
            return os.path.join(logger.save_dir, str(logger.name), "checkpoints")
        return os.path.join(trainer.default_root_dir, "checkpoints")

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._resolve(trainer)
        super().setup(trainer, pl_module, stage)

    def _find_last_checkpoints(self, trainer: pl.Trainer) -> set[str]:
        """``last.ckpt``, and the newest checkpoint Lightning saved for a SLURM requeue (the newest file wins)."""
        self._resolve(trainer)  # `--ckpt_path last` is resolved before setup
        found = super()._find_last_checkpoints(trainer)
        requeue = sorted(Path(trainer.default_root_dir).glob("hpc_ckpt_*.ckpt"), key=_version)
        return found | {os.path.normpath(requeue[-1])} if requeue else found

    def _resolve(self, trainer: pl.Trainer) -> None:
        if self.dirpath is None:
            self.dirpath = os.path.realpath(self.stable_dir(trainer))


def _version(path: Path) -> int:
    suffix = path.stem.removeprefix("hpc_ckpt_")
    return int(suffix) if suffix.isdigit() else -1


__all__ = ["PeriodicCheckpoint"]
