"""Strategies that hash vocabulary ids into small shared memories (the recommendation systems' embedding zoo).

Each indexes a tokenizer's ids (``vocab_size`` known) and hashes the id itself with seeded universal hashing
(:func:`hash_ids`), never Python's ``hash()``: the hash functions' coefficients are drawn from the strategy's
``seed`` and kept in the persistent buffer ``hash_coefficients``, so a checkpoint restores them exactly and every
DDP rank agrees. Hashing is vectorised over the batch; no strategy here holds a ``V x d`` table.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn

from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.errors import ConfigError

#: The Mersenne prime 2^31 - 1: ``a * x + b`` with a, x, b below it fits in 64 bits.
PRIME = 2**31 - 1


def hash_coefficients(seed: int, count: int) -> Tensor:
    """``(count, 2)`` coefficients ``(a, b)`` of ``count`` universal hash functions, ``a`` in [1, p), ``b`` in [0, p),
    drawn from NumPy's generator seeded with ``seed`` (the same on every machine and process)."""
    rng = np.random.default_rng(seed)
    return torch.as_tensor(np.stack([rng.integers(1, PRIME, count), rng.integers(0, PRIME, count)], 1), dtype=torch.long)


def hash_ids(ids: Tensor, coefficients: Tensor, buckets: int) -> Tensor:
    """``((a x + b) mod p) mod buckets`` (Carter & Wegman 1979) of each id ``x`` and each function: ``(..., count)``."""
    x = (ids.long() % PRIME).unsqueeze(-1)
    return (coefficients[:, 0] * x + coefficients[:, 1]) % PRIME % buckets


class HashedIdStrategy(EmbeddingStrategy):
    """What the strategies here share: ``num_hashes`` hash functions of the id drawn from ``seed``."""

    def __init__(self, vocab_size: int, hidden_size: int, num_hashes: int, seed: int) -> None:
        super().__init__(vocab_size, hidden_size)
        if num_hashes < 1:
            raise ConfigError(f"{type(self).__name__} needs at least one hash function, got {num_hashes}")
        self.seed = seed
        self.register_buffer("hash_coefficients", hash_coefficients(seed, num_hashes), persistent=True)

    def hashed(self, codes: Tensor, buckets: int) -> Tensor:
        return hash_ids(codes, self.hash_coefficients, buckets)


class HashingTrickEmbedding(HashedIdStrategy):
    """The hashing trick (Weinberger et al., "Feature Hashing for Large Scale Multitask Learning", ICML 2009): id x
    takes row ``h(x)`` of a ``num_buckets x d`` table, times a sign ``xi(x)`` in {-1, +1} from a second hash where
    ``signed`` (the paper's unbiased estimator). Parameters: ``num_buckets * d``.

    Args:
        num_buckets: rows of the shared table (ids collide once it is below ``vocab_size``).
        signed: multiply by the sign hash.
        seed: draws the hash functions.
        init_std: standard deviation of the normal initialisation.
        budget: size ``num_buckets`` to this many bytes at inference, or this fraction of the dense table's bytes.
    """

    size_parameter = "num_buckets"

    def __init__(self, vocab_size: int, hidden_size: int, num_buckets: int = 1000, signed: bool = True, seed: int = 0,
                 init_std: float = 0.02, budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size, 2, seed)
        if num_buckets < 1:
            raise ConfigError(f"num_buckets={num_buckets} must be at least 1")
        self.num_buckets, self.signed, self.init_std = num_buckets, signed, init_std
        self.weight = nn.Parameter(torch.empty(num_buckets, hidden_size).normal_(0.0, init_std))

    @classmethod
    def count_parameters(cls, vocab_size: int, hidden_size: int, num_buckets: int = 1000, **_) -> int:
        return num_buckets * hidden_size

    @classmethod
    def size_range(cls, vocab_size: int, hidden_size: int, **_) -> tuple[int, int]:
        return 1, vocab_size

    def forward(self, codes: Tensor) -> Tensor:
        row = self.hashed(codes, self.num_buckets)[..., 0]
        vectors = nn.functional.embedding(row, self.weight)
        if not self.signed:
            return vectors
        sign = self.hashed(codes, 2)[..., 1].to(vectors.dtype) * 2 - 1
        return vectors * sign.unsqueeze(-1)


class WeightedHashEmbedding(HashedIdStrategy):
    """Hash embeddings (Svenstrup, Hansen & Winther, "Hash Embeddings for Efficient Word Representations", NeurIPS
    2017): id x is ``sum_i p_x^i E[h_i(x)]``, ``num_hashes`` rows of a shared pool E of ``num_buckets`` vectors
    weighted by x's importance parameters ``p_x``: row ``h_0(x)`` of a ``importance_rows x num_hashes`` table P, h_0 a
    hash of its own into K = ``importance_rows`` rows (the paper's general case); left unset, one row per id (its
    dictionary case, K = V). With ``append_weights`` the k weights are appended to the sum (the paper's option), the
    pool then ``hidden_size - num_hashes`` wide. Parameters: ``num_buckets * width + K * num_hashes`` (the paper's
    ``B d + K k``).

    Args:
        num_buckets: B, vectors in the shared pool.
        num_hashes: k, hash functions (the paper: 2).
        seed: draws the hash functions (h_0 from ``seed + 1``).
        init_std: standard deviation of the pool's normal initialisation; the importance weights start at 1/k plus
            noise of that scale, so that a token's k weights get different gradients.
        importance_rows: K, rows of the importance table, each id hashed to one; unset: one row per id.
        append_weights: append each id's k importance weights to its vector.
        budget: size ``num_buckets`` to this many bytes at inference, or this fraction of the dense table's bytes.
    """

    size_parameter = "num_buckets"
    importance_hash: Tensor  # h_0's coefficients, where importance_rows is set

    def __init__(self, vocab_size: int, hidden_size: int, num_buckets: int = 1000, num_hashes: int = 2, seed: int = 0,
                 init_std: float = 0.02, importance_rows: int | None = None, append_weights: bool = False,
                 budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size, num_hashes, seed)
        if num_buckets < 1:
            raise ConfigError(f"num_buckets={num_buckets} must be at least 1")
        if importance_rows is not None and importance_rows < 1:
            raise ConfigError(f"importance_rows={importance_rows} must be at least 1, or unset for one row per id")
        width = hidden_size - num_hashes if append_weights else hidden_size
        if width < 1:
            raise ConfigError(f"append_weights leaves hidden_size - num_hashes = {width} columns for the pool: "
                              f"lower num_hashes or leave append_weights off")
        self.num_buckets, self.num_hashes, self.init_std = num_buckets, num_hashes, init_std
        self.importance_rows, self.append_weights = importance_rows, append_weights
        self.pool = nn.Parameter(torch.empty(num_buckets, width).normal_(0.0, init_std))
        rows = vocab_size if importance_rows is None else importance_rows
        self.importance = nn.Parameter(torch.empty(rows, num_hashes).normal_(1.0 / num_hashes, init_std))
        if importance_rows is not None:  # h_0: an id's importance row
            self.register_buffer("importance_hash", hash_coefficients(seed + 1, 1), persistent=True)

    @classmethod
    def count_parameters(cls, vocab_size: int, hidden_size: int, num_buckets: int = 1000, num_hashes: int = 2,
                         importance_rows: int | None = None, append_weights: bool = False, **_) -> int:
        width = hidden_size - num_hashes if append_weights else hidden_size
        return num_buckets * width + (vocab_size if importance_rows is None else importance_rows) * num_hashes

    @classmethod
    def size_range(cls, vocab_size: int, hidden_size: int, **_) -> tuple[int, int]:
        return 1, vocab_size

    def forward(self, codes: Tensor) -> Tensor:
        rows = self.hashed(codes, self.num_buckets)  # (..., k)
        slot = codes if self.importance_rows is None else hash_ids(codes, self.importance_hash, self.importance_rows)[..., 0]
        weights = nn.functional.embedding(slot, self.importance)  # (..., k)
        summed = (nn.functional.embedding(rows, self.pool) * weights.unsqueeze(-1)).sum(-2)
        return torch.cat([summed, weights], dim=-1) if self.append_weights else summed


class ROBEEmbedding(HashedIdStrategy):
    """ROBE, random offset block embedding (Desai, Chou & Shrivastava, "Random Offset Block Embedding (ROBE) for
    compressed embedding tables in deep learning recommendation systems", MLSys 2022): one flat array M of
    ``memory`` values; id x's vector is ``ceil(d / block_size)`` blocks, block j the ``block_size`` consecutive
    values of M (circularly) from offset ``h(x, j)``, times a sign hash ``g(x, j)``. Parameters: ``memory``.

    Args:
        memory: values in the shared array.
        block_size: Z, consecutive values read per hash (the paper's ROBE-Z; Z = 1 hashes every value, as
            HashedNets).
        seed: draws the hash functions (offset and sign).
        init_std: standard deviation of the array's normal initialisation.
        budget: size ``memory`` to this many bytes at inference, or this fraction of the dense table's bytes.
    """

    size_parameter = "memory"

    def __init__(self, vocab_size: int, hidden_size: int, memory: int = 100_000, block_size: int = 32, seed: int = 0,
                 init_std: float = 0.02, budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size, 2, seed)
        if not 1 <= block_size <= hidden_size:
            raise ConfigError(f"block_size={block_size} must lie in [1, hidden_size={hidden_size}]")
        if memory < block_size:
            raise ConfigError(f"memory={memory} must hold at least one block of block_size={block_size} values")
        self.memory, self.block_size, self.init_std = memory, block_size, init_std
        self.array = nn.Parameter(torch.empty(memory).normal_(0.0, init_std))
        self.num_blocks = math.ceil(hidden_size / block_size)
        self.register_buffer("block_ids", torch.arange(self.num_blocks), persistent=False)
        self.register_buffer("within", torch.arange(block_size), persistent=False)

    @classmethod
    def count_parameters(cls, vocab_size: int, hidden_size: int, memory: int = 100_000, **_) -> int:
        return memory

    @classmethod
    def size_range(cls, vocab_size: int, hidden_size: int, block_size: int = 32, **_) -> tuple[int, int]:
        return block_size, vocab_size * hidden_size

    def forward(self, codes: Tensor) -> Tensor:
        keys = codes.long().unsqueeze(-1) * self.num_blocks + self.block_ids  # (..., blocks): one key per (x, j)
        hashed = self.hashed(keys, self.memory)
        offsets, signs = hashed[..., 0], (hashed[..., 1] % 2).to(self.array.dtype) * 2 - 1
        index = (offsets.unsqueeze(-1) + self.within) % self.memory  # (..., blocks, Z)
        values = self.array[index] * signs.unsqueeze(-1)
        return values.flatten(-2)[..., : self.hidden_size]


class DeepHashEmbedding(HashedIdStrategy):
    """Deep hash embedding, DHE (Kang et al., "Learning to Embed Categorical Features without Embedding Tables for
    Recommendation", KDD 2021): no table at all. Id x is encoded by ``num_hashes`` universal hashes into
    ``num_buckets`` buckets, each mapped uniformly to [-1, 1] (the paper's uniform encoding, k = 1024, m = 10^6),
    and a deep network of ``num_layers`` hidden layers of ``width`` units with Mish activations decodes it into the
    vector. Parameters: the network's, ``k w + w + (L - 1)(w^2 + w) + w d + d``. The paper's batch normalisation
    after each hidden layer is an option (``batch_norm``, ``2 w`` more parameters a layer): in training a vector then
    depends on the batch it comes in (at inference, on the running statistics only), so it is off by default. A tied
    decoder runs the network on every id (``V x k`` encodings per step): the method has no table to score instead.

    Args:
        width: units of each hidden layer.
        num_layers: hidden layers L (at least 1).
        num_hashes: k, the encoding's length.
        num_buckets: m, each hash's range.
        seed: draws the hash functions.
        batch_norm: batch normalisation after each hidden layer's linear map, before its Mish (the paper's network).
        budget: size ``width`` to this many bytes at inference, or this fraction of the dense table's bytes.
    """

    size_parameter = "width"

    def __init__(self, vocab_size: int, hidden_size: int, width: int = 256, num_layers: int = 2, num_hashes: int = 1024,
                 num_buckets: int = 1_000_000, seed: int = 0, batch_norm: bool = False,
                 budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size, num_hashes, seed)
        if width < 1 or num_layers < 1:
            raise ConfigError(f"width={width} and num_layers={num_layers} must be at least 1")
        if num_buckets < 2:
            raise ConfigError(f"num_buckets={num_buckets} must be at least 2 (the encoding spans [-1, 1])")
        self.width, self.num_layers, self.num_hashes, self.num_buckets = width, num_layers, num_hashes, num_buckets
        self.batch_norm = batch_norm
        layers: list[nn.Module] = []
        for inputs in [num_hashes] + [width] * (num_layers - 1):
            layers += [nn.Linear(inputs, width), *([nn.BatchNorm1d(width)] if batch_norm else []), nn.Mish()]
        self.decoder = nn.Sequential(*layers, nn.Linear(width, hidden_size))

    @classmethod
    def count_parameters(cls, vocab_size: int, hidden_size: int, width: int = 256, num_layers: int = 2,
                         num_hashes: int = 1024, batch_norm: bool = False, **_) -> int:
        normalised = 2 * width * num_layers if batch_norm else 0
        return (num_hashes * width + width + (num_layers - 1) * (width * width + width) + width * hidden_size + hidden_size
                + normalised)

    def encode(self, codes: Tensor) -> Tensor:
        """The dense hash encoding ``(..., num_hashes)`` in [-1, 1]."""
        buckets = self.hashed(codes, self.num_buckets).to(self.decoder[0].weight.dtype)
        return buckets * (2.0 / (self.num_buckets - 1)) - 1.0

    def forward(self, codes: Tensor) -> Tensor:
        encoded = self.encode(codes)  # batch normalisation normalises over every token of the batch
        return self.decoder(encoded.reshape(-1, self.num_hashes)).reshape(*codes.shape, self.hidden_size)


__all__ = [
    "DeepHashEmbedding", "HashedIdStrategy", "HashingTrickEmbedding", "ROBEEmbedding", "WeightedHashEmbedding",
    "hash_coefficients", "hash_ids",
]
