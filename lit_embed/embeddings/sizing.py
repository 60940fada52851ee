"""A strategy sized to a memory budget: one mechanism for every strategy.

``budget`` is the bytes the embedding may need at inference, as an integer, or as a fraction in (0, 1] of the dense
``vocab_size x hidden_size`` float32 table's bytes. A strategy declares the one constructor argument a budget sizes
(``size_parameter``: buckets, rows, rank, width...), the values it may take (``size_range``) and its bytes from the
arguments alone (``count_bytes``); :func:`fit_budget` takes the value whose bytes are nearest the budget and accepts it
within :data:`TOLERANCE`, or refuses, naming the nearest budgets the strategy's structure can meet. The bytes are the
ones ``inference_bytes()`` gives and ``lit-embed params`` reports: each tensor at its stored dtype, so a quantised code
and a float32 value meet one budget on one footing (the papers' parameter counts stay their tables' unit).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from lit_embed.errors import BudgetError, ConfigError
from lit_embed.measures.accounting import DENSE_VALUE_BYTES

log = logging.getLogger(__name__)

#: A budget: the embedding's inference bytes (``int``) or a fraction in (0, 1] of the dense table's bytes (``float``).
Budget = int | float
#: How far from the budget the bytes may be, as a share of the budget.
TOLERANCE = 0.01
#: Ranges of at most this many values are searched value by value (the bytes need not grow with the value there, as
#: HashFormer-Pool's chunk bits); longer ones by bisection, which needs bytes that never fall as the value grows.
EXHAUSTIVE = 200


@dataclass(frozen=True)
class Sizing:
    """What a budget chose: ``parameter = value`` (``None`` for a strategy of one size), giving ``count`` bytes at
    inference for the ``target`` bytes the ``budget`` asked; ``dense`` is the bytes of the float32 ``vocab_size x
    hidden_size`` table (``None`` without a vocabulary)."""

    budget: int | float
    target: int
    parameter: str | None
    value: int | None
    count: int
    dense: int | None

    def describe(self) -> str:
        """One line: the budget, what it chose and how close it came."""
        asked = f"budget={self.budget} ({self.target:,} bytes{_share(self.target, self.dense)})"
        chose = f"{self.parameter}={self.value} gives" if self.parameter else "its one size is"
        off = 100 * (self.count - self.target) / self.target
        return f"{asked}: {chose} {self.count:,}{_share(self.count, self.dense)}, {off:+.2f}% off the budget"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "of_dense": None if self.dense is None else self.count / self.dense}


def budget_target(budget: Budget, vocab_size: int | None, hidden_size: int, owner: str) -> int:
    """The bytes ``budget`` asks for: the bytes themselves, or the fraction of the float32 ``vocab_size x hidden_size``
    table's."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise ConfigError(f"{owner}: budget={budget!r} must be a number of bytes (an integer) or a fraction in (0, 1]")
    if isinstance(budget, int):
        if budget < 1:
            raise ConfigError(f"{owner}: budget={budget} must be a positive number of bytes, or a fraction in (0, 1]")
        return budget
    if not math.isfinite(budget):  # 1e400 reads as inf
        raise ConfigError(f"{owner}: budget={budget} is not a finite number: give a fraction in (0, 1] of the dense "
                          f"table such as 0.01, or a number of parameters as an integer such as 100000")
    if not 0.0 < budget <= 1.0:
        raise ConfigError(f"{owner}: budget={budget} is a fraction outside (0, 1] of the dense table: give a fraction "
                          f"such as 0.01, or a number of bytes as an integer such as {max(1, round(budget))}")
    if vocab_size is None:
        raise ConfigError(f"{owner} has an unlimited vocabulary, so budget={budget} has no dense table to be a fraction of: "
                          f"give the number of bytes as an integer (e.g. {round(budget * 50265 * hidden_size * DENSE_VALUE_BYTES):,} "
                          f"for {budget} of a 50265 x {hidden_size} float32 table)")
    return max(1, round(budget * vocab_size * hidden_size * DENSE_VALUE_BYTES))


def fit_budget(cls: Any, vocab_size: int | None, hidden_size: int, budget: Budget, arguments: dict[str, Any]) -> Sizing:
    """The sizing of ``cls(vocab_size, hidden_size, **arguments)`` that meets ``budget`` within :data:`TOLERANCE`.
    ``cls``: an :class:`~lit_embed.embeddings.base.EmbeddingStrategy` class (not named in the signature: base imports
    this module, and this module imports nothing back).

    Raises:
        ConfigError: no value of the size parameter meets it; the message names the nearest budgets that one does.
    """
    owner = cls.__name__
    target = budget_target(budget, vocab_size, hidden_size, owner)
    dense = None if vocab_size is None else vocab_size * hidden_size * DENSE_VALUE_BYTES
    name = cls.size_parameter
    if name is None:
        size = cls.count_bytes(vocab_size, hidden_size, **arguments)
        if abs(size - target) <= TOLERANCE * target:
            return Sizing(budget, target, None, None, size, dense)
        raise BudgetError(f"{owner} has one size, {size:,} bytes{_share(size, dense)}, which is not budget={budget} "
                          f"({target:,} bytes{_share(target, dense)}): leave the budget unset, or use a strategy that compresses")
    low, high = cls.size_range(vocab_size, hidden_size, **arguments)
    if low > high:
        raise BudgetError(f"{owner} has no {name} to size with these arguments ({name} would lie in [{low}, {high}])")

    def count(value: int) -> int:
        return cls.count_bytes(vocab_size, hidden_size, **{**arguments, name: value})

    counted = _candidates(count, low, high, target)
    value, best = min(counted, key=lambda pair: (abs(pair[1] - target), pair[0]))
    if abs(best - target) <= TOLERANCE * target:
        return Sizing(budget, target, name, value, best, dense)
    below = max((pair for pair in counted if pair[1] < target), key=lambda pair: pair[1], default=None)
    above = min((pair for pair in counted if pair[1] > target), key=lambda pair: pair[1], default=None)
    nearest = [f"{c:,}{_share(c, dense)} ({name}={v})" for v, c in filter(None, (below, above))]
    edge = "" if below and above else f", its {'smallest' if above else 'largest'} size"
    raise BudgetError(f"{owner} cannot meet budget={budget} ({target:,} bytes{_share(target, dense)}) within "
                      f"{TOLERANCE:.0%}: the nearest it can meet {'is' if len(nearest) == 1 else 'are'} "
                      f"{' and '.join(nearest)}{edge}; ask for {'that' if len(nearest) == 1 else 'one of those'}, or change its other arguments")


def _candidates(count: Callable[[int], int], low: int, high: int, target: int) -> list[tuple[int, int]]:
    """``(value, count)`` of every value in a short range, else of the two values either side of ``target``."""
    if high - low < EXHAUSTIVE:
        return [(value, count(value)) for value in range(low, high + 1)]
    lo, hi = low, high  # the smallest value whose count reaches the target lies in [lo, hi]
    while lo < hi:
        middle = (lo + hi) // 2
        if count(middle) >= target:
            hi = middle
        else:
            lo = middle + 1
    return [(value, count(value)) for value in {max(low, lo - 1), lo}]


def _share(count: int, dense: int | None) -> str:
    return "" if dense is None else f", {100 * count / dense:.3g}% of dense"


def budgeted(init: Callable[..., None]) -> Callable[..., None]:
    """``init`` (a strategy's ``__init__`` that takes ``budget``) with the budget turned into its size argument first.

    The outermost constructor sizes (a subclass's, whose formula counts what it builds); the value the budget chose
    replaces whatever the size argument was given. Afterwards ``self.budget`` holds the budget, so that the strategy's
    config rebuilds it, and ``self.sizing`` what it chose.
    """
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind_partial(self, *args, **kwargs)  # a size argument without default may be left to the budget
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        budget = arguments.get("budget")
        if budget is not None and "_sizing" not in self.__dict__:
            rest = {k: v for k, v in arguments.items() if k not in ("self", "vocab_size", "hidden_size", "budget")}
            sizing = fit_budget(type(self), arguments["vocab_size"], arguments["hidden_size"], budget, rest)
            self.__dict__["_sizing"] = sizing  # before nn.Module.__init__: a plain attribute
            replaced = ""
            if sizing.parameter is not None:
                given = arguments.get(sizing.parameter, inspect.Parameter.empty)
                arguments[sizing.parameter] = sizing.value
                if given not in (sizing.value, signature.parameters[sizing.parameter].default, inspect.Parameter.empty):
                    replaced = f" (in place of the {given} given)"
            log.info("%s: %s%s", type(self).__name__, sizing.describe(), replaced)
        del arguments["self"]
        init(self, **arguments)
        self.budget = budget

    return __init__


__all__ = ["DENSE_VALUE_BYTES", "TOLERANCE", "Budget", "BudgetError", "Sizing", "budget_target", "budgeted", "fit_budget"]
