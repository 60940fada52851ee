"""Step 2: fit a compressed strategy to a dense ``V x d`` table, given the common ids.

Each method is one :class:`CompressionMethod` subclass, found by its ``name`` (``--method NAME``, or
``method: NAME`` in a compress config): defining the class registers it, so a plugin's method is one class
and one YAML file, like a strategy. The paper's and its baselines: ``sparse_coding``, ``unk``, ``pca``, ``aq``.

Everything is batched in torch (matrix products in chunks of rare tokens, one batched k x k solve),
so the 30522 x 768 table of DistilBERT is sparse-coded in seconds on a CPU.
"""

from __future__ import annotations

import difflib
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.embeddings.quantized import AdditiveQuantizedEmbedding
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
#: Bytes of the rare x common similarity block computed at once.
BLOCK_BYTES = 1 << 27


def nearest_common(weight: Tensor, common_ids: Tensor, rare_ids: Tensor, ks: list[int]) -> tuple[Tensor, dict[int, Tensor]]:
    """The nearest common rows of each rare row by cosine, and LLE weights for each k in ``ks``.

    Returns ``neighbours`` ``(R, max(ks))`` (row numbers into ``common_ids``, most similar first) and
    ``{k: (R, k) weights}`` for the k nearest, so that choosing k on validation data costs one search.
    """
    common = F.normalize(weight[common_ids].float(), dim=-1)
    rare = F.normalize(weight[rare_ids].float(), dim=-1)
    chunk = max(1, BLOCK_BYTES // (4 * max(1, len(common))))
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


# -- additive quantization ----------------------------------------------------------------------------


@dataclass
class AQOptions:
    """Additive quantization as the sparse-coding paper ran it (Shu & Nakayama's released code).

    Args:
        codebooks: M.
        codewords: K, vectors per codebook.
        epochs: passes over the table (the released code's default 200).
        max_steps: stop after this many batches (for quick runs); default all epochs.
        batch_size: rows per step.
        lr: Adam's learning rate.
        clip_norm: gradients are clipped to this global norm, as in the released code.
    """

    codebooks: int = 32
    codewords: int = 16
    epochs: int = 200
    max_steps: int | None = None
    batch_size: int = 64
    lr: float = 1e-4
    clip_norm: float = 0.001


class CodeLearner(nn.Module):
    """Shu & Nakayama's encoder: ``h = tanh(A x)``, code logits ``log(softplus(B h) + 1e-8)`` per codebook;
    a Gumbel-softmax (tau = 1) picks soft codes whose codebook vectors are summed."""

    def __init__(self, hidden_size: int, codebooks: int, codewords: int) -> None:
        super().__init__()
        self.shape = (codebooks, codewords)
        self.encode = nn.Linear(hidden_size, codebooks * codewords // 2)
        self.score = nn.Linear(codebooks * codewords // 2, codebooks * codewords)
        self.codebooks = nn.Parameter(torch.empty(codebooks * codewords, hidden_size))
        for p in self.parameters():  # the released code's initialiser
            nn.init.uniform_(p, -0.01, 0.01)

    def logits(self, rows: Tensor) -> Tensor:
        scores = self.score(torch.tanh(self.encode(rows)))
        return torch.log(F.softplus(scores) + 1e-8).view(len(rows), *self.shape)

    def forward(self, rows: Tensor, generator: torch.Generator) -> Tensor:
        logits = self.logits(rows)
        uniform = torch.rand(logits.shape, generator=generator, device=rows.device).clamp(1e-10, 1.0 - 1e-7)
        soft = (logits - torch.log(-torch.log(uniform))).softmax(-1)  # Gumbel-softmax, tau = 1
        return soft.flatten(1) @ self.codebooks


def additive_quantize(weight: Tensor, options: AQOptions, seed: int = 0, device: str = "cpu") -> AdditiveQuantizedEmbedding:
    """Learn codebooks and codes for every row of ``weight`` (loss ``0.5 ||y_hat - y||^2``, Adam);
    the codes are the argmax of the encoder's logits."""
    vocab, hidden = weight.shape
    strategy = AdditiveQuantizedEmbedding(vocab, hidden, options.codebooks, options.codewords)
    if options.epochs < 1 or options.batch_size < 1 or (options.max_steps is not None and options.max_steps < 1):
        raise ConfigError(f"AQ needs epochs, batch_size and max_steps of at least 1 (got {options})")
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        learner = CodeLearner(hidden, options.codebooks, options.codewords).to(device)
    rows = weight.detach().float().to(device)
    optimizer = torch.optim.Adam(learner.parameters(), lr=options.lr)
    order = torch.Generator().manual_seed(seed)
    steps = 0
    total = options.epochs * math.ceil(vocab / options.batch_size)
    progress = Progress("AQ", "step", total if options.max_steps is None else min(total, options.max_steps))
    for _ in range(options.epochs):
        for batch in torch.randperm(vocab, generator=order).split(options.batch_size):
            target = rows[batch.to(device)]
            loss = 0.5 * (learner(target, generator) - target).pow(2).sum(-1).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(learner.parameters(), options.clip_norm)
            optimizer.step()
            steps += 1
            progress.update(steps, lambda loss=loss: {"loss": float(loss)}, final=steps == progress.total)
            if options.max_steps is not None and steps >= options.max_steps:
                break
        if options.max_steps is not None and steps >= options.max_steps:
            break
    with torch.no_grad():
        codes = torch.cat([learner.logits(part).argmax(-1) for part in rows.split(4096)])
        strategy.codebooks.copy_(learner.codebooks.view(options.codebooks, options.codewords, hidden).cpu())
    strategy.codes.copy_(codes.cpu().to(torch.uint8))
    return strategy


# -- the methods, by name -----------------------------------------------------------------------------


@dataclass
class Job:
    """What a method compresses: the dense table, its common ids (increasing; specials included), the k to
    try, the tokenizer's ``<unk>`` id, and where and how reproducibly to work."""

    weight: Tensor
    common_ids: Tensor
    ks: list[int]
    unk_id: int | None = None
    seed: int = 0
    device: str = "cpu"
    aq: AQOptions = field(default_factory=AQOptions)


class CompressionMethod(ABC):
    """A post-hoc compression of a dense ``V x d`` table into a strategy.

    Subclasses set ``name`` (registering the class under it) and implement :meth:`fit`; ``uses_k`` says
    whether ``k`` means something to them (then several k are tried and the best on validation kept).
    """

    name: ClassVar[str]
    uses_k: ClassVar[bool] = False
    registry: ClassVar[dict[str, type[CompressionMethod]]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if name is not None:
            known = CompressionMethod.registry.get(name)
            if known is not None and known.__qualname__ != cls.__qualname__:
                raise ConfigError(f"compression method {name!r} is defined twice ({known.__module__} and {cls.__module__})")
            CompressionMethod.registry[name] = cls

    def check(self, job: Job) -> None:  # noqa: B027 (an optional hook: most methods can do any job)
        """Refuse what cannot be done (before any work), naming the value and the fix."""

    @abstractmethod
    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        """The compressed strategies to choose from, by k (``None`` where k plays no part)."""


def method_named(name: str) -> CompressionMethod:
    """The method registered as ``name``; a clear error naming the known ones otherwise."""
    if name not in CompressionMethod.registry:
        near = difflib.get_close_matches(name, CompressionMethod.registry, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise ConfigError(f"method={name!r} is not known: {hint}use one of {sorted(CompressionMethod.registry)}")
    return CompressionMethod.registry[name]()


class SparseCoding(CompressionMethod):
    """The paper's frequency-aware partial sparse coding (k nearest common rows, LLE weights, the length)."""

    name = "sparse_coding"
    uses_k = True

    def check(self, job: Job) -> None:
        common = len(job.common_ids)
        if max(job.ks) > common:
            raise ConfigError(f"k={max(job.ks)} exceeds |V_C|={common}, the common tokens to choose neighbours from: "
                              f"lower k or raise --retention")

    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        return sparse_code(job.weight, job.common_ids, job.ks)


class PCACoding(CompressionMethod):
    """The PCA baseline: rare rows from the top k principal components of the common rows."""

    name = "pca"
    uses_k = True

    def check(self, job: Job) -> None:
        common, hidden = len(job.common_ids), job.weight.shape[1]
        if max(job.ks) > min(common, hidden):
            raise ConfigError(f"k={max(job.ks)} exceeds min(|V_C|={common}, hidden={hidden}), the principal components "
                              f"there are: lower k or raise --retention")

    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        return pca_code(job.weight, job.common_ids, job.ks)


class UnkBackoff(CompressionMethod):
    """The ``<unk>`` baseline: rare tokens take the fine-tuned ``<unk>`` row."""

    name = "unk"

    def check(self, job: Job) -> None:
        if job.unk_id is None:
            raise ConfigError("the tokenizer has no <unk> token: the unk baseline needs one")

    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        return {None: unk_backoff(job.weight, job.common_ids, job.unk_id)}


class AdditiveQuantization(CompressionMethod):
    """Additive quantization of the whole table (Shu & Nakayama; M codebooks of K vectors)."""

    name = "aq"

    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        return {None: additive_quantize(job.weight, job.aq, seed=job.seed, device=job.device)}
