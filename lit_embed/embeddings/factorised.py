"""Strategies that factorise the ``V x d`` table: a low-rank product, complementary partitions, a tensor train.

Each indexes a tokenizer's ids; none holds the ``V x d`` table, and the tied decoder scores the factors where that
is cheaper than building it.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from lit_embed.embeddings.assignment import smallest_table_size
from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.errors import ConfigError


class FactorizedEmbedding(EmbeddingStrategy):
    """ALBERT's factorised embedding (Lan et al., "ALBERT: A Lite BERT for Self-supervised Learning of Language
    Representations", ICLR 2020, §3.1): a ``V x E`` table projected to ``H`` by an ``E x H`` map, ``O(V E + E H)``
    parameters instead of ``O(V H)``. ALBERT's released model gives the map a bias (``bias: true``, H more).

    Args:
        rank: E, the table's width.
        bias: add a bias to the projection.
        init_std: standard deviation of the normal initialisation (ALBERT's 0.02).
        budget: size E to this many bytes at inference, or this fraction of the dense table's bytes.
    """

    size_parameter = "rank"

    def __init__(self, vocab_size: int, hidden_size: int, rank: int = 128, bias: bool = False, init_std: float = 0.02,
                 budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size)
        if rank < 1:
            raise ConfigError(f"rank={rank} must be at least 1")
        self.rank, self.bias, self.init_std = rank, bias, init_std
        self.table = nn.Parameter(torch.empty(vocab_size, rank).normal_(0.0, init_std))
        self.projection = nn.Linear(rank, hidden_size, bias=bias)
        nn.init.normal_(self.projection.weight, 0.0, init_std)
        if bias:
            nn.init.zeros_(self.projection.bias)

    @classmethod
    def count_parameters(cls, vocab_size: int, hidden_size: int, rank: int = 128, bias: bool = False, **_) -> int:
        return vocab_size * rank + rank * hidden_size + (hidden_size if bias else 0)

    @classmethod
    def size_range(cls, vocab_size: int, hidden_size: int, **_) -> tuple[int, int]:
        return 1, hidden_size

    def forward(self, codes: Tensor) -> Tensor:
        return self.projection(nn.functional.embedding(codes, self.table))

    def decoder_logits(self, hidden: Tensor) -> Tensor:
        """``h (T P^T + b)^T`` as ``(h P) T^T + h b``: an ``M x E`` product, never the ``V x H`` matrix."""
        logits = (hidden @ self.projection.weight) @ self.table.T
        return logits if self.projection.bias is None else logits + (hidden @ self.projection.bias).unsqueeze(-1)


Operation = Literal["mult", "add", "concat"]


class QREmbedding(EmbeddingStrategy):
    """Compositional quotient-remainder embedding (Shi et al., "Compositional Embeddings Using Complementary
    Partitions for Memory-Efficient Recommendation Systems", KDD 2020): id x takes row ``x // m`` of a quotient table
    of ``ceil(V / m)`` rows and row ``x % m`` of a remainder table of ``m`` rows, two complementary partitions, so
    no two ids share both; the rows are combined by ``mult`` (element-wise product, the paper's best), ``add`` or
    ``concat`` (each table then ``d / 2`` wide). Parameters: ``(ceil(V / m) + m) d`` (``concat``: each table its width).

    With ``concat`` this is the 2-sub-embedding with radix codes (:class:`SubspaceEmbedding`, f = 2, Q = m) but for
    the quotient table's ``ceil(V / m)`` rows where sub-embeddings give every table Q.

    Args:
        remainder_rows: m, the remainder table's rows (the paper's number of collisions).
        operation: how the two rows combine.
        init_range: tables start uniform in ``[-init_range, init_range]`` (``mult``: the quotient table near 1, so a
            product starts near the remainder row).
        budget: size m to this many bytes at inference, or this fraction of the dense table's bytes (m from ``sqrt(V)``, where the
            count is smallest, up).
    """

    size_parameter = "remainder_rows"

    def __init__(self, vocab_size: int, hidden_size: int, remainder_rows: int = 256, operation: Operation = "mult",
                 init_range: float = 0.1, budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size)
        if operation not in ("mult", "add", "concat"):
            raise ConfigError(f"operation={operation!r} must be 'mult', 'add' or 'concat'")
        if not 1 <= remainder_rows <= vocab_size:
            raise ConfigError(f"remainder_rows={remainder_rows} must lie in [1, vocab_size={vocab_size}]")
        if operation == "concat" and hidden_size < 2:
            raise ConfigError(f"operation 'concat' splits hidden_size={hidden_size} in two: it must be at least 2")
        self.remainder_rows, self.operation, self.init_range = remainder_rows, operation, init_range
        quotient_width, remainder_width = self.widths(hidden_size, operation)
        self.quotient = nn.Parameter(torch.empty(-(-vocab_size // remainder_rows), quotient_width))
        self.remainder = nn.Parameter(torch.empty(remainder_rows, remainder_width))
        nn.init.uniform_(self.remainder, -init_range, init_range)
        centre = 1.0 if operation == "mult" else 0.0
        nn.init.uniform_(self.quotient, centre - init_range, centre + init_range)

    @staticmethod
    def widths(hidden_size: int, operation: str) -> tuple[int, int]:
        return (hidden_size // 2, hidden_size - hidden_size // 2) if operation == "concat" else (hidden_size, hidden_size)

    @classmethod
    def count_parameters(cls, vocab_size: int, hidden_size: int, remainder_rows: int = 256, operation: str = "mult",
                         **_) -> int:
        quotient_width, remainder_width = cls.widths(hidden_size, operation)
        return -(-vocab_size // remainder_rows) * quotient_width + remainder_rows * remainder_width

    @classmethod
    def size_range(cls, vocab_size: int, hidden_size: int, **_) -> tuple[int, int]:
        return math.isqrt(vocab_size - 1) + 1 if vocab_size > 1 else 1, vocab_size

    def forward(self, codes: Tensor) -> Tensor:
        quotient = nn.functional.embedding(codes // self.remainder_rows, self.quotient)
        remainder = nn.functional.embedding(codes % self.remainder_rows, self.remainder)
        if self.operation == "mult":
            return quotient * remainder
        return quotient + remainder if self.operation == "add" else torch.cat([quotient, remainder], -1)


class TTEmbedding(EmbeddingStrategy):
    """Tensor-train embedding (Khrulkov et al., "Tensorized Embedding Layers", Findings of EMNLP 2020, preprint 2019;
    as TT-Rec, Yin et al., MLSys 2021): with ``V <= v_1 ... v_n`` and ``d = d_1 ... d_n``, the table is a tensor
    train of n cores ``G_k`` of shape ``(r_{k-1}, v_k, d_k, r_k)`` (``r_0 = r_n = 1``, the others ``rank``); id x's
    vector is the product of the cores' slices at x's mixed-radix digits. Parameters:
    ``sum_k r_{k-1} v_k d_k r_k``.

    Args:
        rank: the TT-rank r of every inner bond.
        num_cores: n.
        vocab_factors: v_1..v_n (product at least V); default the smallest equal v with ``v^n >= V``.
        dim_factors: d_1..d_n (product d); default near-equal factors of d.
        init_std: the standard deviation of the whole table's values at initialisation (the cores' are chosen so).
        budget: size r to this many bytes at inference, or this fraction of the dense table's bytes.
    """

    size_parameter = "rank"

    def __init__(self, vocab_size: int, hidden_size: int, rank: int = 8, num_cores: int = 3,
                 vocab_factors: list[int] | None = None, dim_factors: list[int] | None = None, init_std: float = 0.02,
                 budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size)
        if rank < 1 or num_cores < 2:
            raise ConfigError(f"rank={rank} must be at least 1 and num_cores={num_cores} at least 2")
        self.rank, self.num_cores, self.init_std = rank, num_cores, init_std
        self.vocab_factors, self.dim_factors = self.factors(vocab_size, hidden_size, num_cores, vocab_factors, dim_factors)
        ranks = [1] + [rank] * (num_cores - 1) + [1]
        scale = (init_std**2 / rank ** (num_cores - 1)) ** (1 / (2 * num_cores))  # the product of n cores has init_std
        self.cores = nn.ParameterList(
            nn.Parameter(torch.empty(v, ranks[k], d, ranks[k + 1]).normal_(0.0, scale))  # slices gathered by digit
            for k, (v, d) in enumerate(zip(self.vocab_factors, self.dim_factors)))
        places = [math.prod(self.vocab_factors[k + 1:]) for k in range(num_cores)]
        self.register_buffer("places", torch.tensor(places), persistent=False)
        self.register_buffer("radices", torch.tensor(self.vocab_factors), persistent=False)

    @staticmethod
    def factors(vocab_size: int, hidden_size: int, num_cores: int, vocab_factors: list[int] | None = None,
                dim_factors: list[int] | None = None) -> tuple[list[int], list[int]]:
        """The vocabulary's and the width's factors, given or chosen, checked."""
        vocab = list(vocab_factors or [smallest_table_size(vocab_size, num_cores)] * num_cores)
        dims = list(dim_factors or _near_equal_factors(hidden_size, num_cores))
        if len(vocab) != num_cores or len(dims) != num_cores or min(vocab + dims) < 1:
            raise ConfigError(f"vocab_factors={vocab} and dim_factors={dims} must each give {num_cores} positive factors")
        if math.prod(vocab) < vocab_size:
            raise ConfigError(f"vocab_factors={vocab} index {math.prod(vocab)} ids, fewer than vocab_size={vocab_size}: "
                              f"raise them (or leave them unset)")
        if math.prod(dims) != hidden_size:
            raise ConfigError(f"dim_factors={dims} multiply to {math.prod(dims)}, not hidden_size={hidden_size}")
        return [int(v) for v in vocab], [int(d) for d in dims]

    @classmethod
    def count_parameters(cls, vocab_size: int, hidden_size: int, rank: int = 8, num_cores: int = 3,
                         vocab_factors: list[int] | None = None, dim_factors: list[int] | None = None, **_) -> int:
        vocab, dims = cls.factors(vocab_size, hidden_size, num_cores, vocab_factors, dim_factors)
        ranks = [1] + [rank] * (num_cores - 1) + [1]
        return sum(ranks[k] * v * d * ranks[k + 1] for k, (v, d) in enumerate(zip(vocab, dims)))

    @classmethod
    def size_range(cls, vocab_size: int, hidden_size: int, **_) -> tuple[int, int]:
        return 1, 4096

    def forward(self, codes: Tensor) -> Tensor:
        digits = codes.long().unsqueeze(-1) // self.places % self.radices  # (..., n)
        out = self.cores[0][digits[..., 0]].flatten(-3, -2)  # (..., d_1, r)
        for k in range(1, self.num_cores):
            core = self.cores[k][digits[..., k]]  # (..., r, d_k, r')
            out = torch.einsum("...ar,...rbs->...abs", out, core).flatten(-3, -2)  # (..., d_1..d_k, r')
        return out.squeeze(-1)


def _near_equal_factors(number: int, count: int) -> list[int]:
    """``count`` factors of ``number``, each the divisor of what is left nearest its ``count``-th root."""
    factors = []
    for left in range(count, 1, -1):
        root = number ** (1 / left)
        divisor = min((d for d in range(1, number + 1) if number % d == 0), key=lambda d: (abs(d - root), d))
        factors.append(divisor)
        number //= divisor
    return factors + [number]


__all__ = ["FactorizedEmbedding", "QREmbedding", "TTEmbedding"]
