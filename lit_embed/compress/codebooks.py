"""Codebook quantisation of the whole table: product quantisation (``pq``: k-means in each of G groups of dimensions,
faiss's where installed, else lit-embed's k-means++ and Lloyd in torch) and additive quantisation (``aq``: M codebooks
of K vectors summed, learnt as Shu & Nakayama's released code learns them).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lit_embed.compress import methods
from lit_embed.compress.methods import CompressionMethod, Job
from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.embeddings.quantized import (
    AdditiveQuantizedEmbedding,
    ProductQuantizedEmbedding,
)
from lit_embed.embeddings.sizing import fit_budget
from lit_embed.errors import ConfigError
from lit_embed.progress import Progress


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
    chunk = max(1, methods.BLOCK_BYTES // (4 * len(centroids)))
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
