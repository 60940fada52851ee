"""Additive quantization: every token is a sum of one vector from each of M codebooks of K vectors.

The baseline the sparse-coding paper compares with (Babenko & Lempitsky 2014, learned as Shu &
Nakayama 2017 do); unlike the partial strategies it approximates the whole table, common tokens too.
``lit-embed compress --method aq`` learns it (:func:`lit_embed.compress.methods.additive_quantize`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.errors import ConfigError


class AdditiveQuantizedEmbedding(EmbeddingStrategy):
    """``e(n) = sum_m codebooks[m, codes[n, m]]``.

    The codes (``vocab_size x M`` indices below K, a persistent ``uint8`` buffer) define the model;
    parameters counted: the ``M K d`` codebook entries plus the ``V M`` codes (each a log2(K)-bit
    index, counted as one parameter as sparse coding counts its ids).

    Args:
        vocab_size: V, the table's rows.
        hidden_size: d, its width.
        codebooks: M.
        codewords: K, vectors per codebook (at most 256).
        budget: size M to this many parameters (``M (K d + V)``).
    """

    size_parameter = "codebooks"

    def __init__(self, vocab_size: int, hidden_size: int, codebooks: int = 32, codewords: int = 16,
                 budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size)
        if codebooks < 1:
            raise ConfigError(f"codebooks={codebooks} must be at least 1")
        if not 2 <= codewords <= 256:
            raise ConfigError(f"codewords={codewords} must lie in [2, 256] (codes are stored as bytes)")
        self.num_codebooks, self.num_codewords = codebooks, codewords
        self.codebooks = nn.Parameter(torch.zeros(codebooks, codewords, hidden_size))
        self.register_buffer("codes", torch.zeros(vocab_size, codebooks, dtype=torch.uint8), persistent=True)
        self.register_buffer("offsets", torch.arange(codebooks) * codewords, persistent=False)

    def forward(self, codes: Tensor) -> Tensor:
        picks = self.codes[codes.flatten()].long() + self.offsets
        table = self.codebooks.reshape(-1, self.hidden_size)
        return F.embedding_bag(picks, table, mode="sum").reshape(*codes.shape, self.hidden_size)

    def num_embedding_parameters(self) -> int:
        return self.codebooks.numel() + self.codes.numel()

    @classmethod
    def count_parameters(cls, vocab_size: int, hidden_size: int, codebooks: int = 32, codewords: int = 16, **_) -> int:
        return codebooks * (codewords * hidden_size + vocab_size)

    def counting_rule(self) -> str:
        return f"each token's stored {self.num_codebooks} codes count"

    def init_args(self) -> dict:
        """The constructor arguments beyond the two sizes (the codebooks are kept as ``num_codebooks``)."""
        return {"codebooks": self.num_codebooks, "codewords": self.num_codewords, "budget": self.budget}
