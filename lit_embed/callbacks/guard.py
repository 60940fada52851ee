"""What every ``lit-embed`` run gets, whatever its config: atomic checkpoints, folders of its own, and a
clean stop on a signal.

Schedulers (SLURM, Kubernetes, torchrun) send SIGTERM before they kill a job, and people press Ctrl-C.
On either, during ``fit``, training stops after the step in progress, a resumable ``last.ckpt`` is saved
atomically in the run's checkpoint folder (``--ckpt_path last`` continues from it), the results so far are
written (``results.json`` marked ``interrupted``), and ``lit-embed`` exits 143 (SIGTERM) or 130 (SIGINT).
A second Ctrl-C stops at once. SLURM's requeue signal (SIGUSR1) keeps Lightning's handling.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.plugins.io import TorchCheckpointIO
from pytorch_lightning.utilities.exceptions import SIGTERMException

from lit_embed._compat import request_stop
from lit_embed.checkpointing import AtomicCheckpointIO
from lit_embed.runs import CHECKPOINTS, LAST, hold, run_folder

log = logging.getLogger(__name__)

_received: int | None = None  # the signal that stopped this process's run, if one did
_active: pl.Trainer | None = None  # the trainer whose loops check for a stop request


class Interrupted(BaseException):
    """A signal arrived while no training or evaluation loop could stop at a step boundary."""


def received_signal() -> int | None:
    """The signal (SIGTERM or SIGINT) that interrupted this process, if one did."""
    return _received


def install_signal_handlers() -> None:
    """Handle SIGTERM and SIGINT as described in the module docstring (the CLI calls this once)."""
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)


def _on_signal(signum, frame) -> None:
    global _received
    first = _received is None
    _received = signum
    trainer = _active
    if signum == signal.SIGTERM and trainer is not None:
        return  # Lightning's own SIGTERM handler ran first: its loops stop at the next step
    if signum == signal.SIGINT and trainer is not None and first:
        request_stop(trainer)
        log.warning("Interrupted: stopping after this step and saving a checkpoint (Ctrl-C again stops at once)")
        return
    raise KeyboardInterrupt if signum == signal.SIGINT else Interrupted(signum)


class RunGuard(pl.Callback):
    """Atomic checkpoints, locked run and checkpoint folders, and the save on a signal (see the module).

    The CLI adds it to every trainer; add it yourself when you build a ``Trainer`` in Python.
    """

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()  # a kill during a save leaves last.ckpt whole

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:  # after the checkpoint callbacks have resolved their folders
            for callback in trainer.checkpoint_callbacks:
                if isinstance(callback, ModelCheckpoint) and callback.dirpath and "://" not in str(callback.dirpath):
                    hold(callback.dirpath, "checkpoint folder")

    def on_train_start(self, trainer, pl_module) -> None:
        _activate(trainer)

    def on_validation_start(self, trainer, pl_module) -> None:
        _activate(trainer)

    def on_test_start(self, trainer, pl_module) -> None:
        _activate(trainer)

    def on_predict_start(self, trainer, pl_module) -> None:
        _activate(trainer)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        _activate(None)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        _activate(None)
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit":
            return  # stopped at a step boundary only on a signal; anywhere else the state may be half-updated
        path = last_checkpoint_path(trainer)
        trainer.save_checkpoint(path, weights_only=False)
        if trainer.is_global_zero:
            log.warning("Saved %s at step %d: resume with --ckpt_path last", path, trainer.global_step)


def last_checkpoint_path(trainer: pl.Trainer) -> Path:
    """Where an interrupted run saves ``last.ckpt``: its checkpoint callback's folder, else the run's own."""
    callback = trainer.checkpoint_callback
    folder = (callback.dirpath if callback is not None else None) or run_folder(trainer) / CHECKPOINTS
    return Path(folder) / LAST


def _activate(trainer: pl.Trainer | None) -> None:
    global _active
    _active = trainer


__all__ = ["Interrupted", "RunGuard", "install_signal_handlers", "last_checkpoint_path", "received_signal"]
