"""Embedding strategies: the seam between text and the backbone (see ``base.py``)."""

from lit_embed.embeddings.assignment import Assignment, ClusterAssignment, RadixAssignment
from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.embeddings.canine import CanineHashEmbedding, CharacterTextEncoder
from lit_embed.embeddings.dense import DenseEmbedding
from lit_embed.embeddings.dpq import DPQEmbedding
from lit_embed.embeddings.factorised import FactorizedEmbedding, QREmbedding, TTEmbedding
from lit_embed.embeddings.hash_text import HashTextEncoder
from lit_embed.embeddings.hashed_ids import (
    DeepHashEmbedding,
    HashingTrickEmbedding,
    ROBEEmbedding,
    WeightedHashEmbedding,
)
from lit_embed.embeddings.hashers import Hasher, LSHHasher, MD5Hasher
from lit_embed.embeddings.hashformer import (
    HashAdd,
    HashEmbedding,
    HashPool,
    HashProj,
    HashStrategy,
    ProFormerEmbedding,
)
from lit_embed.embeddings.mixed_dimension import MixedDimensionEmbedding
from lit_embed.embeddings.quantized import (
    AdditiveQuantizedEmbedding,
    ProductQuantizedEmbedding,
    ScalarQuantizedEmbedding,
)
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
    "DPQEmbedding",
    "DeepHashEmbedding",
    "DenseEmbedding",
    "EmbeddingStrategy",
    "FactorizedEmbedding",
    "FittableTextEncoder",
    "HashAdd",
    "HashEmbedding",
    "HashPool",
    "HashProj",
    "HashStrategy",
    "HashTextEncoder",
    "HashingTrickEmbedding",
    "Hasher",
    "LSHHasher",
    "MD5Hasher",
    "MixedDimensionEmbedding",
    "ProFormerEmbedding",
    "PCAEmbedding",
    "PartialEmbedding",
    "ProductQuantizedEmbedding",
    "QREmbedding",
    "ROBEEmbedding",
    "RadixAssignment",
    "ScalarQuantizedEmbedding",
    "SparseCodedEmbedding",
    "SubspaceEmbedding",
    "TTEmbedding",
    "TextEncoder",
    "UnkEmbedding",
    "VocabTextEncoder",
    "WeightedHashEmbedding",
]
