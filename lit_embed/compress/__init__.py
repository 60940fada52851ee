"""Post-hoc compression of a fine-tuned model's embedding: the library ``lit-embed compress``
(:mod:`lit_embed.commands.compress`) runs.

Frequency-aware partial sparse coding (Tamura et al., CoNLL 2024) and its baselines: the vocabulary is
split by token frequency in the fine-tuning data (:mod:`~lit_embed.compress.vocabulary`), a compressed
strategy is fitted to the dense table by a method (:mod:`~lit_embed.compress.methods`, one module per family) and
the model is written back with it (:mod:`~lit_embed.compress.model_io`) beside a report (:mod:`~lit_embed.compress.summary`).
"""

# Every family, imported here so that any import of lit_embed.compress registers all of lit-embed's methods.
from lit_embed.compress import codebooks, low_rank, partial, scalar, strategy_fit  # noqa: F401
from lit_embed.compress.codebooks import AQOptions
from lit_embed.compress.model_io import load_compact

__all__ = ["AQOptions", "load_compact"]
