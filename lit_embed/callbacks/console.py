"""What a run shows while it runs: Lightning's progress bar and model summary, saying only what is true.

The CLI gives every run these in place of Lightning's defaults (where the config names no progress bar or
model summary of its own, and does not turn them off):

* :class:`EpochProgressBar`: Lightning's rich progress bar, which reads ``Epoch 4/-2`` where training is
  bounded by ``max_steps`` (``max_epochs`` is -1 then) and ``v_num: 0.000`` for run folder ``version_0``;
  this one reads ``Epoch 4`` and ``v_num: 0``.
* :class:`LayerSummary`: Lightning's model summary without its FLOPs column where nothing was counted
  (Lightning counts FLOPs only by running a module's ``example_input_array``, and prints zeros otherwise).
* :class:`LogProgress` in place of the bar where stderr is no terminal (``> log 2>&1``, a batch job): a bar
  redrawn in a file shows nothing until the end, so progress comes as a plain line every ``interval`` seconds
  (:mod:`lit_embed.progress`, which the commands without a trainer use too).
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from typing import Any

from pytorch_lightning.callbacks import ModelSummary, ProgressBar, RichProgressBar, TQDMProgressBar

from lit_embed._compat import format_summary_table
from lit_embed.progress import Progress

#: Lightning's model summary prints through this logger, which Lightning shows at level INFO.
log = logging.getLogger("pytorch_lightning.callbacks.model_summary")


class EpochProgressBar(RichProgressBar):
    """Lightning's rich progress bar; ``Epoch N/last`` only where the number of epochs bounds training."""

    def _get_train_description(self, current_epoch: int) -> str:  # Lightning's hook for the bar's title
        description = super()._get_train_description(current_epoch)
        if self.trainer.max_epochs is None or self.trainer.max_epochs < 0:
            description = description.replace(f"Epoch {current_epoch}/{self.trainer.max_epochs - 1}", f"Epoch {current_epoch}")
        return description

    def get_metrics(self, trainer, pl_module) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        if "v_num" in metrics:
            metrics["v_num"] = str(metrics["v_num"])  # the rich bar prints numbers as floats
        return metrics


class LayerSummary(ModelSummary):
    """Lightning's model summary (modules, parameters, mode), with FLOPs only where they were counted."""

    @staticmethod
    def summarize(summary_data: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int,
                  model_size: float, total_training_modes: dict[str, int], total_flops: int, **kwargs: Any) -> None:
        if total_flops:
            return ModelSummary.summarize(summary_data, total_parameters, trainable_parameters, model_size,
                                          total_training_modes, total_flops, **kwargs)
        columns = [column for column in summary_data if column[0] != "FLOPs"]
        table = format_summary_table(total_parameters, trainable_parameters, model_size, total_training_modes, 0, *columns)
        log.info("\n" + table.rsplit("\n", 1)[0])  # its last line is the total FLOPs
        return None


class LogProgress(ProgressBar):
    """Progress for a log: ``train step 1200/250000 (0.5%), 3.1 steps/s, ETA 22h17m, train/loss 6.412`` on stderr
    every ``interval`` seconds of each stage (train, validate, test, predict) and once when the stage ends
    (:class:`~lit_embed.progress.Progress`); rank 0 only. A Lightning progress bar, so the trainer adds no bar of its
    own beside it."""

    def __init__(self, interval: float = 30.0) -> None:
        super().__init__()
        self.interval = interval
        self._enabled = True
        self._train = self._eval = Progress("", "step", enabled=False)
        self._first_step = self._batches = 0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def _say(self, trainer, pl_module, progress: Progress, done: int, final: bool = False) -> None:
        if self._enabled and trainer.is_global_zero:
            progress.update(done, lambda: {k: v for k, v in self.get_metrics(trainer, pl_module).items() if k != "v_num"},
                            final)

    def on_train_start(self, trainer, pl_module) -> None:
        self._first_step = trainer.global_step  # a resumed run: the rate and ETA count the steps this process takes
        self._train = Progress("train", "step", trainer.estimated_stepping_batches - self._first_step, self.interval, True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._say(trainer, pl_module, self._train, trainer.global_step - self._first_step)

    def on_train_end(self, trainer, pl_module) -> None:
        self._say(trainer, pl_module, self._train, trainer.global_step - self._first_step, final=True)

    def _eval_start(self, stage: str, total: float) -> None:
        self._eval, self._batches = Progress(stage, "batch", total, self.interval, True), 0

    def _eval_batch(self, trainer, pl_module) -> None:
        self._batches += 1
        self._say(trainer, pl_module, self._eval, self._batches)

    def _eval_end(self, trainer, pl_module) -> None:
        self._say(trainer, pl_module, self._eval, self._batches, final=True)

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            self._eval_start("sanity check", sum(trainer.num_sanity_val_batches))
        else:
            self._eval_start("validate", self.total_val_batches)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._eval_batch(trainer, pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        self._eval_end(trainer, pl_module)

    def on_test_start(self, trainer, pl_module) -> None:
        self._eval_start("test", sum(trainer.num_test_batches))

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._eval_batch(trainer, pl_module)

    def on_test_end(self, trainer, pl_module) -> None:
        self._eval_end(trainer, pl_module)

    def on_predict_start(self, trainer, pl_module) -> None:
        self._eval_start("predict", sum(trainer.num_predict_batches))

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._eval_batch(trainer, pl_module)

    def on_predict_end(self, trainer, pl_module) -> None:
        self._eval_end(trainer, pl_module)


def progress_bar():
    """The progress the CLI gives a run: as plain lines where stderr is no terminal (a log file), else the bar
    Lightning would add (rich where it is installed, else tqdm)."""
    if not sys.stderr.isatty():
        return LogProgress()
    return EpochProgressBar() if importlib.util.find_spec("rich") is not None else TQDMProgressBar()


__all__ = ["EpochProgressBar", "LayerSummary", "LogProgress", "progress_bar"]
