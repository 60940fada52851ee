"""``svd``: the best rank-r approximation of the (centred) table, kept as ALBERT's factorised embedding with a bias
(rank from ``--rank`` or ``--budget``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lit_embed.compress.methods import CompressionMethod, Job
from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.embeddings.factorised import FactorizedEmbedding
from lit_embed.embeddings.sizing import fit_budget
from lit_embed.errors import ConfigError


@dataclass
class SVDOptions:
    """Low-rank SVD's size.

    Args:
        rank: r, the singular vectors kept (at most the hidden size).
        budget: size r to this many bytes at inference, or this fraction of the dense table's bytes (then rank is ignored).
    """

    rank: int = 64
    budget: int | float | None = None


def low_rank(weight: Tensor, rank: int = 64, budget: int | float | None = None) -> FactorizedEmbedding:
    """The best rank-r approximation of the centred table (Eckart-Young), as ALBERT's factorised embedding with a bias:
    the ``V x r`` table ``U_r S_r``, the projection ``V_r^T`` and the bias the mean row; ``V r + r d + d`` parameters."""
    vocab, hidden = weight.shape
    strategy = FactorizedEmbedding(vocab, hidden, rank=rank, bias=True, budget=budget)
    r = strategy.rank
    if r > min(vocab, hidden):
        raise ConfigError(f"rank={r} exceeds min(vocabulary={vocab}, hidden={hidden}), the singular vectors there are: "
                          f"lower --rank")
    rows = weight.detach().double()
    mean = rows.mean(0)
    u, s, vh = torch.linalg.svd(rows - mean, full_matrices=False)
    with torch.no_grad():
        strategy.table.copy_(u[:, :r] * s[:r])
        strategy.projection.weight.copy_(vh[:r].T)
        strategy.projection.bias.copy_(mean)
    return strategy


class LowRank(CompressionMethod):
    """Low-rank SVD of the whole (centred) table, kept as a factorised embedding (rank from --rank or --budget)."""

    name = "svd"
    Options = SVDOptions

    def check(self, job: Job) -> None:
        vocab, hidden = job.weight.shape
        options = self.options
        assert isinstance(options, SVDOptions)
        if options.budget is not None:  # a budget the factorisation cannot meet is refused before the SVD
            fit_budget(FactorizedEmbedding, vocab, hidden, options.budget, {"rank": options.rank, "bias": True})
        if self.options.budget is None and not 1 <= self.options.rank <= min(vocab, hidden):
            raise ConfigError(f"rank={self.options.rank} must lie in [1, min(vocabulary={vocab}, hidden={hidden})]: "
                              f"change --rank")

    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        strategy = low_rank(job.weight, self.options.rank, self.options.budget)
        self.details["rank"] = strategy.rank
        if strategy.sizing is not None:
            self.details["budget"] = strategy.sizing.describe()
        return {None: strategy}
