"""Callbacks the tests add to real ``lit-embed`` runs to see what a run really does."""

from __future__ import annotations

import json
from pathlib import Path

import pytorch_lightning as pl
from torch import nn


class ModeProbe(pl.Callback):
    """Writes ``out`` (JSON): how many Dropout modules were in train mode at each training batch and at each
    validation batch, of how many."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.seen: dict[str, list[list[int]]] = {"train": [], "val": []}

    def _count(self, module: pl.LightningModule, stage: str) -> None:
        dropouts = [m for m in module.modules() if isinstance(m, nn.Dropout)]
        self.seen[stage].append([sum(m.training for m in dropouts), len(dropouts)])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._count(pl_module, "train")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._count(pl_module, "val")

    def on_fit_end(self, trainer, pl_module) -> None:
        self.out.write_text(json.dumps(self.seen))
