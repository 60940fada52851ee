"""LightningModules: the shared strategy+encoder base and the objectives built on it."""

from lit_embed.models.base import EmbeddingModule
from lit_embed.models.classifier import SequenceClassifier
from lit_embed.models.encoder import Encoder
from lit_embed.models.mlm import MaskedLM
from lit_embed.models.optim import OptimConfig
from lit_embed.models.shuffle_random import ShuffleRandom

__all__ = ["EmbeddingModule", "Encoder", "MaskedLM", "OptimConfig", "SequenceClassifier", "ShuffleRandom"]
