"""The base of lit-embed's data modules: the model they feed, its text encoder, the global batch, and
training batches that resume mid-epoch.

A data module reaches its model only through :class:`~lit_embed.interfaces.TextModel` (the model
:func:`~lit_embed.interfaces.wire` hands it: :meth:`TextDataModule.feed`), and gets the text encoder in one place (:meth:`TextDataModule.text_encoder_for`):
the model's strategy's, for the data's tokenizer (checked against the one the model's weights were
trained with), fitted on the training texts where its codes depend on them (LSH n-grams), identical on
every rank, and its fitted state written beside the run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import pytorch_lightning as pl
from torch.utils.data import DistributedSampler, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from lit_embed.data.collate import PadCollator, TaskCollator
from lit_embed.data.loading import ResumableLoader
from lit_embed.data.tasks import Task
from lit_embed.distributed import apply_global_batch, gather_objects, is_distributed
from lit_embed.embeddings.text import FittableTextEncoder, TextEncoder, VocabTextEncoder
from lit_embed.errors import ConfigError
from lit_embed.hub import resolve_pretrained, trusting_remote_code
from lit_embed.interfaces import Collate, TextModel
from lit_embed.runs.logger import run_folder
from lit_embed.storage.files import write_atomic

log = logging.getLogger(__name__)


def check_batching(batch_size: int, num_workers: int, **others: int | None) -> None:
    """Refuse batch sizes below 1 and negative worker counts, naming the argument."""
    for name, value in {"batch_size": batch_size, **others}.items():
        if value is not None and value < 1:
            raise ConfigError(f"data {name}={value} must be at least 1")
    if num_workers < 0:
        raise ConfigError(f"data num_workers={num_workers} must be 0 (load in the main process) or more")


class TextDataModule(pl.LightningDataModule):
    """What lit-embed's data modules share: the model they feed and its text encoder, the global batch, and
    a training loader that resumes mid-epoch.

    Subclasses give :meth:`fit_texts` (what a corpus-fitted text encoder learns from) and set ``tokenizer``.

    ``state_dict`` (a collective: Lightning calls it on every rank when it saves) gathers every
    rank's position into the checkpoint; ``load_state_dict`` keeps them until the training loader
    is built, which then continues each rank exactly where it stopped. A resume with another number
    of ranks restarts the epoch's data (with a warning): positions of W ranks do not split over W'.
    """

    tokenizer: str | None = None
    task: Task | None = None  # task data: the task of the task table
    trust_remote_code: bool = False
    global_batch_size: int | None = None
    batch_size: int = 32
    num_workers: int = 0
    text_encoder: TextEncoder | None = None
    predict_rows: Any = None  # the rows `lit-embed predict` reads (interfaces.PredictData)
    fed: TextModel | None = None  # the model this data feeds (interfaces.wire)
    _train_loader: ResumableLoader | None = None
    _positions: list[dict] | None = None
    _unsaved_fit = False  # a text encoder was fitted on this data and its state is not beside the run yet

    # -- the model and its text encoder -----------------------------------------------------------
    def feed(self, model: TextModel) -> None:
        """Feed ``model`` (:func:`~lit_embed.interfaces.wire` checks it is a :class:`~lit_embed.interfaces.TextModel`)."""
        self.fed = model

    def model(self) -> TextModel:
        """The model this data feeds (:class:`PlainText` where there is none)."""
        return self.fed if self.fed is not None else PlainText(self.task)

    def fit_texts(self) -> Iterator[str]:
        """The texts a corpus-fitted text encoder (LSH n-grams) learns from: the training texts."""
        raise NotImplementedError(f"{type(self).__name__} must define fit_texts()")

    def fit_size(self) -> int | None:
        """How many texts :meth:`fit_texts` yields, where known without reading them (``None``: not known, a stream)."""
        return None

    def text_encoder_for(self, shared: bool = False) -> TextEncoder:
        """The model's text encoder for this data, once: fitted here where its codes depend on the texts.

        ``shared`` (in ``setup``: a collective under DDP) makes it identical on every rank: rank 0 fits
        it, every rank receives rank 0's fitted state, and rank 0 writes that state beside the run.
        Without it (``prepare_data``, one process per node) it is fitted where needed, nothing shared.
        """
        model = self.model()
        distributed = shared and is_distributed(self.trainer)
        if self.text_encoder is None:
            with trusting_remote_code(self.trust_remote_code):
                self.tokenizer = self._tokenizer_name(model)  # recorded in checkpoints: a later run uses the same
                encoder = model.text_encoder(self.tokenizer)
            if isinstance(encoder, FittableTextEncoder) and not encoder.fitted and (not distributed or self.trainer.is_global_zero):
                encoder.fit(self.fit_texts())  # deterministic; under DDP rank 0's is shared below
                self._unsaved_fit = True
            self.text_encoder = encoder
        if distributed and isinstance(self.text_encoder, FittableTextEncoder):
            model.share_text_state()
            if not self.trainer.is_global_zero:
                with trusting_remote_code(self.trust_remote_code):
                    self.text_encoder = model.text_encoder(self.tokenizer)  # rebuilt from rank 0's fitted state
        if shared and self._unsaved_fit and self.trainer is not None:
            artefact = self.text_encoder.artefact() if self.trainer.is_global_zero else None
            if artefact is not None:
                write_atomic(run_folder(self.trainer) / artefact[0], artefact[1])
            self._unsaved_fit = False
        return self.text_encoder

    def _tokenizer_name(self, model: TextModel) -> str | None:
        """The data's tokenizer, checked against the one the model's weights were trained with.

        ``None`` when neither names one: word-level hash strategies need none, and a vocabulary
        strategy's text encoder refuses it, saying to set ``data.init_args.tokenizer``.
        """
        expected = model.expected_tokenizer
        if self.tokenizer is None:
            return expected
        if expected is not None and not same_vocabulary(self.tokenizer, expected):
            raise ConfigError(
                f"data.tokenizer={self.tokenizer!r} differs from the model's tokenizer {expected!r} (its "
                f"vocabulary ids would mean other tokens): leave data.init_args.tokenizer unset to use the model's"
            )
        return self.tokenizer

    def check_length(self, max_length: int) -> None:
        """Refuse examples longer than the backbone's positions."""
        limit = self.model().max_length
        if max_length > limit:
            raise ConfigError(
                f"data max_length={max_length} exceeds the backbone's {limit} positions: lower data.max_length or "
                f"raise encoder.max_position_embeddings"
            )

    # -- batches ---------------------------------------------------------------------------------
    def per_device_batch_size(self, stage: str | None) -> int:
        """``batch_size``, or the share of ``global_batch_size`` (setting accumulation) when fitting."""
        if self.global_batch_size is None or stage not in (None, "fit"):
            return self.batch_size
        return apply_global_batch(self.trainer, self.global_batch_size, self.batch_size)

    def resumable_loader(
        self, dataset, batch_size: int, collate_fn, seed: int | None = None, num_workers: int | None = None
    ) -> ResumableLoader:
        """The training loader of this rank, continuing from the checkpoint's position when resuming."""
        trainer = self.trainer
        num_workers = self.num_workers if num_workers is None else num_workers
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        sampler = None
        if not isinstance(dataset, IterableDataset):
            seed = int(os.environ.get("PL_GLOBAL_SEED", 0)) if seed is None else seed
            sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed)
            if trainer is not None:
                sampler.set_epoch(trainer.current_epoch)
        loader = StatefulDataLoader(
            dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate_fn, num_workers=num_workers,
            persistent_workers=num_workers > 0,
        )
        self._train_loader = ResumableLoader(loader, self._consumed)
        if self._positions is not None:
            if len(self._positions) == world:
                self._train_loader.restore(self._positions[rank])
            elif rank == 0:
                log.warning(
                    "the checkpoint's data positions are of %d ranks, this run has %d: the epoch's data starts "
                    "again (resume on %d devices to continue where it stopped)",
                    len(self._positions), world, len(self._positions),
                )
            self._positions = None
        return self._train_loader

    def _consumed(self) -> int:
        return self.trainer.fit_loop.epoch_loop.batch_progress.current.ready

    def state_dict(self) -> dict[str, Any]:
        if self._train_loader is None:
            return {}
        return {"train_positions": gather_objects(self.trainer, self._train_loader.position())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._positions = state_dict.get("train_positions")

    def describe_prediction(self, record: dict) -> dict:
        """A prediction record as the model gave it (a data module with ids to spell out overrides this)."""
        return record




class PlainText:
    """The :class:`~lit_embed.interfaces.TextModel` of a data module used without a model: the
    tokenizer's ids, padded batches (with the labels of ``task``, where there is one)."""

    max_length = 1 << 30
    pair_separators = 1
    expected_tokenizer = None

    def __init__(self, task: Task | None = None) -> None:
        self.task = task

    def text_encoder(self, tokenizer: str | None) -> TextEncoder:
        return VocabTextEncoder(tokenizer)

    def collator(self, text_encoder: TextEncoder, seed: int | None = None) -> Collate:
        return PadCollator(text_encoder) if self.task is None else TaskCollator(text_encoder, self.task.regression)

    def share_text_state(self) -> None:
        """Nothing to share."""


def same_vocabulary(a: str, b: str) -> bool:
    """Whether two tokenizer names give the same ids (same name or folder, else the same vocabulary)."""
    if a == b or resolve_pretrained(a, what="tokenizer") == resolve_pretrained(b, what="tokenizer"):
        return True
    return VocabTextEncoder(a).fingerprint() == VocabTextEncoder(b).fingerprint()


__all__ = ["PlainText", "TextDataModule", "check_batching", "same_vocabulary"]
