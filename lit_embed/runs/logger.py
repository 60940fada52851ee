"""The logger every ``lit-embed`` run gets: TensorBoard logging into a run folder of its own
(:mod:`lit_embed.runs.folders` says how run folders are claimed, locked and found again).
"""

from __future__ import annotations

from pathlib import Path

from pytorch_lightning.loggers import TensorBoardLogger
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from lit_embed._compat import set_save_dir
from lit_embed.runs.folders import claim_version, hold
from lit_embed.storage.files import writing


class RunLogger(TensorBoardLogger):
    """TensorBoard logging into a run folder of its own: ``<save_dir>/version_N``, claimed atomically and
    locked while the run lives.

    The other arguments are ``TensorBoardLogger``'s (``name`` adds a level between ``save_dir`` and the versions).

    Args:
        save_dir: the experiment folder; default the trainer's ``default_root_dir`` (the CLI fills it in).
        version: continue in ``version_N`` (resuming); default the next free number.
    """

    def __init__(self, save_dir: str | None = None, name: str = "", version: int | str | None = None, **kwargs) -> None:
        super().__init__(save_dir if save_dir is not None else ".", name=name, version=version, **kwargs)
        self.save_dir_given = save_dir is not None
        self._held = False

    def bind(self, default_root_dir: str) -> None:
        """Take ``default_root_dir`` as the experiment folder where none was given (before the run starts)."""
        if not self.save_dir_given:
            set_save_dir(self, default_root_dir)

    @property
    def version(self) -> int | str:
        version = super().version
        if not self._held and rank_zero_only.rank == 0:
            self._held = True
            hold(self.log_dir)
        return version

    def _get_next_version(self) -> int:  # Lightning's hook for a new version: claimed, not just listed
        if rank_zero_only.rank != 0:
            return super()._get_next_version()  # a guess; Lightning broadcasts rank 0's folder where it matters
        return claim_version(self.root_dir)

    # TensorBoard appends to its event file from a thread of its own and raises a full disk, unnamed, at the next
    # write: each writing call names the run folder and its device instead (asked for only then: asking claims it).
    @rank_zero_only
    def log_metrics(self, metrics, step=None) -> None:
        with writing(lambda: self.log_dir):
            super().log_metrics(metrics, step)

    @rank_zero_only
    def log_hyperparams(self, params, metrics=None, step=None) -> None:
        with writing(lambda: self.log_dir):
            super().log_hyperparams(params, metrics, step)

    @rank_zero_only
    def log_graph(self, model, input_array=None) -> None:
        with writing(lambda: self.log_dir):
            super().log_graph(model, input_array)

    @rank_zero_only
    def save(self) -> None:
        with writing(lambda: self.log_dir):
            super().save()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        with writing(lambda: self.log_dir):
            super().finalize(status)


def run_folder(trainer) -> Path:
    """The run's folder as ``trainer.log_dir`` names it, without its broadcast (only rank 0 writes there)."""
    logger = trainer.logger
    folder = (logger.log_dir or logger.save_dir) if logger is not None else None
    return Path(folder or trainer.default_root_dir)


__all__ = ["RunLogger", "run_folder"]
