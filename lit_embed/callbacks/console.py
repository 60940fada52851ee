"""What a run shows while it runs: Lightning's progress bar and model summary, saying only what is true.

The CLI gives every run these in place of Lightning's defaults (where the config names no progress bar or
model summary of its own, and does not turn them off):

* :class:`EpochProgressBar`: Lightning's rich progress bar, which reads ``Epoch 4/-2`` where training is
  bounded by ``max_steps`` (``max_epochs`` is -1 then) and ``v_num: 0.000`` for run folder ``version_0``;
  this one reads ``Epoch 4`` and ``v_num: 0``.
* :class:`LayerSummary`: Lightning's model summary without its FLOPs column where nothing was counted
  (Lightning counts FLOPs only by running a module's ``example_input_array``, and prints zeros otherwise).
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from pytorch_lightning.callbacks import ModelSummary, RichProgressBar, TQDMProgressBar

from lit_embed._compat import format_summary_table

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


def progress_bar():
    """The progress bar Lightning would add (rich where it is installed, else tqdm), as the CLI gives it."""
    return EpochProgressBar() if importlib.util.find_spec("rich") is not None else TQDMProgressBar()


__all__ = ["EpochProgressBar", "LayerSummary", "progress_bar"]
