"""Embedding strategies: the seam between text and the backbone (see ``base.py``)."""

from lit_embed.embeddings.assignment import Assignment, ClusterAssignment, RadixAssignment
from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.embeddings.canine import CanineHashEmbedding, CharacterTextEncoder
from lit_embed.embeddings.dense import DenseEmbedding
from lit_embed.embeddings.hash_text import HashTextEncoder
from lit_embed.embeddings.hashers import Hasher, LSHHasher, MD5Hasher
from lit_embed.embeddings.hashformer import (
    HashAdd,
    HashEmbedding,
    HashPool,
    HashProj,
    HashStrategy,
    ProFormerEmbedding,
)
from lit_embed.embeddings.quantized import AdditiveQuantizedEmbedding
from lit_embed.embeddings.sparse_coded import (
    PartialEmbedding,
    PCAEmbedding,
    SparseCodedEmbedding,
    UnkEmbedding,
)
from lit_embed.embeddings.subspace import SubspaceEmbedding
from lit_embed.embeddings.text import FittableTextEncoder, TextEncoder, VocabTextEncoder

__all__ = [
    "AdditiveQuantizedEmbedding",
    "Assignment",
    "CanineHashEmbedding",
    "CharacterTextEncoder",
    "ClusterAssignment",
    "DenseEmbedding",
    "EmbeddingStrategy",
    "FittableTextEncoder",
    "HashAdd",
    "HashEmbedding",
    "HashPool",
    "HashProj",
    "HashStrategy",
    "HashTextEncoder",
    "Hasher",
    "LSHHasher",
    "MD5Hasher",
    "ProFormerEmbedding",
    "PCAEmbedding",
    "PartialEmbedding",
    "RadixAssignment",
    "SparseCodedEmbedding",
    "SubspaceEmbedding",
    "TextEncoder",
    "UnkEmbedding",
    "VocabTextEncoder",
]
