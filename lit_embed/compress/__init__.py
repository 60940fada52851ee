"""Post-hoc compression of a fine-tuned model's embedding: the library ``lit-embed compress``
(:mod:`lit_embed.commands.compress`) runs.

Frequency-aware partial sparse coding (Tamura et al., CoNLL 2024) and its baselines: the vocabulary is
split by token frequency in the fine-tuning data (:mod:`~lit_embed.compress.vocabulary`), a compressed
strategy is fitted to the dense table (:mod:`~lit_embed.compress.methods`) and the model is written
back with it (:mod:`~lit_embed.compress.model_io`) beside a report (:mod:`~lit_embed.compress.summary`).
"""

from lit_embed.compress.methods import AQOptions
from lit_embed.compress.model_io import load_compact

__all__ = ["AQOptions", "load_compact"]
