"""Step 2: fit a compressed strategy to a dense ``V x d`` table, given the common ids.

Each method is one :class:`CompressionMethod` subclass, found by its ``name`` (``--method NAME``, or
``method: NAME`` in a compress config): defining the class registers it, so a plugin's method is one class
and one YAML file, like a strategy. It declares its own options (a dataclass, ``Options``), which the generic
command offers once the method is named; nothing of one method's is in :class:`Job` or the command.
The paper's and its baselines: ``sparse_coding``, ``unk``, ``pca``, ``aq``; the zoo's post-hoc methods, each of the
whole table: ``svd`` (low rank), ``int8`` and ``int4`` (per-row scalar quantisation), ``pq`` (product quantisation),
``fit``, any vocabulary strategy fitted to the table (:class:`FitOptions`: its loss and stopping rule); and
``dense``, the table as it is, the uncompressed reference a comparison tests beside them. Every method takes
``--budget``: bytes at inference, or a fraction of the table's bytes (those of one size accept the budget their
bytes meet and refuse another, saying what they take).

Everything is batched in torch (matrix products in chunks of rare tokens, one batched k x k solve),
so the 30522 x 768 table of DistilBERT is sparse-coded in seconds on a CPU.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import math
import tempfile
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import torch
import yaml
from torch import Tensor, nn
from torch.nn import functional as F

from lit_embed.checkpoints.format import build_from_config, resolve_class
from lit_embed.compress import closed_form
from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.embeddings.dense import DenseEmbedding
from lit_embed.embeddings.factorised import FactorizedEmbedding
from lit_embed.embeddings.mixed_dimension import DATA
from lit_embed.embeddings.quantized import (
    AdditiveQuantizedEmbedding,
    ProductQuantizedEmbedding,
    ScalarQuantizedEmbedding,
)
from lit_embed.embeddings.sizing import BudgetError, budget_target, fit_budget
from lit_embed.embeddings.sparse_coded import (
    PartialEmbedding,
    PCAEmbedding,
    SparseCodedEmbedding,
    UnkEmbedding,
    rare_ids_of,
)
from lit_embed.errors import ConfigError, MissingFileError, not_known
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
        budget: size M to this many bytes at inference, or this fraction of the table's bytes (then codebooks is
            ignored): each codebook costs K d float32 values and a log2(K)-bit code per row (packed).
    """

    codebooks: int = 32
    codewords: int = 16
    epochs: int = 200
    max_steps: int | None = None
    batch_size: int = 64
    lr: float = 1e-4
    clip_norm: float = 0.001
    budget: int | float | None = None


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
    strategy.set_codes(codes.cpu())
    return strategy


# -- low rank, scalar and product quantisation ------------------------------------------------------------


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


@dataclass
class PQOptions:
    """Product quantisation's shape and its k-means.

    Args:
        groups: G, the groups the hidden dimensions split into (it must divide the hidden size).
        codewords: K, k-means centroids per group (at most 256, and the vocabulary size).
        iterations: k-means iterations in each group.
        backend: ``faiss`` (its k-means; it must be installed), ``torch`` (lit-embed's own, batched in torch), or
            ``auto``: faiss where installed, else torch.
        budget: size K to this many bytes at inference, or this fraction of the table's bytes (then codewords is
            ignored): the V x G codes (log2(K) bits each, packed) grow with K only by their bits.
    """

    groups: int = 8
    codewords: int = 256
    iterations: int = 20
    backend: Literal["auto", "faiss", "torch"] = "auto"
    budget: int | float | None = None


def nearest_centroid(points: Tensor, centroids: Tensor) -> Tensor:
    """The nearest centroid of each point by Euclidean distance (ties: the smaller index), in blocks."""
    chunk = max(1, BLOCK_BYTES // (4 * len(centroids)))
    squared = centroids.pow(2).sum(-1)
    return torch.cat([(squared - 2 * part @ centroids.T).argmin(-1) for part in points.split(chunk)])


def kmeans_plus_plus(points: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """k-means++ seeding (Arthur & Vassilvitskii 2007): each next centroid drawn with probability proportional to its
    squared distance from the nearest chosen one (uniformly once every point is a centroid's)."""
    chosen = [int(torch.randint(len(points), (1,), generator=generator))]
    distance = (points - points[chosen[0]]).pow(2).sum(-1)
    for _ in range(k - 1):
        total = distance.sum()
        weights = distance if total > 0 else torch.ones_like(distance)
        chosen.append(int(torch.multinomial(weights.double(), 1, generator=generator)))
        distance = torch.minimum(distance, (points - points[chosen[-1]]).pow(2).sum(-1))
    return points[chosen].clone()


def kmeans(points: Tensor, k: int, iterations: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Lloyd's k-means from k-means++ seeds drawn by ``generator``: ``(centroids, assignment)``; a cluster left
    empty keeps its centroid."""
    centroids = kmeans_plus_plus(points, k, generator)
    for _ in range(iterations):
        assignment = nearest_centroid(points, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, assignment, points)
        sizes = torch.bincount(assignment, minlength=k)
        filled = sizes > 0
        centroids[filled] = sums[filled] / sizes[filled, None]
    return centroids, nearest_centroid(points, centroids)


def faiss_kmeans(points: Tensor, k: int, iterations: int, seed: int) -> tuple[Tensor, Tensor]:
    """faiss's k-means (``faiss.Kmeans``), its centroids and each point's nearest."""
    import faiss

    data = np.ascontiguousarray(points.numpy(), dtype=np.float32)
    clustering = faiss.Kmeans(data.shape[1], k, niter=iterations, seed=seed, verbose=False)
    clustering.train(data)
    _, nearest = clustering.index.search(data, 1)
    return torch.from_numpy(clustering.centroids).float(), torch.from_numpy(nearest[:, 0]).long()


def product_quantize(weight: Tensor, options: PQOptions, seed: int = 0) -> tuple[ProductQuantizedEmbedding, str]:
    """k-means in each group of dimensions; returns the strategy and which k-means ran."""
    vocab, hidden = weight.shape
    strategy = ProductQuantizedEmbedding(vocab, hidden, groups=options.groups, codewords=options.codewords)
    if options.codewords > vocab:
        raise ConfigError(f"codewords={options.codewords} exceeds the vocabulary ({vocab} rows): lower --codewords")
    backend = options.backend
    if backend == "auto":
        backend = "faiss" if importlib.util.find_spec("faiss") is not None else "torch"
    elif backend == "faiss" and importlib.util.find_spec("faiss") is None:
        raise ConfigError("backend='faiss' but faiss is not installed: pip install faiss-cpu, or pass --backend torch")
    generator = torch.Generator().manual_seed(seed)
    width, chosen = hidden // options.groups, []
    for group, part in enumerate(weight.detach().float().split(width, dim=1)):
        part = part.contiguous()
        if backend == "faiss":
            centroids, codes = faiss_kmeans(part, options.codewords, options.iterations, seed + group)
        else:
            centroids, codes = kmeans(part, options.codewords, options.iterations, generator)
        with torch.no_grad():
            strategy.codebooks[group].copy_(centroids)
        chosen.append(codes)
    strategy.set_codes(torch.stack(chosen, 1))
    if backend == "faiss":
        import faiss

        return strategy, f"faiss {faiss.__version__}"
    return strategy, "torch (lit-embed's k-means++ and Lloyd" + (", faiss is not installed)" if options.backend == "auto" else ")")


# -- fit: any vocabulary strategy fitted to the table --------------------------------------------------------
#
# ``lit-embed compress --method fit --strategy YAML``: every zoo method then starts from a pretrained encoder without
# pre-training. The loss and the stopping rule are :class:`FitOptions`'s.


#: Rows whose loss is computed at once in an evaluation over the whole table.
EVAL_ROWS = 8192


@dataclass
class FitOptions:
    """Which strategy to fit, the loss and the stopping rule.

    The loss, per batch of rows ``B`` drawn uniformly at random (a seeded permutation, epoch after epoch)::

        L = sum_{i in B} w_i l_i / sum_{i in B} w_i,   l_i = mean_j (e_ij - x_ij)^2  (mse)   or   1 - cos(e_i, x_i)  (cosine)

    with ``e_i`` the strategy's row of token ``i`` and ``x_i`` the table's; ``w_i = log(2 + c_i)`` for ``c_i`` the
    token's count in the data (``weighting: frequency``: frequent rows weigh more, rare ones still count) or 1
    (``uniform``). Adam minimises it. The stopping rule, whichever comes first: ``max_steps`` steps; an evaluation of
    ``L`` over the whole table (every ``eval_every`` steps) improving on the best before it by less than ``tolerance``
    (relative); ``max_seconds`` of fitting. With the ``mse`` loss, a strategy whose rows are linear in its parameters
    is instead solved exactly (``solver: auto``; :mod:`lit_embed.compress.closed_form`: the hashing trick, ROBE, QR,
    hash embeddings, ALBERT's factorisation), in alternating rounds where two tensors multiply, stopped by the same
    ``tolerance`` between rounds or ``max_rounds``.

    Args:
        strategy: the strategy to fit: a YAML file of one (``configs/embedding/*.yaml``, ``budget:`` included) or its
            ``class_path``/``init_args`` inline; the vocabulary and hidden sizes are the table's.
        budget: size the strategy to this many bytes at inference, or this fraction of the table's bytes, in place of its
            file's ``budget`` (a sweep gives one strategy file several budgets).
        loss: ``mse`` (mean squared error of each row) or ``cosine`` (1 - cosine similarity of each row).
        weighting: ``frequency``: each row weighs log(2 + its count in the data); ``uniform``: all rows alike.
        max_steps: stop after this many steps.
        tolerance: stop when an evaluation of the loss over the whole table improves on the best before it by less
            than this fraction.
        eval_every: steps between evaluations over the whole table.
        max_seconds: stop after this many seconds of fitting (``null``: no limit).
        batch_size: rows per step.
        lr: Adam's learning rate.
        solver: ``closed_form``: least squares solved exactly (``mse`` only; refused for a strategy without one);
            ``gradient``: Adam; ``auto``: the closed form where the strategy has one and the loss is ``mse``.
        max_rounds: stop alternating least squares after this many rounds.
    """

    strategy: str | dict | None = None
    budget: int | float | None = None
    loss: Literal["mse", "cosine"] = "mse"
    weighting: Literal["frequency", "uniform"] = "frequency"
    max_steps: int = 2000
    tolerance: float = 1e-3
    eval_every: int = 100
    max_seconds: float | None = None
    batch_size: int = 1024
    lr: float = 1e-2
    solver: Literal["auto", "closed_form", "gradient"] = "auto"
    max_rounds: int = 100

    def check(self) -> None:
        if self.strategy is None:
            raise ConfigError("method 'fit' needs --strategy: a strategy YAML (configs/embedding/*.yaml) to fit")
        if self.loss not in ("mse", "cosine") or self.weighting not in ("frequency", "uniform"):
            raise ConfigError(f"loss={self.loss!r} must be 'mse' or 'cosine', weighting={self.weighting!r} 'frequency' "
                              f"or 'uniform'")
        if self.solver not in ("auto", "closed_form", "gradient"):
            raise ConfigError(f"solver={self.solver!r} must be 'auto', 'closed_form' or 'gradient'")
        if self.solver == "closed_form" and self.loss != "mse":
            raise ConfigError(f"solver='closed_form' solves the mse loss, not loss={self.loss!r}: use solver 'gradient'")
        for name in ("max_steps", "eval_every", "batch_size", "max_rounds"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be at least 1")
        if self.lr <= 0 or self.tolerance < 0 or (self.max_seconds is not None and self.max_seconds <= 0):
            raise ConfigError(f"lr={self.lr} and max_seconds={self.max_seconds} must be positive, tolerance="
                              f"{self.tolerance} at least 0")

    def describe(self, closed_form: str | None = None) -> dict[str, str]:
        """The loss and the stopping rule in words, for the report (``closed_form``: how it was solved, where it was)."""
        weights = "log(2 + the token's count in the data)" if self.weighting == "frequency" else "1"
        row = "mean squared error" if self.loss == "mse" else "1 - cosine similarity"
        if closed_form is not None:
            return {"loss": f"{row} of each rebuilt row, weighted by {weights}; solved in closed form: {closed_form}",
                    "stopping rule": f"exact in one solve; alternating rounds stop when one improves the whole-table loss "
                                     f"by less than {self.tolerance:g}, or after {self.max_rounds}"}
        limit = "" if self.max_seconds is None else f", or {self.max_seconds:g} s"
        return {
            "loss": f"{row} of each rebuilt row, weighted by {weights}; Adam lr {self.lr:g}, {self.batch_size} rows a step",
            "stopping rule": f"{self.max_steps} steps, or a whole-table loss (every {self.eval_every} steps) improving "
                             f"by less than {self.tolerance:g} of the best before it{limit}",
        }


class NoVocabularyError(ConfigError):
    """A strategy with no row per vocabulary id (the HashFormers hash words): there is no table to fit it to, so its
    post-hoc cell of a comparison does not exist (a sweep leaves it out and says so, as a budget it cannot meet)."""


def strategy_from(given: str | dict, vocab_size: int, hidden_size: int, budget: int | float | None = None,
                  counts: Tensor | None = None) -> EmbeddingStrategy:
    """The strategy a YAML file (or an inline config) describes, built for a ``vocab_size x hidden_size`` table
    (sized to ``budget`` where given; ranking tokens by ``counts``, the data's, where it asks for them:
    ``frequencies: data``)."""
    config = given
    if isinstance(given, str):
        path = Path(given).expanduser()
        if not path.is_file():
            raise MissingFileError(f"strategy {given!r} does not exist: give a strategy YAML (configs/embedding/*.yaml)")
        config = yaml.safe_load(path.read_text())
    if not isinstance(config, dict) or "class_path" not in config:
        raise ConfigError(f"strategy {given!r} is not a strategy config: it needs a class_path (and init_args), as "
                          f"configs/embedding/*.yaml have")
    cls = resolve_class(str(config["class_path"]))
    if isinstance(cls, type) and issubclass(cls, EmbeddingStrategy) and (cls.unlimited_vocabulary or tuple(cls.code_shape)):
        raise NoVocabularyError(f"{cls.__name__} does not index vocabulary ids, so it has no row per token to fit to the "
                          f"table: choose a vocabulary strategy (configs/embedding/: hashing_trick, qr, tt, ...)")
    init = {**(config.get("init_args") or {}), "vocab_size": vocab_size, "hidden_size": hidden_size}
    if budget is not None:
        init["budget"] = budget
    frequencies = inspect.signature(cls).parameters.get("frequencies") if isinstance(cls, type) else None
    if frequencies is None or init.get("frequencies", frequencies.default) != DATA or init.get("block_dims"):
        return build_from_config(EmbeddingStrategy, {"class_path": config["class_path"], "init_args": init}, "embedding")
    if counts is None:  # a budget its structure cannot meet is said first (a sweep's plan counts nothing)
        if budget is not None:
            fit_budget(cls, vocab_size, hidden_size, budget, {k: v for k, v in init.items()
                                                               if k not in ("vocab_size", "hidden_size", "budget")})
        raise ConfigError(f"{config['class_path']} ranks tokens by the data's counts (frequencies: data) and none were "
                          f"counted: give --data, or a count file as its frequencies")
    with tempfile.TemporaryDirectory() as folder:  # the strategy reads it once, when built: its buffers keep the ranking
        path = Path(folder) / "token_counts.txt"
        path.write_text("".join(f"{count}\n" for count in counts.tolist()))
        init["frequencies"] = str(path)
        return build_from_config(EmbeddingStrategy, {"class_path": config["class_path"], "init_args": init}, "embedding")


def row_losses(rebuilt: Tensor, target: Tensor, loss: str) -> Tensor:
    """Each row's loss ``l_i``."""
    if loss == "cosine":
        return 1.0 - F.cosine_similarity(rebuilt, target, dim=-1)
    return (rebuilt - target).pow(2).mean(-1)


def fit_strategy(strategy: EmbeddingStrategy, weight: Tensor, counts: Tensor | None, options: FitOptions, seed: int = 0,
                 device: str = "cpu") -> dict:
    """Fit ``strategy``'s parameters to ``weight`` (in place) under the module's loss and stopping rule, in closed form
    where :func:`closed_form_of` finds one; returns what happened (steps or rounds, why it stopped, the first and last
    whole-table loss, seconds)."""
    started = time.perf_counter()
    strategy.prepare()
    vocab = len(weight)
    frequent = counts is not None and options.weighting == "frequency"
    weights = torch.log(2.0 + counts.double()).float() if frequent else torch.ones(vocab)
    exact = closed_form_of(strategy, options)
    if exact is not None:
        target = weight.detach().float().cpu()
        strategy.cpu().eval()
        return closed_form.fit_closed_form(strategy, exact[0], target, weights, options.tolerance, options.max_rounds,
                                           lambda: weighted_loss(strategy, target, weights, options.loss))
    strategy.to(device).train()
    target, weights = weight.detach().float().to(device), weights.to(device)
    optimizer = torch.optim.Adam([p for p in strategy.parameters() if p.requires_grad], lr=options.lr)
    order = torch.Generator().manual_seed(seed)

    first = best = weighted_loss(strategy, target, weights, options.loss)
    steps, stopped = 0, f"max_steps ({options.max_steps})"
    batches: list[Tensor] = []
    while steps < options.max_steps:
        if not batches:
            batches = list(torch.randperm(vocab, generator=order).split(options.batch_size))[::-1]
        ids = batches.pop()
        w = weights[ids]
        loss = (row_losses(strategy(ids.to(device)), target[ids], options.loss) * w).sum() / w.sum()
        term = strategy.auxiliary_loss()  # the strategy's own (DPQ-VQ's centroids learn from it)
        loss = loss if term is None else loss + term
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        steps += 1
        if not math.isfinite(float(loss.detach())):
            raise ConfigError(f"fitting {type(strategy).__name__} diverged at step {steps} (loss {float(loss.detach())}): lower --lr")
        if options.max_seconds is not None and time.perf_counter() - started >= options.max_seconds:
            stopped = f"max_seconds ({options.max_seconds:g})"
            break
        if steps % options.eval_every == 0 and steps < options.max_steps:
            now = weighted_loss(strategy, target, weights, options.loss)
            if best - now < options.tolerance * best:
                stopped = f"tolerance (whole-table loss {now:.4g} against the best {best:.4g})"
                break
            best = now
    last = weighted_loss(strategy, target, weights, options.loss)
    strategy.eval().cpu()
    return {"steps": steps, "stopped by": stopped, "loss before": round(first, 6), "loss after": round(last, 6),
            "seconds": round(time.perf_counter() - started, 2)}


def closed_form_of(strategy: EmbeddingStrategy, options: FitOptions) -> tuple[list[closed_form.Step], str] | None:
    """The exact steps that fit ``strategy`` and how they solve it, where ``options`` ask for them and it has them;
    ``None``: gradient descent fits it. ``solver: closed_form`` for a strategy without one is refused."""
    if options.solver == "gradient" or options.loss != "mse":
        return None
    found = closed_form.steps_of(strategy)
    if found is None and options.solver == "closed_form":
        raise ConfigError(f"{type(strategy).__name__} has no closed-form fit (its rows are not linear in its parameters): "
                          f"use solver 'gradient' or 'auto'")
    return found


def weighted_loss(strategy: EmbeddingStrategy, target: Tensor, weights: Tensor, loss: str) -> float:
    """The loss ``L`` over the whole table."""
    with torch.no_grad():
        total = sum(float((row_losses(strategy(ids.to(target.device)), target[ids], loss) * weights[ids]).sum())
                    for ids in torch.arange(len(target)).split(EVAL_ROWS))
    return total / float(weights.sum())


# -- the methods, by name -----------------------------------------------------------------------------


@dataclass
class Job:
    """What a method compresses: the dense table, its common ids (increasing; specials included), the tokenizer's
    ``<unk>`` id, each id's count in the data (``None`` where none were counted), and where and how reproducibly to
    work. Nothing here belongs to one method: a method's own settings are its :attr:`CompressionMethod.Options`."""

    weight: Tensor
    common_ids: Tensor
    unk_id: int | None = None
    counts: Tensor | None = None
    seed: int = 0
    device: str = "cpu"


@dataclass
class NoOptions:
    """A method that takes no options."""


class CompressionMethod(ABC):
    """A post-hoc compression of a dense ``V x d`` table into a strategy.

    Subclasses set ``name`` (registering the class under it), declare their options as a dataclass (``Options``:
    the command offers its fields as ``--FIELD`` and as keys of a compress config, and checks them) and implement
    :meth:`fit`. What they want said in the report (what was chosen, which backend ran) goes into :attr:`details`.
    """

    name: ClassVar[str]
    Options: ClassVar[type] = NoOptions
    registry: ClassVar[dict[str, type[CompressionMethod]]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if name is not None:
            known = CompressionMethod.registry.get(name)
            if known is not None and known.__qualname__ != cls.__qualname__:
                raise ConfigError(f"compression method {name!r} is defined twice ({known.__module__} and {cls.__module__})")
            CompressionMethod.registry[name] = cls

    def __init__(self, options: object | None = None) -> None:
        self.options = self.Options() if options is None else options
        self.details: dict[str, object] = {}

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in fields(cls.Options)]

    @property
    def tries(self) -> int:
        """How many candidates :meth:`fit` gives (more than one: the best on the validation split is kept)."""
        return 1

    def check(self, job: Job) -> None:  # noqa: B027 (an optional hook: most methods can do any job)
        """Refuse what cannot be done (before any work), naming the value and the fix."""

    @abstractmethod
    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        """The compressed strategies to choose from, by k (``None`` where k plays no part)."""


def method_class(name: str) -> type[CompressionMethod]:
    """The method registered as ``name``; a clear error naming the known ones otherwise."""
    if name not in CompressionMethod.registry:
        raise not_known("method", name, CompressionMethod.registry)
    return CompressionMethod.registry[name]


def method_named(name: str, options: dict | None = None) -> CompressionMethod:
    """The method ``name`` with ``options`` (its own, by field name); an unknown option is refused, naming the
    method's options and the closest one."""
    cls = method_class(name)
    known = cls.option_names()
    for key in options or {}:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            listed = ", ".join(known) if known else "none"
            raise ConfigError(f"{key!r} is not an option of compression method {name!r}: {hint}its options: {listed}")
    return cls(cls.Options(**(options or {})))


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
class FixedSizeOptions:
    """A method of one size: the budget, accepted where its bytes meet it.

    Args:
        budget: the bytes at inference (or fraction of the table's bytes) the method must meet within 1%; its bytes are
            fixed, so a budget it does not meet is refused, saying what it takes.
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


class AdditiveQuantization(CompressionMethod):
    """Additive quantization of the whole table (Shu & Nakayama; M codebooks of K vectors)."""

    name = "aq"
    Options = AQOptions
    options: AQOptions

    def check(self, job: Job) -> None:
        self.sized(job)  # a budget it cannot meet is refused before the training

    def sized(self, job: Job) -> AQOptions:
        """The options, with the codebooks the budget chose where one is given."""
        if self.options.budget is None:
            return self.options
        vocab, hidden = job.weight.shape
        sizing = fit_budget(AdditiveQuantizedEmbedding, vocab, hidden, self.options.budget, {"codewords": self.options.codewords})
        self.details["budget"] = sizing.describe()
        return replace(self.options, codebooks=int(sizing.value or 0))

    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        return {None: additive_quantize(job.weight, self.sized(job), seed=job.seed, device=job.device)}


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


def check_fixed_budget(method: CompressionMethod, job: Job, cls: type[EmbeddingStrategy], arguments: dict) -> None:
    """Accept the ``--budget`` of a ``method`` of one size (``cls(**arguments)``'s bytes) where they meet it within 1%;
    refuse another, saying what they take."""
    budget = getattr(method.options, "budget", None)
    if budget is None:
        return
    vocab, hidden = job.weight.shape
    try:
        method.details["budget"] = fit_budget(cls, vocab, hidden, budget, arguments).describe()
    except BudgetError:  # its bytes are fixed: say what they are
        reach, dense = cls.count_bytes(vocab, hidden, **arguments), vocab * hidden * 4
        target = budget_target(budget, vocab, hidden, method.name)
        raise BudgetError(f"{method.name} cannot meet budget={budget} ({target:,} bytes, {100 * target / dense:.3g}% of "
                          f"the table) within 1%: it takes {reach:,} bytes, {100 * reach / dense:.3g}% of the table, at "
                          f"any budget; ask for that, or leave --budget unset") from None


class ScalarQuantization(CompressionMethod):
    """Per-row scalar quantisation of the whole table to ``bits`` bits (each row's min to max in equal steps)."""

    bits: ClassVar[int]
    Options = FixedSizeOptions

    def check(self, job: Job) -> None:
        check_fixed_budget(self, job, ScalarQuantizedEmbedding, {"bits": self.bits})

    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        self.check(job)
        strategy = ScalarQuantizedEmbedding(*job.weight.shape, bits=self.bits)
        strategy.quantize(job.weight)
        return {None: strategy}


class KeepDense(CompressionMethod):
    """The table as it is, a dense float32 embedding: the uncompressed reference, compressed and tested as every
    method is (a comparison's PRR is against it)."""

    name = "dense"
    Options = FixedSizeOptions

    def check(self, job: Job) -> None:
        check_fixed_budget(self, job, DenseEmbedding, {})

    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        self.check(job)
        strategy = DenseEmbedding(*job.weight.shape)
        strategy.load_pretrained(job.weight.detach().float().cpu())
        return {None: strategy}


class Int8(ScalarQuantization):
    """8-bit codes, one per byte."""

    name = "int8"
    bits = 8


class Int4(ScalarQuantization):
    """4-bit codes, two per byte."""

    name = "int4"
    bits = 4


class ProductQuantization(CompressionMethod):
    """Product quantisation of the whole table: k-means in each of G groups of dimensions (faiss where installed)."""

    name = "pq"
    Options = PQOptions
    options: PQOptions

    def check(self, job: Job) -> None:
        vocab, hidden = job.weight.shape
        if self.options.groups < 1 or hidden % self.options.groups:
            raise ConfigError(f"groups={self.options.groups} must divide the hidden size {hidden}: change --groups")
        if self.options.budget is not None:  # a budget the codes leave no room for is refused before the k-means
            fit_budget(ProductQuantizedEmbedding, vocab, hidden, self.options.budget, {"groups": self.options.groups})

    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        options = self.options
        if options.budget is not None:
            vocab, hidden = job.weight.shape
            sizing = fit_budget(ProductQuantizedEmbedding, vocab, hidden, options.budget, {"groups": options.groups})
            options, self.details["budget"] = replace(options, codewords=int(sizing.value or 0)), sizing.describe()
        strategy, self.details["k-means"] = product_quantize(job.weight, options, job.seed)
        return {None: strategy}


class StrategyFit(CompressionMethod):
    """Any vocabulary strategy (``--strategy YAML``) fitted to the table by gradient descent
    (:class:`FitOptions`: the loss and the stopping rule)."""

    name = "fit"
    Options = FitOptions
    options: FitOptions

    def check(self, job: Job) -> None:
        self.options.check()
        # a bad strategy file or class, a budget it cannot meet, or a closed form it has not, fails before any work
        closed_form_of(self.strategy(job), self.options)

    def strategy(self, job: Job) -> EmbeddingStrategy:
        """The strategy to fit, built for the job's table (sized to the budget where given)."""
        options = self.options
        assert isinstance(options, FitOptions) and options.strategy is not None  # check() refuses a missing one
        vocab, hidden = job.weight.shape
        return strategy_from(options.strategy, vocab, hidden, options.budget, job.counts)

    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(job.seed)
            strategy = self.strategy(job)
        exact = closed_form_of(strategy, self.options)
        self.details.update({"strategy": type(strategy).__name__, **self.options.describe(exact and exact[1])})
        if strategy.sizing is not None:
            self.details["budget"] = strategy.sizing.describe()
        self.details.update(fit_strategy(strategy, job.weight, job.counts, self.options, job.seed, job.device))
        return {None: strategy}
