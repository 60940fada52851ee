"""Training batches that resume mid-epoch, on any number of ranks and DataLoader workers.

* Map-style data is ordered by a ``DistributedSampler`` seeded with ``seed + epoch``, also in a single
  process, so an epoch's order is the same on every restart, and rank r of W takes every W-th block
  of the same permutation: a global batch holds the same blocks on 1 or W devices.
* Streamed data is an :class:`EndlessStream`: pass after pass over the rank's shards (split between
  DataLoader workers by ``datasets``), so no rank runs out of data while the others wait for it.
* The loader is torchdata's ``StatefulDataLoader``, which records after every batch where the
  sampler, or each worker's stream, stands; :class:`ResumableLoader` keeps the position of the
  batches training consumed and :class:`~lit_embed.data.base.TextDataModule` (the data modules' base) writes every
  rank's position into the checkpoint and hands it back on resume.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import Dataset, DistributedSampler, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

log = logging.getLogger(__name__)

# torchdata 0.11 calls an API torch 2.13 deprecated, once per epoch; it changes nothing.
warnings.filterwarnings("ignore", message=".*'set_vital' is deprecated.*")


class IndexedRows(Dataset):
    """The rows of a map-style dataset, each with its row number as ``index``.

    Evaluation deduplicates by it (a ``DistributedSampler`` repeats rows to even out the ranks) and
    seeds each row's corruption with it; training batches carry it too, which shows where data stands.
    """

    def __init__(self, rows) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return {**self.rows[index], "index": index}

    def __getitems__(self, indices: list[int]) -> list[dict]:
        fetch = getattr(self.rows, "__getitems__", None)
        rows = fetch(indices) if fetch is not None else [self.rows[i] for i in indices]
        return [{**row, "index": i} for row, i in zip(rows, indices)]


class EndlessStream(IterableDataset):
    """A streamed ``datasets.IterableDataset`` read pass after pass (pass e shuffled with ``seed + e``).

    Endless because shards differ in length: a finite stream would end one rank's epoch while the
    others still step, and DDP would wait forever for it. Training stops at ``max_steps``. Its
    position (the pass and ``datasets``' own shard position) is what each worker's ``state_dict`` holds.
    """

    def __init__(self, stream) -> None:
        self.stream = stream
        self.epoch = 0
        self._resume: dict | None = None

    def __iter__(self) -> Iterator[dict]:
        while True:
            self.stream.set_epoch(self.epoch)
            resumed, self._resume = self._resume, None
            if resumed is not None:
                self.stream.load_state_dict(resumed)
            empty = True
            for example in self.stream:
                empty = False
                yield example
            if empty and resumed is None:
                return  # this worker has no shard: stop it rather than loop over nothing
            self.epoch += 1

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "stream": self.stream.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = state["epoch"]
        self._resume = _padded_sources(state["stream"], self.stream.num_shards)


def _padded_sources(state: Any, length: int) -> Any:
    """``state`` with each list of concatenated sources (``ex_iterables``) lengthened to ``length`` entries by
    copies of its last one.

    datasets (5.2, ``IterableDataset._iter_pytorch``) loads a worker's saved position twice: into the rank's whole
    stream before sharding it between workers, then into the worker's shard. A concatenation of sources (the
    files of a corpus under token budgets) saves, in a worker, only its own sources, and the first load fails
    (IndexError) on the longer list. That load is thrown away and the second reads the first entries, the
    worker's own; the copies only need the shape of their siblings, which sources built alike have.
    """
    if isinstance(state, list):
        return [_padded_sources(value, length) for value in state]
    if not isinstance(state, dict):
        return state
    padded = {key: _padded_sources(value, length) for key, value in state.items()}
    sources = padded.get("ex_iterables")
    if isinstance(sources, list) and sources:
        sources += [copy.deepcopy(sources[-1]) for _ in range(length - len(sources))]
    return padded


class ResumableLoader:
    """One rank's training batches and the position of those training consumed.

    Lightning fetches one batch ahead on loaders without a length, so the position kept is the one
    after ``consumed()`` batches of the epoch (the fit loop's count), not after the last one fetched.

    Lightning's own way, a loader's ``state_dict``, would store only rank 0's position, and would not
    restore it when ``configure_optimizers`` reads ``estimated_stepping_batches`` (Lightning issue
    #20550; ours does). :class:`~lit_embed.data.base.TextDataModule` saves every rank's :meth:`position` instead; the
    empty ``state_dict`` below only tells Lightning that the loader resumes mid-epoch.
    """

    def __init__(self, loader: StatefulDataLoader, consumed: Callable[[], int]) -> None:
        self.loader = loader
        #: Lightning sets the epoch of a loader's ``sampler`` at each epoch start.
        self.sampler = loader.sampler if isinstance(loader.sampler, DistributedSampler) else None
        self.batch_size = loader.batch_size
        self._consumed = consumed
        self._pending: dict | None = None
        self._positions: deque[tuple[int, dict | None]] = deque(maxlen=4)

    def __len__(self) -> int:
        return len(self.loader)  # a TypeError for streams, which Lightning reads as "no length"

    def __iter__(self) -> Iterator[Any]:
        self._positions.clear()
        count, state = self._apply_pending()
        self._positions.append((count, state))
        for batch in self.loader:
            count += 1
            self._positions.append((count, self.loader.state_dict()))
            yield batch

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        """Nothing: the data module restores the position (see the class docstring)."""

    def restore(self, position: dict) -> None:
        """Resume from ``position`` (of :meth:`position`) when iteration next starts."""
        self._pending = position

    def position(self) -> dict:
        """Where training stands in the epoch: ``{"epoch", "batches", "loader"}`` (JSON-like)."""
        epoch = self.sampler.epoch if self.sampler is not None else None
        if not self._positions:
            return {"epoch": epoch, "batches": 0, "loader": None}
        consumed = self._consumed()
        for batches, state in reversed(self._positions):
            if batches == consumed:
                return {"epoch": epoch, "batches": batches, "loader": state}
        batches, state = self._positions[-1]
        log.warning("training consumed %d batches but the loader fetched %d: saving the latter", consumed, batches)
        return {"epoch": epoch, "batches": batches, "loader": state}

    def _apply_pending(self) -> tuple[int, dict | None]:
        """Load a pending position into the loader; ``(batches, loader state)`` where the epoch starts."""
        position, self._pending = self._pending, None
        if position is None or position["loader"] is None:
            return 0, None
        length = _length(self.loader)
        if length is not None and position["batches"] >= length:
            return 0, None  # saved at the end of an epoch: the next one starts afresh
        if self.sampler is not None and position["epoch"] is not None:
            self.sampler.set_epoch(position["epoch"])
        self.loader.load_state_dict(position["loader"])
        return position["batches"], position["loader"]


def _length(loader) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


__all__ = ["EndlessStream", "IndexedRows", "ResumableLoader"]
