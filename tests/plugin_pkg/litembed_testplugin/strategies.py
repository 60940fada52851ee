"""A strategy: vocabulary ids folded onto a smaller table."""

from __future__ import annotations

from torch import Tensor, nn

from lit_embed.embeddings.base import EmbeddingStrategy


class FoldedEmbedding(EmbeddingStrategy):
    """Vocabulary ids folded onto ``rows`` shared vectors: id ``i`` takes row ``i % rows`` (the hashing trick with
    the identity as the hash)."""

    def __init__(self, vocab_size: int, hidden_size: int, rows: int = 1000) -> None:
        super().__init__(vocab_size=vocab_size, hidden_size=hidden_size)
        self.rows = rows
        self.table = nn.Embedding(rows, hidden_size)

    def forward(self, codes: Tensor) -> Tensor:
        return self.table(codes % self.rows)
