"""The exact softmax of a tied decoder whose vocabulary is a grid of sub-embedding codes, without its logits.

Token ``v`` sits at cell ``(c_1(v), ..., c_f(v))`` of an ``R_1 x ... x R_f`` grid and its logit is
``sum_k s_k[c_k(v)] + b_v``, where ``s_k`` scores table k's rows. So the partition function of position m is a
contraction over the grid, ``Z_m = sum_cells W[cell] * prod_k x_k[m, c_k]``, with ``W = exp(b - max b)`` at each
token's cell (every token has a cell of its own: the codes are distinct), 0 at empty cells, and
``x_k = exp(s_k - max s_k)``: every term is positive, nothing cancels. Contracting table 1 is one GEMM of ``W`` as ``(R_2...R_f) x R_1`` with the ``R_1 x M`` scores (``V x M``
multiply-adds, where the logits alone are ``V x M`` values written and read, and the dense decoder ``V x d x M``);
the other tables are small reductions. The gradient is autograd's of the same contraction.

Computed in fp32 whatever the autocast dtype (the contraction is cheap; the scores keep the compute dtype). The
shifts bound each term by 1, so ``Z`` cannot overflow; it underflows (a position's loss becomes infinite) only where
the largest logit lies more than about 87 nats (fp32's range) below the sum of the per-table maxima and the bias
maximum, far beyond the scores of a trained or initialised model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: A grid is contracted where it has at most this many cells per vocabulary id (radix codes: 50,653 cells for
#: RoBERTa's 50,265 ids; naive k-means codes may need a far larger grid, whose contraction costs more than logits).
MAX_CELLS_PER_TOKEN = 2


def cell_index(codes: Tensor, rows: list[int]) -> Tensor:
    """Each token's flat cell in the grid, table 1's digit varying fastest: ``sum_k c_k * R_1 ... R_(k-1)``."""
    strides = torch.tensor([math.prod(rows[:k]) for k in range(len(rows))], device=codes.device)
    return (codes * strides).sum(-1)


def fits_grid(vocab_size: int, rows: list[int]) -> bool:
    """Whether the grid is small enough that its contraction beats the logits (:data:`MAX_CELLS_PER_TOKEN`)."""
    return math.prod(rows) <= MAX_CELLS_PER_TOKEN * vocab_size


def grid_log_partition(scores: list[Tensor], bias: Tensor, cells: Tensor, rows: list[int]) -> Tensor:
    """``log Z_m`` of every position: ``scores[k]`` is ``(M, R_k)``, ``bias`` ``(V,)``, ``cells`` each token's flat
    cell (:func:`cell_index`). Exactly ``logsumexp`` over the ``M x V`` logits, which are never built."""
    with torch.autocast(scores[0].device.type, enabled=False):
        bias = bias.float()
        bias_max = bias.detach().max()
        # scatter, not index_add: each cell holds one token, and a CUDA scatter is deterministic where an add is not
        weights = torch.zeros(math.prod(rows), device=bias.device).scatter(0, cells, (bias - bias_max).exp())
        shift = bias_max
        total = weights.view(-1, rows[0])
        for k, s in enumerate(scores):
            s = s.float()
            top = s.detach().amax(-1, keepdim=True)  # (M, 1)
            x = (s - top).exp()  # (M, R_k)
            shift = shift + top.squeeze(-1)
            if k == 0:
                total = total @ x.T  # (R_2...R_f, M): the one GEMM
            else:
                total = (total.view(-1, rows[k], x.shape[0]) * x.T).sum(1)
        return total.squeeze(0).log() + shift


def grid_nll(scores: list[Tensor], bias: Tensor, cells: Tensor, rows: list[int], codes: Tensor, targets: Tensor) -> Tensor:
    """``-log p(target)`` at each position: :func:`grid_log_partition` less the target's logit, the sum of its f scores
    (``codes`` are every token's ``(V, f)`` rows) and its bias."""
    target_codes = codes[targets]  # (M, f)
    logit = bias[targets].float()
    for k, s in enumerate(scores):
        logit = logit + s.gather(1, target_codes[:, k : k + 1]).squeeze(1).float()
    return grid_log_partition(scores, bias, cells, rows) - logit
