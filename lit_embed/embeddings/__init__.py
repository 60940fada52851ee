"""Embedding strategies: the seam between text and the backbone (see ``base.py``)."""

from lit_embed.embeddings.assignment import Assignment, ClusterAssignment, RadixAssignment
from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.embeddings.dense import DenseEmbedding
from lit_embed.embeddings.subspace import SubspaceEmbedding
from lit_embed.embeddings.text import TextEncoder, VocabTextEncoder

__all__ = [
    "Assignment",
    "ClusterAssignment",
    "DenseEmbedding",
    "EmbeddingStrategy",
    "RadixAssignment",
    "SubspaceEmbedding",
    "TextEncoder",
    "VocabTextEncoder",
]
