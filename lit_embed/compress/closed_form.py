"""Closed-form fits of a strategy to a dense table (``compress --method fit``, ``solver: auto``), where one exists.

The fit's weighted squared error ``sum_x w_x ||e_x - t_x||^2`` is a least-squares problem wherever the strategy's rows
are linear in one parameter tensor with the others fixed: ``e_x = sum_i a_xi theta[c_xi]``, a fixed sparse assignment
of each row to a few parameter rows. Its normal equations ``(A^T W A) theta = A^T W T`` are built from each row's
few entries and solved exactly:

- one entry per row (the hashing trick, ROBE, k-sub-embeddings, QR's concatenation and each half of its product): ``A^T W A`` is
  diagonal, so each parameter is the weighted mean of what it rebuilds (``index_add``, no matrix);
- a few entries per row (QR's sum, hash embeddings' pool, their importance weights): ``A^T W A`` is a sparse
  ``P x P`` matrix, factorised once for all ``d`` right-hand sides: Cholesky (dense, LAPACK) up to
  :data:`DENSE_SIZE` rows, where a sparse LU's fill-in is nearly dense anyway, SuperLU (``scipy.sparse.linalg.splu``)
  above it. Exact where an iterative solver (lsqr, CG) stops at a tolerance, and cheap here (``P`` at most the
  table's rows).

A ridge of :data:`RIDGE` times the mean diagonal only decides the parameters no row reads (they become 0) and the
directions the rows cannot tell apart (QR's sum shifts a constant between its tables). Where two parameter tensors
multiply (QR's product, hash embeddings' weights times pool), they are solved in turn, each exactly given the other
(alternating least squares: the loss never rises), until a round improves the whole-table loss by less than the
fit's ``tolerance`` or after ``max_rounds``. ALBERT's factorisation is the weighted truncated SVD (Eckart-Young with
row weights: the rows scaled by ``sqrt(w)``; with its bias, centred on the weighted mean).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import scipy.sparse
import scipy.sparse.linalg
import torch
from torch import Tensor

from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.embeddings.factorised import FactorizedEmbedding, QREmbedding
from lit_embed.embeddings.hashed_ids import (
    HashingTrickEmbedding,
    ROBEEmbedding,
    WeightedHashEmbedding,
    hash_ids,
)
from lit_embed.embeddings.subspace import SubspaceEmbedding

#: The ridge added to the normal equations' diagonal, relative to its mean.
RIDGE = 1e-10
#: Up to this many parameter rows the normal matrix is factorised dense (Cholesky, LAPACK: at these sizes a sparse LU's
#: fill-in is nearly dense anyway, and slower), above it sparse (SuperLU).
DENSE_SIZE = 8192

#: One exact step: solve one parameter tensor given the others, from the table ``(V, d)`` and row weights ``(V,)``.
Step = Callable[[EmbeddingStrategy, Tensor, Tensor], None]


def normal_solve(columns: Tensor, gram: Tensor, rhs: Tensor, size: int) -> Tensor:
    """Solve ``sum_n G_n theta = sum_n b_n`` for ``theta`` ``(size, c)``, where row ``n`` of the design reads the
    ``k`` parameter rows ``columns[n]`` ``(n, k)``, adding ``gram[n]`` ``(n, k, k)`` to the normal matrix at those
    rows and columns and ``rhs[n]`` ``(n, k, c)`` to the right-hand side (weights already in both)."""
    k = columns.shape[1]
    right = torch.zeros(size, rhs.shape[-1], dtype=torch.float64).index_add_(0, columns.reshape(-1), rhs.reshape(-1, rhs.shape[-1]))
    if k == 1:  # a diagonal system: each parameter on its own
        diagonal = torch.zeros(size, dtype=torch.float64).index_add_(0, columns[:, 0], gram[:, 0, 0])
        ridge = RIDGE * float(diagonal.mean()) + 1e-300
        return right / (diagonal + ridge).unsqueeze(-1)
    rows = columns.unsqueeze(2).expand(-1, k, k).reshape(-1)
    cols = columns.unsqueeze(1).expand(-1, k, k).reshape(-1)
    if size <= DENSE_SIZE:
        matrix = torch.zeros(size * size, dtype=torch.float64).index_add_(0, rows * size + cols, gram.reshape(-1))
        matrix = matrix.view(size, size)
        ridge = RIDGE * float(matrix.diagonal().mean()) + 1e-300
        matrix.diagonal().add_(ridge)
        return torch.cholesky_solve(right, torch.linalg.cholesky(matrix))
    sparse = scipy.sparse.coo_array((gram.reshape(-1).numpy(), (rows.numpy(), cols.numpy())), shape=(size, size)).tocsc()
    ridge = RIDGE * float(sparse.diagonal().mean()) + 1e-300
    factor = scipy.sparse.linalg.splu((sparse + ridge * scipy.sparse.identity(size, format="csc")).tocsc())
    return torch.from_numpy(np.asarray(factor.solve(right.numpy()))).reshape(size, -1)


def assign(parameter: Tensor, values: Tensor) -> None:
    with torch.no_grad():
        parameter.copy_(values.reshape(parameter.shape).to(parameter.dtype))


def shared_design(columns: Tensor, coefficients: Tensor, target: Tensor, weights: Tensor, size: int) -> Tensor:
    """The least-squares ``theta`` ``(size, c)`` for ``t_x ~ sum_i a_xi theta[c_xi]`` (one design for every column):
    ``columns`` and ``coefficients`` ``(V, k)``, ``target`` ``(V, c)``, ``weights`` ``(V,)``."""
    weighted = coefficients * weights.unsqueeze(-1)
    gram = weighted.unsqueeze(-1) * coefficients.unsqueeze(-2)
    return normal_solve(columns, gram, weighted.unsqueeze(-1) * target.unsqueeze(1), size)


def elementwise(columns: Tensor, coefficients: Tensor, target: Tensor, weights: Tensor, size: int) -> Tensor:
    """The least-squares ``theta`` ``(size,)`` for ``t_xj ~ a_xj theta[c_xj]``, one parameter per value (all ``(V, d)``)."""
    weighted = coefficients * weights.unsqueeze(-1)
    return normal_solve(columns.reshape(-1, 1), (weighted * coefficients).reshape(-1, 1, 1),
                        (weighted * target).reshape(-1, 1, 1), size)


def hashing_trick(strategy: EmbeddingStrategy, target: Tensor, weights: Tensor) -> None:
    assert isinstance(strategy, HashingTrickEmbedding)
    ids = torch.arange(len(target))
    bucket = strategy.hashed(ids, strategy.num_buckets)[:, :1]
    sign = strategy.hashed(ids, 2)[:, 1:].double() * 2 - 1 if strategy.signed else torch.ones(len(ids), 1, dtype=torch.float64)
    assign(strategy.weight, shared_design(bucket, sign, target, weights, strategy.num_buckets))


def robe(strategy: EmbeddingStrategy, target: Tensor, weights: Tensor) -> None:
    assert isinstance(strategy, ROBEEmbedding)
    keys = torch.arange(len(target)).unsqueeze(-1) * strategy.num_blocks + torch.arange(strategy.num_blocks)
    hashed = strategy.hashed(keys, strategy.memory)
    index = (hashed[..., 0].unsqueeze(-1) + torch.arange(strategy.block_size)) % strategy.memory
    signs = ((hashed[..., 1] % 2).double() * 2 - 1).unsqueeze(-1).expand(index.shape)
    width = strategy.hidden_size
    solved = elementwise(index.flatten(1)[:, :width], signs.flatten(1)[:, :width], target, weights, strategy.memory)
    assign(strategy.array, solved)


def qr_parts(strategy: QREmbedding, size: int) -> tuple[Tensor, Tensor]:
    ids = torch.arange(size)
    return ids // strategy.remainder_rows, ids % strategy.remainder_rows


def qr_sum_or_concat(strategy: EmbeddingStrategy, target: Tensor, weights: Tensor) -> None:
    assert isinstance(strategy, QREmbedding)
    quotient, remainder = qr_parts(strategy, len(target))
    rows = len(strategy.quotient)
    if strategy.operation == "add":
        columns = torch.stack([quotient, rows + remainder], 1)
        solved = shared_design(columns, torch.ones(columns.shape, dtype=torch.float64), target, weights,
                               rows + strategy.remainder_rows)
        assign(strategy.quotient, solved[:rows])
        assign(strategy.remainder, solved[rows:])
        return
    half = strategy.quotient.shape[1]
    ones = torch.ones(len(target), 1, dtype=torch.float64)
    assign(strategy.quotient, shared_design(quotient[:, None], ones, target[:, :half], weights, rows))
    assign(strategy.remainder, shared_design(remainder[:, None], ones, target[:, half:], weights, strategy.remainder_rows))


def qr_product_step(which: str) -> Step:
    """QR's product, one table given the other: each value of the table the weighted least squares of its own."""

    def step(strategy: EmbeddingStrategy, target: Tensor, weights: Tensor) -> None:
        assert isinstance(strategy, QREmbedding)
        quotient, remainder = qr_parts(strategy, len(target))
        solving, own, other, other_rows = ((strategy.quotient, quotient, strategy.remainder, remainder) if which == "quotient"
                                           else (strategy.remainder, remainder, strategy.quotient, quotient))
        width = target.shape[1]
        columns = own.unsqueeze(-1) * width + torch.arange(width)
        fixed = other.detach().double()[other_rows]
        assign(solving, elementwise(columns, fixed, target, weights, solving.numel()))

    return step


def sub_embeddings(strategy: EmbeddingStrategy, target: Tensor, weights: Tensor) -> None:
    """k-sub-embeddings: each table's row the weighted mean of its slice of the rows whose code picks it."""
    assert isinstance(strategy, SubspaceEmbedding)
    start = 0
    ones = torch.ones(len(target), 1, dtype=torch.float64)
    for k, table in enumerate(strategy.tables):
        part = target[:, start : start + table.shape[1]]
        assign(table, shared_design(strategy.codes[: len(target), k : k + 1].long(), ones, part, weights, len(table)))
        start += table.shape[1]


def hash_slots(strategy: WeightedHashEmbedding, ids: Tensor) -> Tensor:
    """Each id's row of the importance table."""
    if strategy.importance_rows is None:
        return ids
    return hash_ids(ids, strategy.importance_hash, strategy.importance_rows)[:, 0]


def hash_pool(strategy: EmbeddingStrategy, target: Tensor, weights: Tensor) -> None:
    """Hash embeddings' pool given the importance weights: ``e_x = sum_i p_xi pool[h_i(x)]``."""
    assert isinstance(strategy, WeightedHashEmbedding)
    ids = torch.arange(len(target))
    importance = strategy.importance.detach().double()[hash_slots(strategy, ids)]
    width = strategy.pool.shape[1]
    assign(strategy.pool, shared_design(strategy.hashed(ids, strategy.num_buckets), importance, target[:, :width], weights,
                                        strategy.num_buckets))


def hash_importance(strategy: EmbeddingStrategy, target: Tensor, weights: Tensor) -> None:
    """Hash embeddings' importance weights given the pool: each importance row's k weights, the least squares of the
    ids hashed to it (and of the weights themselves where they are appended)."""
    assert isinstance(strategy, WeightedHashEmbedding)
    ids = torch.arange(len(target))
    k, width = strategy.num_hashes, strategy.pool.shape[1]
    vectors = strategy.pool.detach().double()[strategy.hashed(ids, strategy.num_buckets)]  # (V, k, width)
    gram = vectors @ vectors.transpose(1, 2)
    rhs = (vectors @ target[:, :width].unsqueeze(-1)).squeeze(-1)
    if strategy.append_weights:  # the appended columns are the weights themselves
        gram = gram + torch.eye(k, dtype=torch.float64)
        rhs = rhs + target[:, width:]
    columns = hash_slots(strategy, ids).unsqueeze(-1) * k + torch.arange(k)
    solved = normal_solve(columns, gram * weights[:, None, None], (rhs * weights[:, None]).unsqueeze(-1),
                          strategy.importance.numel())
    assign(strategy.importance, solved)


def factorised(strategy: EmbeddingStrategy, target: Tensor, weights: Tensor) -> None:
    """The weighted truncated SVD: ``sqrt(w) (T - b) = U S V^T``, table ``U_r S_r / sqrt(w)``, projection ``V_r^T``."""
    assert isinstance(strategy, FactorizedEmbedding)
    mean = (weights.unsqueeze(-1) * target).sum(0) / weights.sum() if strategy.bias else torch.zeros(target.shape[1], dtype=torch.float64)
    root = weights.sqrt().unsqueeze(-1)
    u, s, vh = torch.linalg.svd(root * (target - mean), full_matrices=False)
    r = strategy.rank
    padded = torch.zeros(len(target), r, dtype=torch.float64)  # a rank above the table's: the extra columns stay 0
    padded[:, : min(r, len(s))] = (u * s)[:, :r] / root
    projection = torch.zeros(r, target.shape[1], dtype=torch.float64)
    projection[: min(r, len(s))] = vh[:r]
    assign(strategy.table, padded)
    assign(strategy.projection.weight, projection.T)
    if strategy.bias:
        assign(strategy.projection.bias, mean)


def steps_of(strategy: EmbeddingStrategy) -> tuple[list[Step], str] | None:
    """The exact steps that fit ``strategy`` and how they are solved, in words; ``None`` where there is no closed form."""
    if isinstance(strategy, HashingTrickEmbedding):
        return [hashing_trick], "least squares, each bucket the weighted mean of its signed rows"
    if isinstance(strategy, ROBEEmbedding):
        return [robe], "least squares, each array value the weighted mean of the signed values it rebuilds"
    if isinstance(strategy, SubspaceEmbedding):
        return [sub_embeddings], "least squares, each table row the weighted mean of the slices its code picks"
    if isinstance(strategy, QREmbedding) and strategy.operation != "mult":
        how = "sparse normal equations by SuperLU" if strategy.operation == "add" else "each table row a weighted mean"
        return [qr_sum_or_concat], f"least squares, {how}"
    if isinstance(strategy, QREmbedding):
        return [qr_product_step("quotient"), qr_product_step("remainder")], "alternating least squares of the two tables"
    if isinstance(strategy, WeightedHashEmbedding):
        return [hash_pool, hash_importance], ("alternating least squares: the pool by sparse normal equations (SuperLU), "
                                              "then each importance row's k weights")
    if type(strategy) is FactorizedEmbedding:
        return [factorised], "weighted truncated SVD (Eckart-Young)"
    return None


def fit_closed_form(strategy: EmbeddingStrategy, steps: list[Step], target: Tensor, weights: Tensor, tolerance: float,
                    max_rounds: int, loss: Callable[[], float]) -> dict:
    """Run ``steps`` in turn (one round: each once) until a round improves ``loss()`` by less than ``tolerance``
    (relative) or ``max_rounds``; one round where there is one step (it is exact). Returns the rounds, why it stopped
    and the loss before and after."""
    started = time.perf_counter()
    target, weights = target.double().cpu(), weights.double().cpu()
    before = loss()
    rounds, stopped, best = 0, "exact (one solve)", before
    while True:
        for step in steps:
            step(strategy, target, weights)
        rounds += 1
        if len(steps) == 1:
            break
        now = loss()
        if best - now < tolerance * best:
            stopped = f"tolerance (whole-table loss {now:.4g} against the round before's {best:.4g})"
            break
        best = now
        if rounds >= max_rounds:
            stopped = f"max_rounds ({max_rounds})"
            break
    return {"rounds": rounds, "stopped by": stopped, "loss before": round(before, 6), "loss after": round(loss(), 6),
            "seconds": round(time.perf_counter() - started, 2)}
