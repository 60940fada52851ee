"""A compression method: the dense table folded onto as many rows as there are common tokens."""

from __future__ import annotations

import torch

from lit_embed.compress.methods import CompressionMethod, Job
from lit_embed.embeddings.base import EmbeddingStrategy
from litembed_testplugin.strategies import FoldedEmbedding


class Fold(CompressionMethod):
    """A :class:`FoldedEmbedding` of ``|V_C|`` rows fitted to the dense table: each row is the mean of the dense rows
    folded onto it, the least-squares fit."""

    name = "fold"

    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        vocab, hidden = job.weight.shape
        strategy = FoldedEmbedding(vocab, hidden, rows=len(job.common_ids))
        rows = torch.arange(vocab) % strategy.rows
        sums = torch.zeros(strategy.rows, hidden, dtype=torch.float64).index_add_(0, rows, job.weight.double())
        counts = torch.bincount(rows, minlength=strategy.rows).clamp(min=1)
        with torch.no_grad():
            strategy.table.weight.copy_(sums / counts[:, None])
        return {None: strategy}
