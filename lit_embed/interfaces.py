"""What the pieces of lit-embed need from each other, declared once.

A data module feeds a model through :class:`TextModel` (the text side of the model's strategy and its
objective's batches); a model reads its data through :class:`TextData` (a task model: :class:`TaskData`). Nothing
else crosses between them, and :func:`wire` hands each its partner, once, where a command assembles them (no model
or data module looks the other up through the trainer). :func:`require` checks an object against one without running any of its code (a property
is not called) and refuses it naming what it lacks.

This module sits below the data modules and models it describes (they import it), so it imports neither: the task
they share is typed ``Any`` here, a :class:`~lit_embed.data.tasks.Task`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from lit_embed.errors import ConfigError

if TYPE_CHECKING:
    from lit_embed.embeddings.text import TextEncoder

#: Items (``{"codes", ...}`` per example) to a batch of tensors.
Collate = Callable[[list[dict]], dict[str, Any]]


class TextModel(Protocol):
    """What a data module needs from the model it feeds (every lit-embed ``EmbeddingModule`` is one)."""

    @property
    def max_length(self) -> int:
        """Positions the backbone has: the longest example, specials included."""

    @property
    def pair_separators(self) -> int:
        """``sep`` codes between the two sides of a pair (RoBERTa's family: 2, as in its pre-training)."""

    @property
    def expected_tokenizer(self) -> str | None:
        """The tokenizer the weights were trained with, where they were (``None``: the data's choice)."""

    def text_encoder(self, tokenizer: str | None) -> TextEncoder:
        """How text becomes this model's codes (its strategy's encoder)."""

    def collator(self, text_encoder: TextEncoder, seed: int | None = None) -> Collate:
        """The objective's batches: corrupted for training, or with ``seed`` deterministically per example."""

    def share_text_state(self) -> None:
        """Give every rank global rank 0's corpus-fitted text state (a collective under DDP)."""


class TaskModel(TextModel, Protocol):
    """A model trained on one task of the task table (its data must be that task's)."""

    task: Any


class TextData(Protocol):
    """What every model reads of the data it is fed (every lit-embed data module)."""

    #: The tokenizer the data encodes with: recorded in checkpoints so a later run uses the same.
    tokenizer: str | None


class TaskData(TextData, Protocol):
    """What a task model needs from its data (``TaskDataModule``, ``XNLIDataModule``)."""

    #: The task of the task table the data is.
    task: Any
    #: Whether ``{stage}/average/{metric}`` is logged over the evaluation sets (XNLI's languages).
    average_eval_sets: bool
    #: The paper whose protocol the run follows (``hashformers``...), or ``None``: the task table's per-paper
    #: selection and reported metrics follow it.
    paper: str | None

    def eval_set_names(self, stage: str) -> list[str]:
        """Names of the evaluation sets of ``stage`` (``val``, ``test``) in dataloader order; ``""`` alone for one set."""

    def train_texts(self) -> Iterator[str]:
        """Every training text as the model sees it (token frequencies for post-hoc compression)."""

    def test_examples(self) -> Iterator[list[str]]:
        """The texts of each test example (coverage of the test data by a compressed vocabulary's common tokens)."""


class FillMaskModel(TextModel, Protocol):
    """A model that predicts tokens (``MaskedLM``): what ``lit-embed predict`` on a corpus needs."""

    def fill_mask(self, batch: dict[str, Any], top_k: int) -> list[dict]:
        """The ``top_k`` most probable ids and their probabilities at each masked position, one record per text."""


class FillMaskData(Protocol):
    """What a :class:`FillMaskModel` predicting on its data reads from it (``CorpusDataModule``)."""

    #: Fills written per mask, the most probable first.
    top_k: int


class PredictData(Protocol):
    """What ``lit-embed predict`` needs from its data (every lit-embed data module)."""

    #: The task of the task table, for task data (its columns are repeated beside each prediction); else None.
    task: Any
    #: The rows predicted, in order (set up for the ``predict`` stage; None before).
    predict_rows: Any

    def describe_prediction(self, record: dict) -> dict:
        """A model's prediction record as written (ids turned into tokens where the data has them)."""


class Feeds(Protocol):
    """A data module that feeds a model (every lit-embed data module)."""

    def feed(self, model: TextModel) -> None:
        """Feed ``model``: its text encoder, collator and length from now on."""


class ReadsData(Protocol):
    """A model that reads its data (every lit-embed ``EmbeddingModule``)."""

    def read_data(self, data: TextData) -> None:
        """Read ``data`` from now on: its tokenizer (a task model: its evaluation sets and paper)."""


def wire(model: object, data: object) -> None:
    """The one step that hands a model and its data module each other, where a command assembles them (the CLI
    after it builds them; call it yourself before ``trainer.fit(model, data)`` in Python): a data module that feeds
    models gets ``model`` (refused naming what it lacks unless it is a :class:`TextModel`), a model that reads its
    data gets ``data``. Either may be of a kind that takes no partner (a plain LightningModule or data module)."""
    if data is not None and provides(data, Feeds):
        require(model, TextModel, f"fed by {type(data).__name__}")
        data.feed(model)
    if data is not None and provides(model, ReadsData):
        model.read_data(data)


def members(protocol: type) -> list[str]:
    """The names a protocol declares (methods, properties and annotated attributes)."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls in (Protocol, object) or not getattr(cls, "_is_protocol", False):
            continue
        names |= {n for n in vars(cls) if not n.startswith("_")} | set(getattr(cls, "__annotations__", {}))
    return sorted(names)


def missing(obj: object, protocol: type) -> list[str]:
    """What ``obj`` lacks of ``protocol`` (looked up statically: nothing of ``obj`` runs)."""
    absent = object()
    return [name for name in members(protocol) if inspect.getattr_static(obj, name, absent) is absent]


def provides(obj: object, protocol: type) -> bool:
    return obj is not None and not missing(obj, protocol)


def require(obj: object, protocol: type, role: str) -> None:
    """Refuse ``obj`` in ``role`` unless it provides ``protocol``, naming what it lacks."""
    lacking = missing(obj, protocol)
    if lacking:
        raise ConfigError(
            f"{type(obj).__name__} cannot be {role}: it lacks {', '.join(lacking)} "
            f"(lit_embed.interfaces.{protocol.__name__})"
        )


__all__ = ["Collate", "Feeds", "FillMaskData", "FillMaskModel", "PredictData", "ReadsData", "TaskData", "TaskModel",
           "TextData", "TextModel", "members", "missing", "provides", "require", "wire"]
