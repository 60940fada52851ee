"""What every ``lit-embed`` run gets, whatever its config: atomic checkpoints, folders of its own, one ``last.ckpt``
at the newest state, a clean stop on a signal, and a stop when training diverges.

Schedulers (SLURM, Kubernetes, torchrun) send SIGTERM before they kill a job, and people press Ctrl-C.
On either, during ``fit``, training stops after the step in progress, a resumable ``last.ckpt`` is saved
atomically in the run's checkpoint folder (``--ckpt_path last`` continues from it), the results so far are
written (``results.json`` marked ``interrupted``), and ``lit-embed`` exits 143 (SIGTERM) or 130 (SIGINT).
A second Ctrl-C stops at once. SLURM's requeue signal (SIGUSR1) keeps Lightning's handling.

A run that keeps a ``last.ckpt`` (a checkpoint callback with ``save_last``, or one a signal saved) has it at its final
state when training ends, and a resumed run writes it again in place. Lightning alone refreshes ``last`` only when it
saves another checkpoint (with a monitor: a new best), so it could end many steps behind, and it writes
``last-v1.ckpt`` beside a ``last.ckpt`` it did not save itself (one saved on a signal before its first save).

A non-finite training loss stops the run, as do non-finite weights at a save (before anything is written):
``lit-embed`` exits 3 (:class:`~lit_embed.errors.DivergedError`), naming the step whose loss was not finite, and
``results.json`` is marked ``diverged``. Under fp16's gradient scaler a non-finite loss is normal now and then (the
scaler skips that step and lowers its scale): only :data:`SKIPPED_STEPS` in a row count. The losses are read from the
device every :data:`CHECK_EVERY` batches, not each step (reading one makes the host wait for the GPU), and before
every checkpoint save, validation, and the end of each epoch and of training: so a run stops at most that many steps
after its loss went non-finite, and never saves what came after. Every rank takes each decision together.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger
from pytorch_lightning.plugins.io import TorchCheckpointIO
from pytorch_lightning.plugins.precision import MixedPrecision
from pytorch_lightning.utilities.exceptions import SIGTERMException

from lit_embed._compat import validate_again_on_resume
from lit_embed.checkpoints.atomic_io import AtomicCheckpointIO
from lit_embed.errors import ConfigError, DivergedError
from lit_embed.runs.folders import CHECKPOINTS, LAST, hold
from lit_embed.runs.logger import run_folder
from lit_embed.runs.signals import activate

log = logging.getLogger(__name__)

#: Training batches in a row with a non-finite loss that a gradient scaler (fp16) may skip before the run counts as
#: diverged. Each skip halves the scale, so from the default 2^16 this is room for every overflow the scale can cure;
#: without a scaler the first non-finite loss has reached the weights already, and stops the run.
SKIPPED_STEPS = 20
#: Training batches between two reads of their losses from the device (a host sync each).
CHECK_EVERY = 50


class RunGuard(pl.Callback):
    """Atomic checkpoints, locked run and checkpoint folders, an up-to-date ``last.ckpt``, the save on a signal and the
    stop on divergence (see the module).

    The CLI adds it to every trainer, first among its callbacks (its ``last.ckpt`` is written before the results that
    report it); add it yourself, first, when you build a ``Trainer`` in Python.
    """

    def __init__(self, check_every: int = CHECK_EVERY) -> None:
        if check_every < 1:
            raise ConfigError(f"check_every={check_every} must be a positive number of training batches")
        self.check_every = check_every
        self._non_finite = 0  # training batches in a row whose loss was not finite on some rank
        self._losses: torch.Tensor | None = None  # this rank's loss of each batch since the last check, on the device
        self._steps: list[int] = []  # and each one's step
        self._test_follows = False

    def expect_test(self) -> None:
        """The command tests the fitted model afterwards: training's end writes ``last.ckpt`` whatever the config saves,
        so that a signal before the test leaves what ``--ckpt_path last`` needs to run it without training again."""
        self._test_follows = True

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()  # a kill during a save leaves last.ckpt whole
        # Before anything writes there (the CLI's config.yaml, a logger's files): the run's folder where it is the run's
        # own (a TensorBoard or CSV logger's version folder; without a logger, default_root_dir; other loggers' save_dir
        # is shared by their runs), and the checkpoint folders the config gives.
        folder = trainer.log_dir  # a collective under DDP: every rank asks
        own = trainer.logger is None or isinstance(trainer.logger, (TensorBoardLogger, CSVLogger))
        if trainer.is_global_zero:
            given = [c.dirpath for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
            for path, what in [*([(folder, "run folder")] if own else []), *((p, "checkpoint folder") for p in given)]:
                if path and "://" not in str(path):
                    hold(path, what)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:  # after the checkpoint callbacks have resolved their folders
            for callback in trainer.checkpoint_callbacks:
                if isinstance(callback, ModelCheckpoint) and callback.dirpath and "://" not in str(callback.dirpath):
                    hold(callback.dirpath, "checkpoint folder")

    def on_train_start(self, trainer, pl_module) -> None:
        activate(trainer)
        self._non_finite, self._steps = 0, []
        path = last_checkpoint_path(trainer)
        if trainer.ckpt_path is not None and trainer.strategy.broadcast(path.is_file()):
            _own_last(trainer, path)  # resumed: its last.ckpt is written again in place, not beside (last-v1.ckpt)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._check_losses(trainer)
        activate(trainer)

    def on_test_start(self, trainer, pl_module) -> None:
        activate(trainer)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int) -> None:
        """Keep the batch's loss on the device; read the kept ones every ``check_every`` batches."""
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if not isinstance(loss, torch.Tensor):
            loss = torch.zeros((), device=pl_module.device)
        if self._losses is None or self._losses.device != loss.device:
            self._losses = torch.zeros(self.check_every, device=loss.device)
        self._losses[len(self._steps)] = loss.detach().float().sum()  # a copy on the device: no wait
        self._steps.append(trainer.global_step)
        if len(self._steps) == self.check_every:
            self._check_losses(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check_losses(trainer)

    def _check_losses(self, trainer: pl.Trainer) -> None:
        """Stop the run at the first kept loss that was not finite on some rank (without a gradient scaler; with one,
        the first that ends :data:`SKIPPED_STEPS` in a row), as a check at every step would have; forget the kept ones.
        A collective: every rank calls it at the same batches, as it keeps the same number of losses."""
        if not self._steps:
            return
        assert self._losses is not None
        losses, steps, self._steps = self._losses[: len(self._steps)], self._steps, []
        # One rank's NaN reaches every rank's weights through the all-reduce of the gradients: they stop together.
        flags = trainer.strategy.reduce((~torch.isfinite(losses)).float(), reduce_op="sum").tolist()
        scaled = isinstance(trainer.precision_plugin, MixedPrecision) and trainer.precision_plugin.scaler is not None
        for index, (step, flag) in enumerate(zip(steps, flags)):
            self._non_finite = self._non_finite + 1 if flag else 0
            if self._non_finite and (not scaled or self._non_finite >= SKIPPED_STEPS):
                local = float(losses[index])
                value = f"{local}" if not math.isfinite(local) else "not finite on another rank"
                row = f" ({self._non_finite} batches in a row, each skipped by the gradient scaler)" if scaled else ""
                raise diverged(trainer, f"the training loss was {value} at step {step}{row}")

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        self._check_losses(trainer)  # every rank saves (only rank 0 writes): nothing after a non-finite loss is kept
        # The replicas of DDP ranks are equal, so every rank finds the same; raised before the file is written.
        if not all(bool(torch.isfinite(p).all()) for p in pl_module.parameters()):
            raise diverged(trainer, f"its weights were not finite at the save of step {trainer.global_step}")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The final state in ``last.ckpt``, where the run keeps one (or a test follows) and it is behind."""
        self._check_losses(trainer)
        path = last_checkpoint_path(trainer)
        io = trainer.strategy.checkpoint_io
        keeps = (self._test_follows or path.is_file()
                 or any(isinstance(c, ModelCheckpoint) and c.save_last for c in trainer.checkpoint_callbacks))
        behind = not (isinstance(io, AtomicCheckpointIO) and io.saved_step(path) == trainer.global_step)
        if trainer.strategy.broadcast(keeps and behind):  # rank 0's view: it is the one that writes
            _own_last(trainer, path)
            trainer.save_checkpoint(path, weights_only=False)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        activate(None)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        activate(None)
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit":
            return  # stopped at a step boundary only on a signal; anywhere else the state may be half-updated
        if trainer.validating and not trainer.sanity_checking:
            validate_again_on_resume(trainer)
        try:
            self._check_losses(trainer)
        except DivergedError as error:  # the signal came after a loss went non-finite: nothing of it to resume
            log.warning("Saved no checkpoint on the signal: %s", error.what)
            return
        path = last_checkpoint_path(trainer)
        _own_last(trainer, path)
        trainer.save_checkpoint(path, weights_only=False)
        if trainer.is_global_zero:
            log.warning("Saved %s at step %d: resume with --ckpt_path last", path, trainer.global_step)


def last_checkpoint_path(trainer: pl.Trainer) -> Path:
    """Where a run keeps ``last.ckpt``: its checkpoint callback's folder, else the run's own."""
    callback = trainer.checkpoint_callback
    folder = (callback.dirpath if callback is not None else None) or run_folder(trainer) / CHECKPOINTS
    return Path(folder) / LAST


def _own_last(trainer: pl.Trainer, path: Path) -> None:
    """Make ``path`` the ``last`` of the checkpoint callbacks that write into its folder, so that they save over it
    (and record it in the checkpoints they save) instead of writing ``last-v1.ckpt`` beside it."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath and Path(callback.dirpath) == path.parent:
            callback.last_model_path = str(path)


def diverged(trainer: pl.Trainer, what: str) -> DivergedError:
    """The error that stops a diverged run: what was not finite, where, and the likely causes."""
    rates = [group["lr"] for optimizer in trainer.optimizers for group in optimizer.param_groups]
    causes = [f"a learning rate too high (it was {max(rates):.3g} at this step: lower model.init_args.optim.lr)"
              if rates else "a learning rate too high"]
    if str(trainer.precision).startswith("16"):
        causes.append(f"fp16's range (precision {trainer.precision}: try bf16-mixed or 32-true)")
    return DivergedError(
        f"training diverged: {what}. Likely cause: {', or '.join(causes)}. The run is marked diverged in "
        f"{run_folder(trainer) / 'results.json'}; no checkpoint of it is taken as a model (give a file to use one)", what
    )


__all__ = ["CHECK_EVERY", "SKIPPED_STEPS", "RunGuard", "diverged", "last_checkpoint_path"]
