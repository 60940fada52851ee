"""Post-hoc compressed vocabularies: common tokens keep their rows, rare tokens are rebuilt on demand.

Frequency-aware partial sparse coding (Tamura et al., CoNLL 2024) and the two baselines that
approximate the same rare tokens (``<unk>`` and PCA). ``lit-embed compress`` fits them to a fine-tuned
dense table (:mod:`lit_embed.compress`); what defines them lives in persistent buffers, so a checkpoint
restores them exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.errors import ConfigError


class PartialEmbedding(EmbeddingStrategy):
    """The common tokens V_C keep their (fine-tuned) rows bit for bit; the rare tokens V_R are rebuilt.

    The buffer ``row_of`` places every vocabulary id: ``r >= 0`` is row ``r`` of ``common``; ``r < 0``
    is rare slot ``-1 - r``, whose vector :meth:`rebuild` computes, once per distinct slot in a batch.
    Subclasses hold what rebuilds a slot and count it in :meth:`num_embedding_parameters`; the
    ``row_of`` map itself is the tokenizer's split, which the paper does not count as parameters.

    Args:
        vocab_size: V, the dense table's rows.
        hidden_size: d, its width.
        num_common: |V_C|; the other ``vocab_size - num_common`` ids are rare.

    Each strategy here is sized by ``num_common`` (a ``budget`` in the concrete classes chooses it).
    """

    size_parameter = "num_common"

    def __init__(self, vocab_size: int, hidden_size: int, num_common: int) -> None:
        super().__init__(vocab_size, hidden_size)
        if not 0 < num_common <= vocab_size:
            raise ConfigError(f"num_common={num_common} must lie in [1, vocab_size={vocab_size}]")
        self.common = nn.Parameter(torch.zeros(num_common, hidden_size))
        self.register_buffer("row_of", torch.empty(vocab_size, dtype=torch.int32), persistent=True)
        if not self.row_of.is_meta:  # built to be counted (count_bytes), it holds no values to place
            self.split(torch.arange(num_common))  # a placeholder until fitted or restored

    @property
    def num_common(self) -> int:
        return self.common.shape[0]

    @property
    def num_rare(self) -> int:
        return self.vocab_size - self.num_common

    def split(self, common_ids: Tensor) -> None:
        """Make ``common_ids`` the common tokens (row ``i`` holds id ``common_ids[i]``); the other ids,
        in increasing order, become rare slots 0, 1, ... (see :func:`rare_ids_of`)."""
        common_ids = torch.as_tensor(common_ids, dtype=torch.long).flatten()
        if len(common_ids) != self.num_common or len(common_ids.unique()) != self.num_common:
            raise ConfigError(f"expected {self.num_common} distinct common ids, got {len(common_ids)}")
        if common_ids.min() < 0 or common_ids.max() >= self.vocab_size:
            raise ConfigError(f"common ids must lie in [0, {self.vocab_size})")
        rows = torch.empty(self.vocab_size, dtype=torch.int32)
        rows[common_ids] = torch.arange(self.num_common, dtype=torch.int32)
        rows[rare_ids_of(self.vocab_size, common_ids)] = -1 - torch.arange(self.num_rare, dtype=torch.int32)
        self.row_of.copy_(rows)

    def common_ids(self) -> Tensor:
        """Vocabulary ids of the common rows, in row order."""
        ids = torch.nonzero(self.row_of >= 0).flatten()
        return ids[self.row_of[ids].argsort()]

    def rare_ids(self) -> Tensor:
        """Vocabulary ids of the rare slots, in slot order."""
        ids = torch.nonzero(self.row_of < 0).flatten()
        return ids[(-1 - self.row_of[ids]).argsort()]

    def forward(self, codes: Tensor) -> Tensor:
        rows = self.row_of[codes]
        out = F.embedding(rows.clamp(min=0), self.common)
        rare = rows < 0
        if rare.any():
            slots, where = torch.unique(-1 - rows[rare], return_inverse=True)
            out = out.index_put((rare,), self.rebuild(slots)[where])
        return out

    def rebuild(self, slots: Tensor) -> Tensor:
        """Vectors ``(len(slots), hidden_size)`` of the rare slots ``slots``."""
        raise NotImplementedError

    def num_embedding_parameters(self) -> int:
        return self.count_parameters(self.vocab_size, self.hidden_size, **self.init_args())

    @classmethod
    def count_parameters(cls, vocab_size: int, hidden_size: int, num_common: int, **_) -> int:
        return num_common * hidden_size

    @classmethod
    def size_range(cls, vocab_size: int, hidden_size: int, k: int = 1, **_) -> tuple[int, int]:
        return k, vocab_size


def rare_ids_of(vocab_size: int, common_ids: Tensor) -> Tensor:
    """The ids outside ``common_ids``, in increasing order: rare slot ``i`` is id ``rare_ids_of(...)[i]``."""
    rare = torch.ones(vocab_size, dtype=torch.bool)
    rare[common_ids] = False
    return torch.nonzero(rare).flatten()


class SparseCodedEmbedding(PartialEmbedding):
    """Frequency-aware partial sparse coding: a rare token is a weighted sum of k common tokens.

    Rare slot i keeps the ids of its k nearest common tokens (cosine on normalised rows), their
    locally-linear weights (summing to 1, the Lagrangian solution of the paper's eq. 2) and its
    original length: ``y_i = ||y_i|| * n(sum_j w_ij n(x_j))`` with ``n(v) = v / ||v||`` (eqs. 1-3).
    The paper's accounting: ``|V_C| d + (2k + 1) |V_R|`` parameters.

    ``vocab_size``, ``hidden_size`` and ``num_common``: see :class:`PartialEmbedding`.

    Args:
        k: common tokens per rare token.
        budget: choose ``num_common`` to meet this many bytes (or this fraction of the dense table's).
    """

    def __init__(self, vocab_size: int, hidden_size: int, num_common: int, k: int = 5,
                 budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size, num_common)
        if not 1 <= k <= num_common:
            raise ConfigError(f"k={k} must lie in [1, num_common={num_common}]")
        self.k = k
        self.register_buffer("neighbours", torch.zeros(self.num_rare, k, dtype=torch.int32), persistent=True)
        self.register_buffer("weights", torch.full((self.num_rare, k), 1.0 / k), persistent=True)
        self.register_buffer("norms", torch.zeros(self.num_rare), persistent=True)

    def rebuild(self, slots: Tensor) -> Tensor:
        basis = F.normalize(F.embedding(self.neighbours[slots], self.common), dim=-1)
        mixed = torch.bmm(self.weights[slots].unsqueeze(1).to(basis.dtype), basis).squeeze(1)
        return F.normalize(mixed, dim=-1) * self.norms[slots, None].to(basis.dtype)

    @classmethod
    def count_parameters(cls, vocab_size: int, hidden_size: int, num_common: int, k: int = 5, **_) -> int:
        return num_common * hidden_size + (2 * k + 1) * (vocab_size - num_common)

    def counting_rule(self) -> str:
        return f"the sparse-coding paper counts each rare token's stored {self.k} ids, {self.k} weights and norm"


class UnkEmbedding(PartialEmbedding):
    """The ``<unk>`` baseline: every rare token takes the (fine-tuned) ``<unk>`` row. ``|V_C| d`` parameters.

    ``vocab_size``, ``hidden_size`` and ``num_common``: see :class:`PartialEmbedding`.

    Args:
        budget: choose ``num_common`` to meet this many bytes (or this fraction of the dense table's).
    """

    def __init__(self, vocab_size: int, hidden_size: int, num_common: int, budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size, num_common)
        self.register_buffer("unk_row", torch.zeros((), dtype=torch.long), persistent=True)

    def rebuild(self, slots: Tensor) -> Tensor:
        return self.common[self.unk_row].expand(len(slots), -1)


class PCAEmbedding(PartialEmbedding):
    """The PCA baseline: a rare token is the mean of the common rows plus k principal components of
    them, weighted by its coordinates. ``|V_C| d + (k + 1) d + k |V_R|`` parameters (components and
    mean beside the common rows; k coordinates per rare token).

    ``vocab_size``, ``hidden_size`` and ``num_common``: see :class:`PartialEmbedding`.

    Args:
        k: principal components.
        budget: choose ``num_common`` to meet this many bytes (or this fraction of the dense table's).
    """

    def __init__(self, vocab_size: int, hidden_size: int, num_common: int, k: int = 5,
                 budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size, num_common)
        if not 1 <= k <= min(num_common, hidden_size):
            raise ConfigError(f"k={k} must lie in [1, min(num_common={num_common}, hidden_size={hidden_size})]")
        self.k = k
        self.components = nn.Parameter(torch.zeros(k, hidden_size))
        self.mean = nn.Parameter(torch.zeros(hidden_size))
        self.register_buffer("coordinates", torch.zeros(self.num_rare, k), persistent=True)

    def rebuild(self, slots: Tensor) -> Tensor:
        return self.mean + self.coordinates[slots].to(self.components.dtype) @ self.components

    @classmethod
    def count_parameters(cls, vocab_size: int, hidden_size: int, num_common: int, k: int = 5, **_) -> int:
        return num_common * hidden_size + (k + 1) * hidden_size + k * (vocab_size - num_common)

    def counting_rule(self) -> str:
        return f"each rare token's stored {self.k} coordinates count"
