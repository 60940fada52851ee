"""The baseline: one learned vector per vocabulary id."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.errors import ConfigError


class DenseEmbedding(EmbeddingStrategy):
    """``nn.Embedding(vocab_size, hidden_size)``: the dense baseline every compression is measured against.

    Args:
        vocab_size: number of vocabulary ids.
        hidden_size: width of each vector.
        init_std: standard deviation of the normal initialisation (BERT/RoBERTa use 0.02).
        budget: the dense table has one size, ``vocab_size x hidden_size``: a budget is accepted only within 1% of
            it (1.0), and refused otherwise.
    """

    def __init__(self, vocab_size: int, hidden_size: int, init_std: float = 0.02, budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size)
        self.init_std = init_std
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size).normal_(0.0, init_std))

    def forward(self, codes: Tensor) -> Tensor:
        return nn.functional.embedding(codes, self.weight)

    @classmethod
    def count_parameters(cls, vocab_size: int | None, hidden_size: int, **arguments) -> int:
        return vocab_size * hidden_size

    def load_pretrained(self, weight: Tensor) -> bool:
        if tuple(weight.shape) != tuple(self.weight.shape):
            raise ConfigError(
                f"the pretrained word embeddings are {tuple(weight.shape)} but the dense strategy is "
                f"{tuple(self.weight.shape)}: set vocab_size to {weight.shape[0]} (the model's vocabulary)"
            )
        with torch.no_grad():
            self.weight.copy_(weight)
        return True

    def full_weight(self) -> Tensor:
        return self.weight

