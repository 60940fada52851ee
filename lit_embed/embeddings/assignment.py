"""Which sub-embedding each token uses: the papers' Algorithm 1 (radix) and Algorithm 2 (clusters).

An assignment returns an ``(N, f)`` integer array of codes whose rows are distinct, so that every token
gets its own combination of sub-embeddings: codes in ``[0, Q)`` for radix and equal-size clusters; for
naive k-means, whose groups have any size, code ``k`` of a token lies below the rows table ``k`` needs
(:attr:`Assignment.tables_fit_codes`). Codes define the model: the subspace strategy stores them in a
persistent buffer, so a checkpoint restores them exactly.
"""

from __future__ import annotations

import hashlib
import logging
import math
from abc import ABC, abstractmethod
from typing import Literal

import numpy as np
import torch

from lit_embed.embeddings.pretrained import load_embedding_matrix
from lit_embed.errors import ConfigError
from lit_embed.storage.cache import cache_folder, read_codes, write_codes

log = logging.getLogger(__name__)


def smallest_table_size(num_tokens: int, num_tables: int) -> int:
    """The smallest Q with Q**f >= N.

    The papers write ``ceil(N^(1/f))`` and the released code ``floor(N^(1/f)) + 1``; for every N in
    the papers both equal this, but the float root can be off by one, so it is corrected in integers.
    """
    q = max(1, round(num_tokens ** (1.0 / num_tables)))
    while q**num_tables < num_tokens:
        q += 1
    while q > 1 and (q - 1) ** num_tables >= num_tokens:
        q -= 1
    return q


def check_capacity(num_tokens: int, num_tables: int, table_size: int) -> None:
    if table_size**num_tables < num_tokens:
        need = smallest_table_size(num_tokens, num_tables)
        raise ConfigError(
            f"Q={table_size} gives {table_size}^{num_tables}={table_size**num_tables} codes for {num_tokens} "
            f"tokens: raise Q to at least {need} (or use more tables)"
        )


def radix_codes(token_ids: np.ndarray, num_tables: int, table_size: int) -> np.ndarray:
    """Algorithm 1: digit k of n in base Q, least significant first: ``c_k(n) = floor(n / Q^k) mod Q``."""
    token_ids = np.asarray(token_ids, dtype=np.int64)
    powers = table_size ** np.arange(num_tables, dtype=np.int64)
    return (token_ids[:, None] // powers[None, :]) % table_size


class Assignment(ABC):
    """How tokens are mapped to code tuples; a plugin chosen in YAML by ``class_path``."""

    #: Whether the codes are cheap enough to compute when the strategy is built.
    eager: bool = True
    #: Whether each table holds as many rows as its largest code needs (naive k-means) instead of ``table_size``.
    tables_fit_codes: bool = False

    @abstractmethod
    def codes(self, num_tokens: int, num_tables: int, table_size: int) -> np.ndarray:
        """Distinct ``(num_tokens, num_tables)`` codes, in ``[0, table_size)`` unless ``tables_fit_codes``."""


class RadixAssignment(Assignment):
    """The papers' Algorithm 1: token n takes the base-Q digits of n."""

    def codes(self, num_tokens: int, num_tables: int, table_size: int) -> np.ndarray:
        check_capacity(num_tokens, num_tables, table_size)
        return radix_codes(np.arange(num_tokens), num_tables, table_size)

    def __repr__(self) -> str:
        return "RadixAssignment()"


class ClusterAssignment(Assignment):
    """The papers' Algorithm 2: recursive clustering of a pretrained embedding matrix.

    Digit 1 clusters all pretrained vectors into Q groups; digit 2 clusters each group separately
    into Q sub-groups; and so on. The last digit is a distinct index inside each group (drawn at
    random with ``seed``), so every token's code is unique. ``method="equal"`` makes the clusters of
    each split equal in size (within 1), so every table keeps Q rows. ``method="kmeans"`` is the papers'
    naive k-means (Lloyd's, uncapped): clusters take any size, a group of fewer than Q points gets fewer
    clusters, and the last digit of a group larger than Q runs past Q, so each table holds as many rows
    as the largest index it must hold (``tables_fit_codes``; the k-sub-embedding paper's Table 3 counts
    104k and 154k parameters for Q=100 and 200; equal sizes: 25.6k and 51.2k for Q=50 and 100).

    Computed once and cached on disk (:mod:`lit_embed.storage.cache`), keyed by a digest of the matrix and every argument.

    Args:
        source: a HuggingFace model name or folder (its input embedding matrix), or a matrix file
            (``.pt``, ``.npy``, ``.safetensors``) of shape ``(vocab_size, dim)``.
        method: ``"equal"`` (equal-size clusters) or ``"kmeans"`` (naive k-means).
        seed: seeds the k-means++ initialisation and the last digit.
        max_iter: Lloyd iterations per split.
        cache_dir: where computed codes are kept (default ``$LIT_EMBED_CACHE`` or ``~/.cache/lit_embed``).
    """

    eager = False

    def __init__(
        self,
        source: str,
        method: Literal["equal", "kmeans"] = "equal",
        seed: int = 0,
        max_iter: int = 20,
        cache_dir: str | None = None,
    ) -> None:
        if method not in ("equal", "kmeans"):
            raise ConfigError(f"method={method!r} is not a clustering method: use 'equal' or 'kmeans'")
        if max_iter < 1:
            raise ConfigError(f"max_iter={max_iter} must be at least 1")
        self.source = source
        self.method = method
        self.seed = seed
        self.max_iter = max_iter
        self.cache_dir = cache_dir

    def __repr__(self) -> str:
        return f"ClusterAssignment(source={self.source!r}, method={self.method!r}, seed={self.seed})"

    @property
    def tables_fit_codes(self) -> bool:
        return self.method == "kmeans"

    def codes(self, num_tokens: int, num_tables: int, table_size: int) -> np.ndarray:
        if self.method == "equal":
            check_capacity(num_tokens, num_tables, table_size)

        matrix = load_embedding_matrix(self.source)
        if matrix.shape[0] != num_tokens:
            raise ConfigError(
                f"pretrained matrix {self.source!r} has {matrix.shape[0]} rows but the vocabulary has "
                f"{num_tokens} tokens: use the matrix of the same tokenizer, or set vocab_size={matrix.shape[0]}"
            )
        key = self._cache_key(matrix, num_tables, table_size)
        path = cache_folder(self.cache_dir) / "assignments" / f"{key}.safetensors"
        cached = read_codes(path, key, (num_tokens, num_tables))
        if cached is not None:
            return cached
        codes = cluster_codes(matrix, num_tables, table_size, self.method, self.seed, self.max_iter)
        write_codes(path, key, codes)
        log.info("cluster assignment cached at %s", path)
        return codes

    def _cache_key(self, matrix: torch.Tensor, num_tables: int, table_size: int) -> str:
        digest = hashlib.sha256()
        digest.update(np.ascontiguousarray(matrix.numpy()).tobytes())
        version = ALGORITHM_VERSIONS[self.method]
        args = (version, tuple(matrix.shape), num_tables, table_size, self.method, self.seed, self.max_iter)
        digest.update(repr(args).encode())
        return digest.hexdigest()[:24]


#: Bumped when a method's codes change, so that cached codes of the old algorithm are not reused
#: (kmeans 3: uncapped, as the papers ran it).
ALGORITHM_VERSIONS = {"equal": 2, "kmeans": 3}


# -- the clustering ----------------------------------------------------------------------------------


def cluster_codes(
    matrix: torch.Tensor,
    num_tables: int,
    table_size: int,
    method: Literal["equal", "kmeans"] = "equal",
    seed: int = 0,
    max_iter: int = 20,
) -> np.ndarray:
    """Algorithm 2 on an ``(N, dim)`` matrix; see :class:`ClusterAssignment`."""
    x = matrix.detach().to(torch.float32).cpu()
    n = x.shape[0]
    if method == "equal":
        check_capacity(n, num_tables, table_size)
    generator = torch.Generator().manual_seed(seed)
    codes = np.zeros((n, num_tables), dtype=np.int64)
    groups = torch.zeros(n, dtype=torch.long)  # tokens with equal digits so far share a group
    for digit in range(num_tables - 1):
        labels, _ = grouped_kmeans(x, groups, table_size, method, generator, max_iter)
        codes[:, digit] = labels.numpy()
        groups = groups * table_size + labels
        groups = torch.unique(groups, return_inverse=True)[1]
    codes[:, -1] = distinct_random_digits(groups, table_size, generator).numpy()
    return codes


def distinct_random_digits(groups: torch.Tensor, table_size: int, generator: torch.Generator) -> torch.Tensor:
    """A distinct digit for every member of each group, drawn at random among ``max(Q, group size)``.

    Equal-size groups never exceed Q; a naive k-means group larger than Q needs a digit per member.
    """
    num_groups = int(groups.max()) + 1
    order = torch.argsort(groups, stable=True)
    sizes = torch.bincount(groups, minlength=num_groups)
    starts = torch.cumsum(sizes, 0) - sizes
    rank = torch.empty_like(groups)
    rank[order] = torch.arange(len(groups)) - starts[groups[order]]
    width = max(table_size, int(sizes.max()))
    scores = torch.rand(num_groups, width, generator=generator)
    if width > table_size:  # a group draws among max(Q, its size) digits: the others sort last
        scores[torch.arange(width)[None, :] >= sizes.clamp_min(table_size)[:, None]] = 2.0
    permutations = torch.argsort(scores, dim=1)
    return permutations[groups, rank]


def grouped_kmeans(
    x: torch.Tensor,
    groups: torch.Tensor,
    k: int,
    method: str,
    generator: torch.Generator,
    max_iter: int,
) -> tuple[torch.Tensor, float]:
    """Cluster the points of every group separately into ``k`` clusters (all groups at once).

    Returns local labels in ``[0, k)`` and the total inertia. ``method="equal"`` gives each
    group's clusters sizes that differ by at most 1; ``"kmeans"`` is plain Lloyd (nearest centroid,
    any size), its labels renumbered so that each group's non-empty clusters are ``0, 1, ...``.
    """
    num_groups = int(groups.max()) + 1
    # Sort points by group once, so every group is a contiguous slice in all that follows.
    order = torch.argsort(groups, stable=True)
    x, groups = x[order], groups[order]
    sizes = torch.bincount(groups, minlength=num_groups)
    bounds = [0, *torch.cumsum(sizes, 0).tolist()]
    slices = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    centroids = kmeans_plus_plus(x, slices, k, generator)  # (G, k, dim)
    sq = (x * x).sum(1)
    labels = torch.full((len(x),), -1, dtype=torch.long)
    for _ in range(max_iter):
        distances = group_distances(x, sq, slices, centroids)  # (n, k): point i against its group's clusters
        if method == "equal":
            new_labels = capacitated_assignment(distances, groups, equal_caps(distances, groups, sizes, k), k)
        else:
            new_labels = distances.argmin(1)
        converged = torch.equal(new_labels, labels)
        labels = new_labels
        centroids = update_centroids(x, groups, labels, centroids, k)
        if converged:
            break
    distances = group_distances(x, sq, slices, centroids)
    inertia = float(distances.gather(1, labels[:, None]).sum())
    if method != "equal":
        labels = renumber_non_empty(groups, labels, num_groups, k)
    unsorted = torch.empty_like(labels)
    unsorted[order] = labels
    return unsorted, inertia


def kmeans_plus_plus(x: torch.Tensor, slices: list[slice], k: int, generator: torch.Generator) -> torch.Tensor:
    """Greedy k-means++ seeding of every group (a slice of ``x``): ``(G, k, dim)`` centroids.

    Each step draws ``2 + ln k`` candidates with probability proportional to the squared distance
    to the nearest centre so far and keeps the one that lowers the potential most (scikit-learn's
    choice; plain k-means++ left Lloyd in worse optima). Distances come from one matrix product per
    step. A group with fewer than k points repeats points (those clusters stay empty).
    """
    trials = 2 + int(math.log(k))
    sq = (x * x).sum(1)
    centroids = torch.empty(len(slices), k, x.shape[1], dtype=x.dtype)
    for g, rows in enumerate(slices):
        points, norms = x[rows], sq[rows]
        first = int(torch.randint(len(points), (1,), generator=generator))
        chosen = [first]
        closest = (norms - 2.0 * points @ points[first] + norms[first]).clamp_min_(0.0)
        for _ in range(1, k):
            if float(closest.sum()) <= 0.0:  # every point is already a centre
                chosen.append(chosen[-1])
                continue
            candidates = torch.multinomial(closest, trials, replacement=True, generator=generator)
            d = torch.addmm(norms[candidates][None, :], points, points[candidates].T, alpha=-2.0)
            d = torch.minimum(d.add_(norms[:, None]).clamp_min_(0.0), closest[:, None])
            best = int(d.sum(0).argmin())
            chosen.append(int(candidates[best]))
            closest = d[:, best].contiguous()
        centroids[g] = points[chosen]
    return centroids


def group_distances(x: torch.Tensor, sq: torch.Tensor, slices: list[slice], centroids: torch.Tensor) -> torch.Tensor:
    """Squared distances of each point to the k centroids of its own group (groups are slices of x)."""
    out = torch.empty(len(x), centroids.shape[1])
    for c, rows in zip(centroids, slices):
        torch.addmm((c * c).sum(1)[None, :], x[rows], c.T, alpha=-2.0, out=out[rows])
        out[rows] += sq[rows, None]
    return out.clamp_min_(0.0)


def renumber_non_empty(groups: torch.Tensor, labels: torch.Tensor, num_groups: int, k: int) -> torch.Tensor:
    """Labels renumbered within each group so that its non-empty clusters are ``0, 1, ...`` in label order
    (k-means leaves clusters empty, and a group of fewer than k points fills fewer than k)."""
    flat = groups * k + labels
    used = torch.bincount(flat, minlength=num_groups * k).view(num_groups, k) > 0
    return (used.long().cumsum(1) - 1).flatten()[flat]


def equal_caps(distances: torch.Tensor, groups: torch.Tensor, sizes: torch.Tensor, k: int) -> torch.Tensor:
    """Room of every (group, cluster) for equal sizes: each group's size split into k parts within 1."""
    num_groups = len(sizes)
    floor, extra = sizes // k, sizes % k
    # The clusters most in demand (most points nearest to them) take the extra members.
    nearest = groups * k + distances.argmin(1)
    demand = torch.bincount(nearest, minlength=num_groups * k).view(num_groups, k)
    rank = torch.argsort(torch.argsort(-demand, dim=1, stable=True), dim=1)
    return (floor[:, None] + (rank < extra[:, None]).long()).flatten()


def capacitated_assignment(distances: torch.Tensor, groups: torch.Tensor, caps: torch.Tensor, k: int) -> torch.Tensor:
    """Assign points to clusters of their group without exceeding ``caps``, by deferred acceptance.

    Every unplaced point proposes to its nearest cluster that could still take it (one with room,
    or whose farthest member is farther than the point); each cluster keeps the closest proposals
    up to its cap and rejects the rest, which propose again. Skipping the clusters that would
    certainly reject a point changes nothing in the outcome but saves most rounds. All points are
    placed (each group's caps sum to at least its size); with slack caps this is plain
    nearest-centroid assignment in one round.
    """
    n = len(distances)
    held = torch.full((n,), -1, dtype=torch.long)  # global cluster id holding each point
    count = torch.zeros(len(caps), dtype=torch.long)
    worst = torch.full((len(caps),), float("inf"))  # farthest member of each full cluster
    free = torch.arange(n)
    columns = torch.arange(k)
    while len(free):
        options = groups[free, None] * k + columns[None, :]
        d = distances[free]
        allowed = (count[options] < caps[options]) | (d < worst[options])
        proposal = groups[free] * k + d.masked_fill(~allowed, float("inf")).argmin(1)
        touched = torch.zeros(len(caps), dtype=torch.bool)
        touched[proposal] = True
        incumbents = torch.nonzero(touched[held.clamp_min(0)] & (held >= 0)).squeeze(1)
        candidates = torch.cat([incumbents, free])
        cluster = torch.cat([held[incumbents], proposal])
        cost = distances[candidates, cluster % k].double()
        order = torch.argsort(cluster * (2.0 * float(cost.max()) + 1.0) + cost)  # by cluster, then distance
        sorted_cluster = cluster[order]
        counts = torch.bincount(sorted_cluster, minlength=len(caps))
        starts = torch.cumsum(counts, 0) - counts
        rank = torch.arange(len(order)) - starts[sorted_cluster]
        keep = rank < caps[sorted_cluster]
        winners, losers = candidates[order[keep]], candidates[order[~keep]]
        held[winners] = sorted_cluster[keep]
        held[losers] = -1
        count = torch.bincount(held[held >= 0], minlength=len(caps))
        full = count >= caps
        worst = torch.full((len(caps),), float("inf"))
        placed = torch.nonzero(held >= 0).squeeze(1)
        farthest = torch.zeros(len(caps)).scatter_reduce_(
            0, held[placed], distances[placed, held[placed] % k], reduce="amax", include_self=False
        )
        worst[full] = farthest[full]
        free = losers
    return held % k


def update_centroids(
    x: torch.Tensor, groups: torch.Tensor, labels: torch.Tensor, old: torch.Tensor, k: int
) -> torch.Tensor:
    """Means of each cluster's members; an empty cluster keeps its centroid."""
    num_groups = old.shape[0]
    flat = groups * k + labels
    sums = torch.zeros(num_groups * k, x.shape[1]).index_add_(0, flat, x)
    counts = torch.bincount(flat, minlength=num_groups * k).to(x.dtype)
    new = old.reshape(num_groups * k, -1).clone()
    nonempty = counts > 0
    new[nonempty] = sums[nonempty] / counts[nonempty, None]
    return new.view_as(old)
