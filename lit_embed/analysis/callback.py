"""The k-sub-embedding paper's plots at the end of training (see :mod:`lit_embed.analysis.embedding_space`)."""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
from pytorch_lightning.loggers import TensorBoardLogger

from lit_embed.analysis.embedding_space import ANALYSIS_DIR, analyse, read_texts, save_analysis
from lit_embed.data.base import TextDataModule
from lit_embed.errors import ConfigError
from lit_embed.models.base import EmbeddingModule


class EmbeddingAnalysis(pl.Callback):
    """PCA of the embedding vectors, layer-wise hidden-state similarity and each layer's PCA of hidden states
    (the/to/and/of/a highlighted) when training ends.

    PNGs and ``analysis.json`` go to ``RUN_DIR/analysis/``; the figures also go to TensorBoard. Rank 0
    runs the model on its own (no collective), so it works under DDP.

    Args:
        text: sample text for the hidden states: a local file or ``sample-corpus`` (ships with lit-embed).
        tokenizer: how that text is tokenised (default: the data module's ``tokenizer``).
        max_texts: texts run through the model.
        points: embedding vectors drawn in the scatter.
    """

    def __init__(self, text: str = "sample-corpus", tokenizer: str | None = None, max_texts: int = 200,
                 points: int = 10_000) -> None:
        if max_texts < 1 or points < 1:
            raise ConfigError(f"max_texts={max_texts} and points={points} must be positive")
        self.text = text
        self.tokenizer = tokenizer
        self.max_texts = max_texts
        self.points = points

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not isinstance(pl_module, EmbeddingModule):
            raise ConfigError(f"EmbeddingAnalysis needs a lit-embed EmbeddingModule, got {type(pl_module).__name__}")
        if self._tokenizer(trainer) is None:
            raise ConfigError("EmbeddingAnalysis needs a tokenizer: set its `tokenizer`, or use a data module that has one")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        run_dir = Path(trainer.log_dir or trainer.default_root_dir)  # a collective: every rank asks
        if not trainer.is_global_zero:
            return
        result = analyse(pl_module, read_texts(self.text, self.max_texts), self._tokenizer(trainer), points=self.points)
        logger = next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)
        save_analysis(result, run_dir / ANALYSIS_DIR, logger.experiment if logger else None, step=trainer.global_step)

    def _tokenizer(self, trainer: pl.Trainer) -> str | None:
        data = trainer.datamodule
        return self.tokenizer or (data.tokenizer if isinstance(data, TextDataModule) else None)
