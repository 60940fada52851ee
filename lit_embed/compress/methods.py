"""Post-hoc compression methods: what one is, and the methods by name.

Each method is one :class:`CompressionMethod` subclass, found by its ``name`` (``--method NAME``, or ``method: NAME`` in a
compress config): defining the class registers it, so a plugin's method is one class and one YAML file, like a
strategy. It declares its own options (a dataclass, ``Options``), which the generic command offers once the method is
named; nothing of one method's is in :class:`Job` or the command. lit-embed's own, one module per family, each fitting a
strategy to a dense ``V x d`` table given the common ids:

* :mod:`~lit_embed.compress.partial`: the paper's frequency-aware partial sparse coding (``sparse_coding``) and its
  baselines ``pca`` and ``unk``: the common rows kept, the rare ones rebuilt from them;
* :mod:`~lit_embed.compress.scalar`: the table row by row, ``dense`` (as it is, the uncompressed reference) or
  ``int8`` / ``int4`` (per-row scalar quantisation);
* :mod:`~lit_embed.compress.codebooks`: product quantisation (``pq``, k-means per group of dimensions) and additive
  quantisation (``aq``);
* :mod:`~lit_embed.compress.low_rank`: ``svd``, the best low-rank factorisation;
* :mod:`~lit_embed.compress.strategy_fit`: ``fit``, any vocabulary strategy fitted to the table.

Every method takes ``--budget``: bytes at inference, or a fraction of the table's bytes (those of one size accept the
budget their bytes meet and refuse another, saying what they take). Everything is batched in torch (matrix products in
chunks of rare tokens, one batched k x k solve), so the 30522 x 768 table of DistilBERT is sparse-coded in seconds on a
CPU. Importing any module of :mod:`lit_embed.compress` registers every family (the package imports them).
"""

from __future__ import annotations

import difflib
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import ClassVar

from torch import Tensor

from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.errors import ConfigError, not_known

#: Bytes of a block of similarities or distances computed at once (sparse coding's rare x common rows, k-means'
#: points x centroids).
BLOCK_BYTES = 1 << 27


@dataclass
class Job:
    """What a method compresses: the dense table, its common ids (increasing; specials included), the tokenizer's
    ``<unk>`` id, each id's count in the data (``None`` where none were counted), and where and how reproducibly to
    work. Nothing here belongs to one method: a method's own settings are its :attr:`CompressionMethod.Options`."""

    weight: Tensor
    common_ids: Tensor
    unk_id: int | None = None
    counts: Tensor | None = None
    seed: int = 0
    device: str = "cpu"


@dataclass
class NoOptions:
    """A method that takes no options."""


class CompressionMethod(ABC):
    """A post-hoc compression of a dense ``V x d`` table into a strategy.

    Subclasses set ``name`` (registering the class under it), declare their options as a dataclass (``Options``:
    the command offers its fields as ``--FIELD`` and as keys of a compress config, and checks them) and implement
    :meth:`fit`. What they want said in the report (what was chosen, which backend ran) goes into :attr:`details`.
    """

    name: ClassVar[str]
    Options: ClassVar[type] = NoOptions
    registry: ClassVar[dict[str, type[CompressionMethod]]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if name is not None:
            known = CompressionMethod.registry.get(name)
            if known is not None and known.__qualname__ != cls.__qualname__:
                raise ConfigError(f"compression method {name!r} is defined twice ({known.__module__} and {cls.__module__})")
            CompressionMethod.registry[name] = cls

    def __init__(self, options: object | None = None) -> None:
        self.options = self.Options() if options is None else options
        self.details: dict[str, object] = {}

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in fields(cls.Options)]

    @property
    def tries(self) -> int:
        """How many candidates :meth:`fit` gives (more than one: the best on the validation split is kept)."""
        return 1

    def check(self, job: Job) -> None:  # noqa: B027 (an optional hook: most methods can do any job)
        """Refuse what cannot be done (before any work), naming the value and the fix."""

    @abstractmethod
    def fit(self, job: Job) -> dict[int | None, EmbeddingStrategy]:
        """The compressed strategies to choose from, by k (``None`` where k plays no part)."""


def method_class(name: str) -> type[CompressionMethod]:
    """The method registered as ``name``; a clear error naming the known ones otherwise."""
    if name not in CompressionMethod.registry:
        raise not_known("method", name, CompressionMethod.registry)
    return CompressionMethod.registry[name]


def method_named(name: str, options: dict | None = None) -> CompressionMethod:
    """The method ``name`` with ``options`` (its own, by field name); an unknown option is refused, naming the
    method's options and the closest one."""
    cls = method_class(name)
    known = cls.option_names()
    for key in options or {}:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            listed = ", ".join(known) if known else "none"
            raise ConfigError(f"{key!r} is not an option of compression method {name!r}: {hint}its options: {listed}")
    return cls(cls.Options(**(options or {})))
