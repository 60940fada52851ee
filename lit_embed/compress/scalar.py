"""Methods of one size, the table row by row: ``dense`` (the table as it is, float32: the uncompressed reference a
comparison tests beside the others) and ``int8`` / ``int4`` (each row's values quantised to 8 or 4 bits, its min to max
in equal steps). Their bytes are fixed: a ``--budget`` they meet within 1% is accepted, another refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lit_embed.compress.methods import CompressionMethod, Job
from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.embeddings.dense import DenseEmbedding
from lit_embed.embeddings.quantized import (
    ScalarQuantizedEmbedding,
)
from lit_embed.embeddings.sizing import budget_target, fit_budget
from lit_embed.errors import BudgetError


@dataclass
class FixedSizeOptions:
    """A method of one size: the budget, accepted where its bytes meet it.

    Args:
        budget: the bytes at inference (or fraction of the table's bytes) the method must meet within 1%; its bytes are
            fixed, so a budget it does not meet is refused, saying what it takes.
    """

    budget: int | float | None = None


def check_fixed_budget(method: CompressionMethod, job: Job, cls: type[EmbeddingStrategy], arguments: dict) -> None:
    """Accept the ``--budget`` of a ``method`` of one size (``cls(**arguments)``'s bytes) where they meet it within 1%;
    refuse another, saying what they take."""
    budget = getattr(method.options, "budget", None)
    if budget is None:
        return
    vocab, hidden = job.weight.shape
    try:
        method.details["budget"] = fit_budget(cls, vocab, hidden, budget, arguments).describe()
    except BudgetError:  # its bytes are fixed: say what they are
        reach, dense = cls.count_bytes(vocab, hidden, **arguments), vocab * hidden * 4
        target = budget_target(budget, vocab, hidden, method.name)
        raise BudgetError(f"{method.name} cannot meet budget={budget} ({target:,} bytes, {100 * target / dense:.3g}% of "
                          f"the table) within 1%: it takes {reach:,} bytes, {100 * reach / dense:.3g}% of the table, at "
                          f"any budget; ask for that, or leave --budget unset") from None


class ScalarQuantization(CompressionMethod):
    """Per-row scalar quantisation of the whole table to ``bits`` bits (each row's min to max in equal steps)."""

    bits: ClassVar[int]
    Options = FixedSizeOptions

    def check(self, job: Job) -> None:
        check_fixed_budget(self, job, ScalarQuantizedEmbedding, {"bits": self.bits})

    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        self.check(job)
        strategy = ScalarQuantizedEmbedding(*job.weight.shape, bits=self.bits)
        strategy.quantize(job.weight)
        return {None: strategy}


class KeepDense(CompressionMethod):
    """The table as it is, a dense float32 embedding: the uncompressed reference, compressed and tested as every
    method is (a comparison's PRR is against it)."""

    name = "dense"
    Options = FixedSizeOptions

    def check(self, job: Job) -> None:
        check_fixed_budget(self, job, DenseEmbedding, {})

    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        self.check(job)
        strategy = DenseEmbedding(*job.weight.shape)
        strategy.load_pretrained(job.weight.detach().float().cpu())
        return {None: strategy}


class Int8(ScalarQuantization):
    """8-bit codes, one per byte."""

    name = "int8"
    bits = 8


class Int4(ScalarQuantization):
    """4-bit codes, two per byte."""

    name = "int4"
    bits = 4
