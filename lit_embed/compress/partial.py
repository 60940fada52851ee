"""The paper's frequency-aware partial sparse coding (Tamura et al., CoNLL 2024) and its baselines: the common rows
of the table kept bit for bit, each rare row rebuilt from them: from its k nearest common rows with LLE weights and its
length (``sparse_coding``), from the top k principal components of the common rows (``pca``), or as the ``<unk>`` row
(``unk``). ``--budget`` sizes the common tokens in place of the retention split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from lit_embed.compress import methods
from lit_embed.compress.methods import CompressionMethod, Job
from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.embeddings.sizing import fit_budget
from lit_embed.embeddings.sparse_coded import (
    PartialEmbedding,
    PCAEmbedding,
    SparseCodedEmbedding,
    UnkEmbedding,
    rare_ids_of,
)
from lit_embed.errors import ConfigError
from lit_embed.progress import Progress

#: Ridge added to each k x k local Gram matrix, relative to its mean eigenvalue: it only matters when the
#: matrix is singular (a rare vector in the affine span of its neighbours, or duplicate neighbours).
LLE_RIDGE = 1e-6


def nearest_common(weight: Tensor, common_ids: Tensor, rare_ids: Tensor, ks: list[int]) -> tuple[Tensor, dict[int, Tensor]]:
    """The nearest common rows of each rare row by cosine, and LLE weights for each k in ``ks``.

    Returns ``neighbours`` ``(R, max(ks))`` (row numbers into ``common_ids``, most similar first) and
    ``{k: (R, k) weights}`` for the k nearest, so that choosing k on validation data costs one search.
    """
    common = F.normalize(weight[common_ids].float(), dim=-1)
    rare = F.normalize(weight[rare_ids].float(), dim=-1)
    chunk = max(1, methods.BLOCK_BYTES // (4 * max(1, len(common))))
    neighbours = torch.empty(len(rare), max(ks), dtype=torch.long)
    weights = {k: torch.empty(len(rare), k, dtype=torch.float64) for k in ks}
    progress = Progress("sparse coding,", "rare row", len(rare))
    for start in range(0, len(rare), chunk):
        targets = rare[start : start + chunk]
        picked = (targets @ common.T).topk(max(ks), dim=1).indices
        neighbours[start : start + chunk] = picked
        for k in ks:
            weights[k][start : start + chunk] = lle_weights(targets, common[picked[:, :k]])
        progress.update(min(start + chunk, len(rare)), final=start + chunk >= len(rare))
    return neighbours, weights


def lle_weights(targets: Tensor, neighbours: Tensor) -> Tensor:
    """Weights ``(n, k)`` summing to 1 that best rebuild each target ``(n, d)`` from its neighbours ``(n, k, d)``.

    The paper's eq. 2: ``w = C^-1 1 / (1^T C^-1 1)`` with the local Gram matrix
    ``C_jl = (y - x_j) . (y - x_l)``, built in float32 and solved for all targets at once in float64.
    """
    offsets = neighbours.float() - targets.float().unsqueeze(1)
    gram = (offsets @ offsets.transpose(1, 2)).double()
    k = gram.shape[-1]
    ridge = LLE_RIDGE * gram.diagonal(dim1=1, dim2=2).mean(-1) + 1e-12
    regularised = gram + ridge[:, None, None] * torch.eye(k, dtype=gram.dtype)
    solved = torch.linalg.solve(regularised, torch.ones(len(gram), k, 1, dtype=gram.dtype)).squeeze(-1)
    return solved / solved.sum(-1, keepdim=True)


def with_common_rows(cls: type[PartialEmbedding], weight: Tensor, common_ids: Tensor, **init) -> PartialEmbedding:
    """A partial strategy whose common rows are ``weight[common_ids]``, bit for bit; the rest is the caller's."""
    strategy = cls(*weight.shape, len(common_ids), **init)
    strategy.split(common_ids)
    with torch.no_grad():
        strategy.common.copy_(weight[common_ids])
    return strategy


def sparse_code(weight: Tensor, common_ids: Tensor, ks: list[int]) -> dict[int, SparseCodedEmbedding]:
    """The paper's method for each k in ``ks`` (one neighbour search for the largest).

    ``common_ids`` in increasing order (row ``i`` of the strategy's common table is ``common_ids[i]``).
    """
    rare_ids = rare_ids_of(len(weight), common_ids)
    neighbours, weights = nearest_common(weight, common_ids, rare_ids, ks)
    norms = weight[rare_ids].float().norm(dim=-1)
    out = {}
    for k in ks:
        strategy = with_common_rows(SparseCodedEmbedding, weight, common_ids, k=k)
        strategy.neighbours.copy_(neighbours[:, :k])
        strategy.weights.copy_(weights[k])
        strategy.norms.copy_(norms)
        out[k] = strategy
    return out


def unk_backoff(weight: Tensor, common_ids: Tensor, unk_id: int) -> UnkEmbedding:
    """The ``<unk>`` baseline (``unk_id`` must be common: special tokens always are)."""
    strategy = with_common_rows(UnkEmbedding, weight, common_ids)
    row = int(strategy.row_of[unk_id])
    if row < 0:
        raise ConfigError(f"the <unk> token (id {unk_id}) is not among the common tokens")
    strategy.unk_row.fill_(row)
    return strategy


def pca_code(weight: Tensor, common_ids: Tensor, ks: list[int]) -> dict[int, PCAEmbedding]:
    """The PCA baseline for each k in ``ks``: the top principal components of the common rows (one
    eigendecomposition of their covariance), and every rare row's coordinates on them."""
    common = weight[common_ids].double()
    mean = common.mean(0)
    centred = common - mean
    _, vectors = torch.linalg.eigh(centred.T @ centred)
    order = vectors.flip(-1).T  # components, largest variance first
    rare = weight[rare_ids_of(len(weight), common_ids)].double() - mean
    out = {}
    for k in ks:
        strategy = with_common_rows(PCAEmbedding, weight, common_ids, k=k)
        with torch.no_grad():
            strategy.components.copy_(order[:k])
            strategy.mean.copy_(mean)
        strategy.coordinates.copy_(rare @ order[:k].T)
        out[k] = strategy
    return out


@dataclass
class KChoice:
    """The k a method is fitted with.

    Args:
        k: common tokens per rare token (sparse_coding) or principal components (pca); several values
            (``[1, 2, 3, 4, 5]``) are each tried and the best on the validation split is kept (the paper's
            protocol; needs a fine-tuned lit-embed checkpoint and task data).
    """

    k: int | list[int] = 5

    def __post_init__(self) -> None:
        if not self.ks or min(self.ks) < 1:
            raise ConfigError(f"k={self.k} must be at least 1 (the paper: 1 to 5 for sparse coding, 1 to 10 for PCA)")

    @property
    def ks(self) -> list[int]:
        return sorted(set(self.k)) if isinstance(self.k, list) else [self.k]


class ChoosesK(CompressionMethod):
    """A method fitted for each k of its options, the best kept on validation."""

    Options = KChoice
    options: KChoice

    @property
    def tries(self) -> int:
        return len(self.options.ks)


@dataclass
class PartialOptions:
    """The budget that sizes a partial method's common tokens.

    Args:
        budget: size |V_C| to this many bytes at inference, or this fraction of the table's bytes, in place of the
            --retention split: the most frequent tokens in the data are common (specials first).
    """

    budget: int | float | None = None


@dataclass
class SparseCodingOptions(KChoice):
    """The k a method is fitted with, and the budget that sizes its common tokens.

    Args:
        budget: size |V_C| to this many bytes at inference, or this fraction of the table's bytes, in place of the
            --retention split: the most frequent tokens in the data are common (specials first); one k only.
    """

    budget: int | float | None = None


@dataclass
class PCAOptions(SparseCodingOptions):
    """The number of principal components (k), and the budget that sizes the common tokens (one k only)."""


def budgeted_common_ids(method: CompressionMethod, job: Job, partial: type[PartialEmbedding], sized_by: dict) -> Tensor:
    """The common ids of a partial ``method`` (the common rows kept, the rare ones rebuilt): the retention split's, or as
    many as its ``--budget`` leaves room for in ``partial`` (with ``sized_by``, its other arguments), the most frequent
    first: the split's unseen common ids (its special tokens) before all, then its other common ids, then the rest."""
    budget = getattr(method.options, "budget", None)
    if budget is None:
        return job.common_ids
    vocab, hidden = job.weight.shape
    sizing = fit_budget(partial, vocab, hidden, budget, sized_by)
    method.details["budget"] = sizing.describe()
    counts = job.counts if job.counts is not None else torch.zeros(vocab)
    common = torch.zeros(vocab, dtype=torch.bool)
    common[job.common_ids] = True
    group = torch.where(common & (counts == 0), 0, torch.where(common, 1, 2))
    ranked = sorted(range(vocab), key=lambda i: (int(group[i]), -float(counts[i]), i))
    return torch.tensor(sorted(ranked[: sizing.value]))


def one_k(options: KChoice, budget: int | float | None) -> None:
    """Refuse several k with a budget: it sizes the common tokens for one."""
    if budget is not None and len(options.ks) > 1:
        raise ConfigError(f"--budget sizes the common tokens for one k, and k={options.k}: give a single --k")


class SparseCoding(ChoosesK):
    """The paper's frequency-aware partial sparse coding (k nearest common rows, LLE weights, the length)."""

    name = "sparse_coding"
    Options = SparseCodingOptions
    options: SparseCodingOptions

    def common_ids(self, job: Job) -> Tensor:
        return budgeted_common_ids(self, job, SparseCodedEmbedding, {"k": self.options.ks[0]})

    def check(self, job: Job) -> None:
        k = max(self.options.ks)
        one_k(self.options, self.options.budget)
        common = len(self.common_ids(job))
        if k > common:
            raise ConfigError(f"k={k} exceeds |V_C|={common}, the common tokens to choose neighbours from: "
                              f"lower k or raise --retention")

    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        return sparse_code(job.weight, self.common_ids(job), self.options.ks)


class PCACoding(ChoosesK):
    """The PCA baseline: rare rows from the top k principal components of the common rows."""

    name = "pca"
    Options = PCAOptions
    options: PCAOptions

    def common_ids(self, job: Job) -> Tensor:
        return budgeted_common_ids(self, job, PCAEmbedding, {"k": self.options.ks[0]})

    def check(self, job: Job) -> None:
        one_k(self.options, self.options.budget)
        common, hidden, k = len(self.common_ids(job)), job.weight.shape[1], max(self.options.ks)
        if k > min(common, hidden):
            raise ConfigError(f"k={k} exceeds min(|V_C|={common}, hidden={hidden}), the principal components "
                              f"there are: lower k or raise --retention")

    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        return pca_code(job.weight, self.common_ids(job), self.options.ks)


class UnkBackoff(CompressionMethod):
    """The ``<unk>`` baseline: rare tokens take the fine-tuned ``<unk>`` row."""

    name = "unk"
    Options = PartialOptions
    options: PartialOptions

    def common_ids(self, job: Job) -> Tensor:
        return budgeted_common_ids(self, job, UnkEmbedding, {})

    def check(self, job: Job) -> None:
        if job.unk_id is None:
            raise ConfigError("the tokenizer has no <unk> token: the unk baseline needs one")
        self.common_ids(job)  # a budget it cannot meet is refused before the work

    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        return {None: unk_backoff(job.weight, self.common_ids(job), job.unk_id)}
