"""Mixed-dimension embeddings (Ginart et al., "Mixed Dimension Embeddings with Application to Memory-Efficient
Recommendation Systems", ISIT 2021): frequent tokens get wide vectors, rare tokens narrow ones, each block projected
to the hidden size."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.errors import ConfigError
from lit_embed.hub import counting_only

#: ``frequencies`` that asks for the training data's counts (what lit-embed counts before building the model).
DATA = "data"
#: ``frequencies`` that asks for the tokenizer's id order as the frequency ranking.
ID_ORDER = "id_order"
#: How many of the training data's tokens ``frequencies: data`` counts by default (the first ones): 10-25 s of
#: tokenising on one core (0.2-0.5 M tokens/s), where a Wikipedia-scale corpus would take hours.
SAMPLE_TOKENS = 5_000_000


class MixedDimensionEmbedding(EmbeddingStrategy):
    """Tokens ranked by frequency fall into ``num_blocks`` blocks (each twice the size of the one before: the few
    frequent tokens first); block i holds an ``n_i x d_i`` table and a ``d_i x d`` projection, with
    ``d_i = round(base_dim * (p_i / p_0) ** alpha)`` for the block's popularity ``p_i`` (the paper's power-law rule;
    ``alpha = 0`` gives every block ``base_dim``). Parameters: ``sum_i n_i d_i + d_i d``.

    Frequencies rank the tokens (``frequencies``): ``"data"`` (the default), the training data's token counts, which
    ``lit-embed fit`` (and ``compress --method fit``) counts before building the model and caches beside the run as a
    count file (:mod:`lit_embed.data.frequencies`; the training data's first ``counted_tokens`` tokens, 5 M by default,
    ``None`` for all of it); a count file of one count per line (line i: id i's count); or
    ``"id_order"``, asked for by name, the tokenizer's id order as a proxy (id i taken to be the (i+1)-th most
    frequent, with Zipf's ``1 / rank`` as its popularity: roughly true of BPE merge order, not of WordPiece, whose
    widest block would hold its ``[unused]`` tokens). The ranking that defines the model lives in persistent buffers
    (``block_of``, ``row_of``) and the widths in ``block_dims``, so a checkpoint rebuilds it without counting again
    (its config records ``frequencies: null`` beside the widths).

    Args:
        base_dim: d_0, the most frequent block's width (at most ``hidden_size``; default ``hidden_size``).
        num_blocks: n.
        alpha: the power law's temperature.
        frequencies: ``"data"``, a count file (read once, when the model is built) or ``"id_order"``.
        block_dims: each block's width, where known (a checkpoint's config records them; they override the rule).
        init_std: standard deviation of the normal initialisation.
        budget: size ``base_dim`` to this many bytes at inference, or this fraction of the dense table's bytes.
        counted_tokens: how many of the training data's tokens ``frequencies: data`` counts, the first ones (``None``:
            all of them; a stream is read no further).
    """

    size_parameter = "base_dim"

    def __init__(self, vocab_size: int, hidden_size: int, base_dim: int | None = None, num_blocks: int = 4,
                 alpha: float = 0.3, frequencies: str | None = DATA, block_dims: list[int] | None = None,
                 init_std: float = 0.02, budget: int | float | None = None,
                 counted_tokens: int | None = SAMPLE_TOKENS) -> None:
        super().__init__(vocab_size, hidden_size)
        self.num_blocks, self.alpha, self.init_std = num_blocks, alpha, init_std
        self.base_dim = hidden_size if base_dim is None else base_dim
        counts = ranking_counts(frequencies, vocab_size, block_dims)
        self.block_dims = [int(d) for d in (block_dims or self.widths(vocab_size, hidden_size, self.base_dim, num_blocks,
                                                                        alpha, counts))]
        if len(self.block_dims) != num_blocks or not all(1 <= d <= hidden_size for d in self.block_dims):
            raise ConfigError(f"block_dims={block_dims} must give {num_blocks} widths in [1, hidden_size={hidden_size}]")
        self.frequencies = self.counted_tokens = None  # what they decided lives in the buffers and block_dims
        sizes = block_sizes(vocab_size, num_blocks)
        if min(sizes) < 1:
            raise ConfigError(f"num_blocks={num_blocks} leaves a block without tokens among {vocab_size}: use fewer blocks")
        self.tables = nn.ParameterList(nn.Parameter(torch.empty(n, d).normal_(0.0, init_std))
                                       for n, d in zip(sizes, self.block_dims))
        self.projections = nn.ParameterList(nn.Parameter(torch.empty(d, hidden_size).normal_(0.0, d**-0.5))
                                            for d in self.block_dims)
        ranked = np.arange(vocab_size) if counts is None else np.argsort(-counts, kind="stable")  # id of each rank
        starts = np.concatenate([[0], np.cumsum(sizes)])
        block_of, row_of = np.empty(vocab_size, np.int64), np.empty(vocab_size, np.int64)
        for i in range(num_blocks):
            block_of[ranked[starts[i]:starts[i + 1]]] = i
            row_of[ranked[starts[i]:starts[i + 1]]] = np.arange(sizes[i])
        self.register_buffer("block_of", torch.as_tensor(block_of), persistent=True)
        self.register_buffer("row_of", torch.as_tensor(row_of), persistent=True)

    @staticmethod
    def widths(vocab_size: int, hidden_size: int, base_dim: int, num_blocks: int, alpha: float,
               counts: np.ndarray | None = None) -> list[int]:
        """The power-law rule's width of each block, from its popularity (the mean frequency of its tokens)."""
        if num_blocks < 1 or num_blocks > vocab_size:
            raise ConfigError(f"num_blocks={num_blocks} must lie in [1, vocab_size={vocab_size}]")
        if not 1 <= base_dim <= hidden_size:
            raise ConfigError(f"base_dim={base_dim} must lie in [1, hidden_size={hidden_size}]")
        frequency = 1.0 / np.arange(1, vocab_size + 1) if counts is None else np.sort(counts)[::-1].astype(float)
        edges = np.concatenate([[0], np.cumsum(block_sizes(vocab_size, num_blocks))])
        popularity = np.array([frequency[a:b].mean() for a, b in zip(edges, edges[1:])])
        share = np.divide(popularity, popularity[0], out=np.zeros_like(popularity), where=popularity[0] > 0)
        return [int(min(hidden_size, max(1, round(base_dim * s**alpha)))) for s in share]

    @classmethod
    def count_parameters(cls, vocab_size: int, hidden_size: int, base_dim: int | None = None, num_blocks: int = 4,
                         alpha: float = 0.3, frequencies: str | None = DATA, block_dims: list[int] | None = None,
                         **_) -> int:
        counts = None if block_dims or frequencies in (DATA, ID_ORDER, None) else read_counts(frequencies, vocab_size)
        dims = block_dims or cls.widths(vocab_size, hidden_size, hidden_size if base_dim is None else base_dim,
                                        num_blocks, alpha, counts)
        return sum(n * d + d * hidden_size for n, d in zip(block_sizes(vocab_size, num_blocks), dims))

    @classmethod
    def count_bytes(cls, vocab_size: int | None, hidden_size: int, **arguments) -> int:
        """The bytes as the base class counts them; with ``frequencies: data`` not yet counted (a sweep's plan, a budget
        table), estimated with the id-order proxy's widths: the run itself sizes with the counts."""
        if arguments.get("frequencies", DATA) == DATA and not arguments.get("block_dims"):
            arguments = {**arguments, "frequencies": ID_ORDER}
        return super().count_bytes(vocab_size, hidden_size, **arguments)

    @classmethod
    def size_range(cls, vocab_size: int, hidden_size: int, **_) -> tuple[int, int]:
        return 1, hidden_size

    def init_args(self) -> dict:
        """The constructor arguments; ``block_dims`` fix the size, so the budget that chose them is not asked again."""
        return {**super().init_args(), "budget": None}

    def forward(self, codes: Tensor) -> Tensor:
        flat = codes.reshape(-1)
        block, row = self.block_of[flat], self.row_of[flat]
        out = self.projections[0].new_zeros(len(flat), self.hidden_size)
        for i, (table, projection) in enumerate(zip(self.tables, self.projections)):
            where = torch.nonzero(block == i).squeeze(-1)
            out = out.index_put((where,), nn.functional.embedding(row[where], table) @ projection)
        return out.reshape(*codes.shape, self.hidden_size)


def block_sizes(vocab_size: int, num_blocks: int) -> list[int]:
    """Tokens per block, each block about twice the one before (the last takes what rounding leaves)."""
    whole = 2**num_blocks - 1
    sizes = [max(1, vocab_size * 2**i // whole) for i in range(num_blocks - 1)]
    return sizes + [vocab_size - sum(sizes)]


def ranking_counts(frequencies: str | None, vocab_size: int, block_dims: list[int] | None) -> np.ndarray | None:
    """The counts ``frequencies`` names (``None``: id order, asked for by name or restored from a checkpoint)."""
    if frequencies == ID_ORDER or (frequencies is None and block_dims):
        return None  # by name; or a checkpoint's model, whose ranking its buffers restore
    if frequencies is None:
        raise ConfigError(f"frequencies=None ranks by nothing: give {DATA!r} (the training data's counts, the default), a "
                          f"count file (one count per line, line i for id i) or {ID_ORDER!r} (the tokenizer's id order)")
    if frequencies == DATA and counting_only():
        return None  # built to be counted (params, a sweep's plan), never to compute: the id-order widths estimate it
    if frequencies == DATA:
        raise ConfigError(f"frequencies={DATA!r}: the training data's token counts are counted by lit-embed fit and "
                          f"lit-embed compress --method fit before they build the model; built otherwise (in Python), give "
                          f"a count file (one count per line, line i for id i) or "
                          f"{ID_ORDER!r} (the tokenizer's id order)")
    return read_counts(frequencies, vocab_size)


def read_counts(path: str, vocab_size: int) -> np.ndarray:
    """The count file's ``vocab_size`` non-negative integers, one per line (line i: id i's count)."""
    try:
        stamp = Path(path).stat().st_mtime_ns  # a budget counts many sizes: the file is read once while unchanged
    except OSError as error:
        raise ConfigError(f"frequencies={path!r} is not a file of one integer count per line ({error}): write id i's "
                          f"count on line i") from None
    return _read_counts(path, vocab_size, stamp)


@functools.lru_cache(maxsize=4)
def _read_counts(path: str, vocab_size: int, stamp: int) -> np.ndarray:
    try:
        lines = Path(path).read_text().split()
        counts = np.array([int(line) for line in lines], dtype=np.int64)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ConfigError(f"frequencies={path!r} is not a file of one integer count per line ({error}): write id i's "
                          f"count on line i") from None
    if len(counts) != vocab_size or (counts < 0).any():
        raise ConfigError(f"frequencies={path!r} holds {len(counts)} counts{' (some negative)' if (counts < 0).any() else ''}"
                          f": it needs one non-negative count per vocabulary id, {vocab_size} lines")
    counts.flags.writeable = False  # shared by the cache
    return counts


__all__ = ["DATA", "ID_ORDER", "SAMPLE_TOKENS", "MixedDimensionEmbedding", "block_sizes", "ranking_counts", "read_counts"]
