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


class StateProbe(pl.Callback):
    """Writes ``out`` with ``{rank}`` filled in (JSON) when training ends: the optimiser's ``fused`` setting, the
    trainer's precision, the parameters' devices and dtypes, and a digest of every parameter's values (ranks of
    one DDP run must agree on it). At ``on_train_end``, not ``on_fit_end``: Lightning's teardown moves the model
    to the CPU between the two."""

    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_end(self, trainer, pl_module) -> None:
        import hashlib

        digest = hashlib.sha256()
        for name, parameter in sorted(pl_module.named_parameters()):
            digest.update(name.encode() + parameter.detach().float().cpu().numpy().tobytes())
        optimizer = trainer.optimizers[0]
        seen = {"fused": bool(optimizer.defaults.get("fused")), "precision": str(trainer.precision),
                "devices": sorted({p.device.type for p in pl_module.parameters()}),
                "dtypes": sorted({str(p.dtype) for p in pl_module.parameters()}), "digest": digest.hexdigest()}
        Path(self.out.format(rank=trainer.global_rank)).write_text(json.dumps(seen))


class SignalAt(pl.Callback):
    """Sends this process ``signum`` after validation batch ``batch`` of a fit (not the sanity check), once: a second
    run that finds ``marker`` (the resumed one) is left alone. It also appends to ``log`` (JSON lines) each
    validation's batch count, and the ``val/`` metrics it ended with."""

    def __init__(self, marker: str, log: str, batch: int = 1, signum: int = 15) -> None:
        self.marker, self.record, self.batch, self.signum = Path(marker), Path(log), batch, signum
        self.batches = 0

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self.batches = 0

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if trainer.sanity_checking:
            return
        self.batches += 1
        if batch_idx == self.batch and not self.marker.exists():
            import os

            self.marker.write_text("sent")
            os.kill(os.getpid(), self.signum)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        with self.record.open("a") as out:
            out.write(json.dumps({"step": trainer.global_step, "batches": self.batches, "metrics": sorted(metrics)}) + "\n")


class FillDisk(pl.Callback):
    """Fills the filesystem of ``folder`` (:func:`tests.helpers.disk.fill`) at the hook ``at`` of a run: every write
    after it meets a full disk."""

    def __init__(self, folder: str, at: str = "on_train_start") -> None:
        self.folder = folder
        self.at = at

    def _reached(self, hook: str) -> None:
        from tests.helpers.disk import fill

        if hook == self.at:
            fill(self.folder)

    def on_train_start(self, trainer, pl_module) -> None:
        self._reached("on_train_start")

    def on_train_end(self, trainer, pl_module) -> None:
        self._reached("on_train_end")

    def on_predict_start(self, trainer, pl_module) -> None:
        self._reached("on_predict_start")
class NonFiniteLoss(pl.Callback):
    """Makes the training loss NaN at the given optimiser steps (1 is the first), on ``rank`` only if given: the
    embedding's output of those batches is multiplied by NaN, so the gradients are NaN too (what fp16's gradient
    scaler skips). ``from_step``: every step from there on as well."""

    def __init__(self, steps: list[int] = (), from_step: int | None = None, rank: int | None = None) -> None:
        self.steps, self.from_step, self.rank = set(steps), from_step, rank
        self.active = False

    def setup(self, trainer, pl_module, stage: str) -> None:
        pl_module.embedding.register_forward_hook(lambda module, args, output: output * float("nan") if self.active else output)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = trainer.global_step + 1
        chosen = step in self.steps or (self.from_step is not None and step >= self.from_step)
        self.active = chosen and self.rank in (None, trainer.global_rank)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.active = False


class NonFiniteWeights(pl.Callback):
    """Sets one weight to NaN after optimiser step ``step``, before the checkpoint saved at that step."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            import torch

            with torch.no_grad():
                next(pl_module.parameters()).view(-1)[0] = float("nan")


class SignalIn(pl.Callback):
    """Sends this process SIGTERM once (a second run that finds ``marker`` is left alone), at ``hook``: one of the
    points between a fit's last training step and the end of its test (see :data:`HOOKS`)."""

    HOOKS = ("last_train_batch", "last_validation", "on_train_end", "on_fit_end", "fit_teardown", "on_test_start",
             "first_test_batch")

    def __init__(self, hook: str, marker: str) -> None:
        assert hook in self.HOOKS, hook
        self.hook, self.marker = hook, Path(marker)

    def _send(self, hook: str) -> None:
        if hook == self.hook and not self.marker.exists():
            import os
            import signal

            self.marker.write_text(hook)
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == trainer.max_steps:
            self._send("last_train_batch")

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking and trainer.global_step == trainer.max_steps:
            self._send("last_validation")

    def on_train_end(self, trainer, pl_module) -> None:
        self._send("on_train_end")

    def on_fit_end(self, trainer, pl_module) -> None:
        self._send("on_fit_end")

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":
            self._send("fit_teardown")

    def on_test_start(self, trainer, pl_module) -> None:
        self._send("on_test_start")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if batch_idx == 0:
            self._send("first_test_batch")


class SignalAtStep(pl.Callback):
    """Sends this process SIGTERM after training step ``step``, once (a second run that finds ``marker`` is left
    alone)."""

    def __init__(self, step: int, marker: str) -> None:
        self.step, self.marker = step, Path(marker)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step and not self.marker.exists():
            import os
            import signal

            self.marker.write_text(str(self.step))
            os.kill(os.getpid(), signal.SIGTERM)
