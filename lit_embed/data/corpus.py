"""Pre-training corpora: text -> the strategy's codes -> fixed-length blocks -> batches."""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from torch.utils.data import DataLoader

from lit_embed._compat import dataset_fingerprint
from lit_embed.data.base import TextDataModule, check_batching
from lit_embed.data.collate import FillMaskCollator
from lit_embed.data.loading import EndlessStream, IndexedRows, ResumableLoader
from lit_embed.data.sources import (
    check_files,
    load_files,
    load_hub,
    refuse_script_datasets,
    text_lines,
)
from lit_embed.embeddings.text import TextEncoder
from lit_embed.errors import ConfigError
from lit_embed.interfaces import FillMaskModel, provides
from lit_embed.progress import Stage

log = logging.getLogger(__name__)

PIPELINE_VERSION = 1


class CorpusDataModule(TextDataModule):
    """A pre-training corpus grouped into ``max_length`` blocks of the strategy's codes.

    Texts are concatenated and cut into blocks of ``max_length - 2`` codes, each wrapped in the
    ``cls``/``sep`` specials (RoBERTa's FULL-SENTENCES). The block-building map runs once, in
    ``prepare_data`` (one process per node), and every rank reuses its ``datasets`` cache in ``setup``.
    A text encoder whose codes depend on the corpus (LSH hashing) is first fitted on its texts, on
    global rank 0 under DDP, and every rank receives rank 0's fitted state; the fitted state is
    written beside the run (``lsh_ngrams.json``).

    Training batches resume mid-epoch from a checkpoint (see :mod:`lit_embed.data.loading`);
    validation blocks carry their row ``index``, which seeds their masking and lets the metrics count
    each block once under DDP.

    Streaming (corpora larger than the disk): the first texts of the stream, until they give
    ``val_size`` blocks, are the validation set (kept in memory, the same on every rank) and are left
    out of training wherever they occur; the rest is split between ranks (by shard where the shards
    divide evenly, else every rank keeps every world-size-th text) and between each rank's DataLoader
    workers (by shard), cut into blocks, shuffled in a buffer, and read pass after pass until
    ``max_steps`` (set it: a stream has no epochs that end together on every rank). With ``token_budgets``
    a file gives only its first training blocks, as many as its budget of tokens fills: an extract read
    from the start of the file, the same texts on every pass and every run, with no pass over the corpus
    beforehand (the k-sub-embedding paper's ~4.0B tokens of CC-100, ``configs/data/cc100_xnli.yaml``).

    Args:
        tokenizer: HF tokenizer name or folder (``all-MiniLM-L6-v2`` works offline); the model's
            strategy decides how it is used (vocabulary ids, or hashed pieces). Word-level hash
            strategies need none.
        datasets: hub datasets, ``name`` or ``name:config``, e.g. ``wikimedia/wikipedia:20231101.en``, and
            ``name@revision[:config]`` to read one commit. Loading scripts are refused (``datasets`` 4+ cannot
            run them): known ones (``statmt/cc100``, ``bookcorpus/bookcorpus``) when the module is built.
        files: local files (txt or txt.xz: one text per line; jsonl/csv/parquet: ``text_column``), or
            ``sample-corpus``; checked when the module is built.
        text_column: column holding the text.
        max_length: tokens per block, specials included.
        batch_size: blocks per batch on each device; with ``global_batch_size``, the most per device.
        global_batch_size: blocks per optimiser step over all devices (the papers' 128 or 256): the
            per-device batch and the gradient accumulation follow from the number of devices.
        val_size: validation blocks, a fraction below 1 or a count (a count when streaming).
        streaming: stream the corpora instead of downloading and caching them.
        shuffle_buffer: blocks in the streaming shuffle buffer; 0 keeps the stream's order. Resuming
            restores each worker's position in its shards, but not the blocks its buffer held then.
        max_texts: read at most this many texts per source (quick runs).
        token_budgets: tokens to train on from each local file, by file name (``ar.txt.xz: 181000000``), counted
            in the strategy's codes as blocks of ``max_length - 2`` (a budget takes the first
            ``ceil(budget / (max_length - 2))`` blocks of the file's training texts). Streaming local files only,
            every file with its budget; ``null`` reads every file whole.
        num_workers: DataLoader worker processes (streaming: at most one per shard of the rank).
        seed: seeds the train/validation split, the order of each epoch, the streaming shuffle and
            the validation masking.
        predict_input: the texts ``lit-embed predict`` fills in (a MaskedLM): a ``.txt`` file (one text a line),
            a csv/tsv/jsonl/parquet file with ``text_column``, or a list of texts; each holds ``<mask>`` (or the
            tokenizer's own mask token) once or more. The corpus is not read when predicting.
        top_k: fills written per mask, the most probable first.
    """

    def __init__(
        self,
        tokenizer: str | None = None,
        datasets: list[str] | None = None,
        files: list[str] | None = None,
        text_column: str = "text",
        max_length: int = 512,
        batch_size: int = 32,
        global_batch_size: int | None = None,
        val_size: float = 0.02,
        streaming: bool = False,
        shuffle_buffer: int = 10_000,
        max_texts: int | None = None,
        token_budgets: dict[str, int] | None = None,
        num_workers: int = 0,
        seed: int = 0,
        predict_input: str | list[str] | None = None,
        top_k: int = 5,
    ) -> None:
        super().__init__()
        check_batching(batch_size, num_workers, global_batch_size=global_batch_size)
        if top_k < 1:
            raise ConfigError(f"top_k={top_k} must be at least 1 (fills written per <mask>)")
        if not datasets and not files:
            raise ConfigError("the corpus is empty: give hub `datasets` or local `files` (e.g. files: [sample-corpus])")
        if max_length < 3:
            raise ConfigError(f"max_length={max_length} leaves no room for text between cls and sep: use at least 3")
        if streaming and not (val_size >= 1 and float(val_size).is_integer()):
            raise ConfigError(f"streaming needs val_size as a number of blocks, got {val_size}")
        if shuffle_buffer < 0:
            raise ConfigError(f"shuffle_buffer={shuffle_buffer} must be 0 (no shuffling) or more")
        refuse_script_datasets(list(datasets or []))
        check_files(list(files or []))
        _check_budgets(token_budgets, list(files or []), list(datasets or []), streaming)
        self.save_hyperparameters()
        self.tokenizer = tokenizer
        self.sources = list(datasets or [])
        self.files = list(files or [])
        self.text_column = text_column
        self.max_length = max_length
        self.batch_size = batch_size
        self.global_batch_size = global_batch_size
        self.val_size = val_size
        self.streaming = streaming
        self.shuffle_buffer = shuffle_buffer
        self.max_texts = max_texts
        self.token_budgets = dict(token_budgets or {})
        self.num_workers = num_workers
        self.seed = seed
        self.text_encoder: TextEncoder | None = None
        self.collate = self.eval_collate = None
        self.train_set = self.val_set = None
        self.train_batch_size = batch_size
        self.predict_input = predict_input
        self.top_k = top_k
        self.predict_rows: datasets.Dataset | None = None
        self.predict_set: list[dict] | None = None
        self.predict_collate: FillMaskCollator | None = None

    # -- Lightning hooks -------------------------------------------------------------------------
    def prepare_data(self) -> None:
        if self._predicting():
            self._check_fills_masks()  # before a text encoder is fitted on the corpus for nothing
        encoder = self.text_encoder_for()  # fitted here first where it depends on the corpus
        if not self.streaming and not self._predicting():
            self._blocks(encoder)  # downloads and builds the cache once per node

    def setup(self, stage: str | None = None) -> None:
        self.check_length(self.max_length)
        if stage == "predict":
            self._check_fills_masks()
        encoder = self.text_encoder_for(shared=True)
        model = self.model()
        if stage == "predict":
            self.predict_rows, self.predict_set = self._fill_mask_items(encoder)
            self.predict_collate = FillMaskCollator(encoder)
            return
        self.collate = model.collator(encoder)
        self.eval_collate = model.collator(encoder, seed=self.seed)
        self.train_batch_size = self.per_device_batch_size(stage)
        if self.streaming:
            self.val_set, held_out = self._held_out_blocks(encoder)
            self.train_set = self._train_stream(encoder, held_out)
        else:
            blocks = self._blocks(encoder)
            split = blocks.train_test_split(test_size=self._val_count(len(blocks)), seed=self.seed, shuffle=True)
            self.train_set, self.val_set = split["train"], split["test"]

    def train_dataloader(self) -> ResumableLoader:
        if self.streaming:
            workers = min(self.num_workers, self.train_set.num_shards)
            if workers < self.num_workers:
                log.warning(
                    "num_workers=%d but this rank streams %d shard(s): using %d worker(s)",
                    self.num_workers, self.train_set.num_shards, workers,
                )
            return self.resumable_loader(EndlessStream(self.train_set), self.train_batch_size, self.collate, num_workers=workers)
        return self.resumable_loader(IndexedRows(self.train_set), self.train_batch_size, self.collate, seed=self.seed)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.predict_set, batch_size=self.batch_size, shuffle=False, collate_fn=self.predict_collate)

    def describe_prediction(self, record: dict) -> dict:
        """A MaskedLM's fills with their tokens: ``{"fills": [[{"token", "id", "p"}, ...] per mask]}``."""
        tokens = self.text_encoder.tokenizer.convert_ids_to_tokens
        record["fills"] = [[{"token": token, **fill} for token, fill in zip(tokens([f["id"] for f in fills]), fills)]
                           for fills in record["fills"]]
        return record

    def _predicting(self) -> bool:
        return self.trainer is not None and self.trainer.state.fn == "predict"

    def _check_fills_masks(self) -> None:
        model = self.model()
        if not provides(model, FillMaskModel):
            raise ConfigError(f"lit-embed predict on a corpus fills in <mask> with a MaskedLM; {type(model).__name__} "
                              f"does not predict tokens: fine-tune the checkpoint on a task to predict labels")

    def _fill_mask_items(self, encoder: TextEncoder) -> tuple[datasets.Dataset, list[dict]]:
        """The texts of ``predict_input`` and their codes: ``cls``, the pieces between the masks with a mask
        code between each two, ``sep``."""
        texts = self._predict_texts()
        marks = {"<mask>", getattr(getattr(encoder, "tokenizer", None), "mask_token", None) or "<mask>"}
        splitter = re.compile("|".join(re.escape(mark) for mark in sorted(marks)))
        cls, sep, mask = (int(encoder.special_code(name)) for name in ("cls", "sep", "mask"))
        items = []
        for number, text in enumerate(texts, 1):
            pieces = splitter.split(text)
            if len(pieces) < 2:
                raise ConfigError(f"predict_input text {number} ({text[:60]!r}) has no {' or '.join(sorted(marks))} to fill in")
            codes = [cls]
            for place, piece in enumerate(encoder.encode(pieces)):
                codes += ([mask] if place else []) + piece.tolist()
            codes.append(sep)
            if len(codes) > self.max_length:
                raise ConfigError(f"predict_input text {number} has {len(codes)} tokens, more than max_length="
                                  f"{self.max_length}: shorten it or raise data.init_args.max_length")
            items.append({"codes": np.asarray(codes, dtype=np.int64), "index": number - 1})
        return datasets.Dataset.from_dict({"text": texts}), items

    def _predict_texts(self) -> list[str]:
        given = self.predict_input
        if given is None:
            raise ConfigError("lit-embed predict on a corpus needs the texts to fill in: --data.init_args.predict_input "
                              "FILE (one text a line, each with <mask>)")
        if isinstance(given, list):
            texts = [str(text) for text in given]
        elif str(given).endswith(".txt"):
            texts = text_lines(given)
        else:
            rows = load_files([given], split="predict")
            if self.text_column not in rows.column_names:
                raise ConfigError(f"predict_input {given!r} has no column {self.text_column!r} (columns: "
                                  f"{rows.column_names}): set data.init_args.text_column")
            texts = list(rows[self.text_column])
        if not texts:
            raise ConfigError(f"predict_input {given!r} has no texts: give one text per line")
        return texts

    def val_dataloader(self) -> DataLoader:
        return DataLoader(
            IndexedRows(self.val_set),
            batch_size=self.batch_size,
            shuffle=False,
            collate_fn=self.eval_collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    # -- pipeline --------------------------------------------------------------------------------
    def fit_texts(self) -> Iterator[str]:
        """Every text of the corpus, in order (what a corpus-fitted text encoder learns from)."""
        for batch in self._texts().iter(batch_size=1000):
            yield from batch[self.text_column]

    def fit_size(self) -> int | None:
        return None if self.streaming else len(self._texts())

    def _texts(self):
        columns = [texts for _, texts in self._sources()]
        return datasets.concatenate_datasets(columns) if len(columns) > 1 else columns[0]

    def _sources(self) -> list[tuple[int | None, Any]]:
        """The texts of each source and the blocks its token budget allows (``None``: all): the hub datasets, then
        the local files, one source in all or, with token budgets (files only), one each."""
        loaded = [(name, None, load_hub(name, streaming=self.streaming)) for name in self.sources]
        groups = [[name] for name in self.files] if self.token_budgets else [self.files] * bool(self.files)
        for group in groups:
            budget = self.token_budgets.get(Path(group[0]).name)
            blocks = None if budget is None else math.ceil(budget / (self.max_length - 2))
            loaded.append((group[0] if len(group) == 1 else "files", blocks, load_files(group, streaming=self.streaming)))
        sources = []
        for name, blocks, part in loaded:
            names = part.column_names or [self.text_column]
            if self.text_column not in names:
                raise ConfigError(f"{name}: no column {self.text_column!r} (columns: {names}); set data.text_column")
            part = part.select_columns([self.text_column])
            if self.max_texts is not None:
                part = part.take(self.max_texts)
            sources.append((blocks, part))
        return sources

    def _blocks(self, encoder: TextEncoder):
        texts = self._texts()
        builder = BlockBuilder(encoder, self.max_length, self.text_column)
        kwargs: dict[str, Any] = {"batched": True, "batch_size": 1000, "remove_columns": [self.text_column]}
        key = f"{dataset_fingerprint(texts)}|{encoder.fingerprint()}|{self.max_length}|{PIPELINE_VERSION}"
        kwargs["new_fingerprint"] = hashlib.sha256(key.encode()).hexdigest()[:32]
        with Stage("Tokenising into blocks") as stage:  # the map's bar is off in a log
            blocks = texts.map(builder, desc=stage.name, **kwargs)
            stage.count = len(blocks)
        if len(blocks) < 2:
            raise ConfigError(
                f"the corpus {self.sources + self.files} gives {len(blocks)} block(s) of {self.max_length} tokens: "
                f"at least 2 are needed (one to train, one to validate); add text or lower max_length"
            )
        return blocks.with_format("numpy")

    def _val_count(self, total: int) -> int:
        count = int(round(self.val_size * total)) if self.val_size < 1 else int(self.val_size)
        if not 1 <= count < total:
            raise ConfigError(f"val_size={self.val_size} gives {count} of {total} blocks: pick between 1 and {total - 1}")
        return count

    # -- streaming -------------------------------------------------------------------------------
    def _held_out_blocks(self, encoder: TextEncoder):
        """The validation blocks (from the first texts of the stream) and the digests of their texts."""
        count = int(self.val_size)
        builder = BlockBuilder(encoder, self.max_length, self.text_column)
        blocks, digests = [], set()
        for batch in self._texts().iter(batch_size=100):
            digests.update(text_digest(text) for text in batch[self.text_column])
            blocks.extend(builder(batch)["codes"])
            if len(blocks) >= count:
                break
        if len(blocks) < count:
            raise ConfigError(
                f"the stream {self.sources + self.files} gives only {len(blocks)} block(s) of {self.max_length} tokens "
                f"for val_size={count} validation blocks (and none to train on): lower val_size or add text"
            )
        held_out = datasets.Dataset.from_dict({"codes": [np.asarray(b) for b in blocks[:count]]})
        return held_out.with_format("numpy"), HeldOut(digests, self.text_column)

    def _train_texts(self, held_out: HeldOut):
        """This rank's share of the streamed texts that are not held out."""
        return self._rank_share(self._texts().filter(held_out, batched=True, batch_size=1000))

    def _rank_share(self, stream):
        """This rank's share of ``stream``: by shard (file) where they divide evenly between ranks, else every
        world-size-th example."""
        from datasets.distributed import split_dataset_by_node

        trainer = self.trainer
        if trainer is not None and trainer.world_size > 1:
            stream = split_dataset_by_node(stream, rank=trainer.global_rank, world_size=trainer.world_size)
        return stream

    def _train_stream(self, encoder: TextEncoder, held_out: HeldOut):
        """This rank's texts cut into blocks and shuffled, lazily, as they stream. Under token budgets each file is
        cut into blocks alone and gives its first ones, before the ranks share them: the extract is the corpus's,
        whatever the number of ranks and workers. Every file's pipeline has the same steps, which a resumed worker
        needs (:class:`~lit_embed.data.loading.EndlessStream`)."""
        builder = BlockBuilder(encoder, self.max_length, self.text_column)
        to_blocks = {"function": builder, "batched": True, "batch_size": 1000, "remove_columns": [self.text_column]}
        if self.token_budgets:
            parts = []
            for count, texts in self._sources():
                parts.append(texts.filter(held_out, batched=True, batch_size=1000).map(**to_blocks).take(count))
            blocks = self._rank_share(datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0])
        else:
            blocks = self._train_texts(held_out).map(**to_blocks)
        if self.shuffle_buffer:
            blocks = blocks.shuffle(seed=self.seed, buffer_size=self.shuffle_buffer)
        return blocks


def _check_budgets(budgets: dict[str, int] | None, files: list[str], hub: list[str], streaming: bool) -> None:
    """Refuse token budgets that name no file, leave a file or a hub dataset without one, are not a positive count,
    or come without streaming."""
    if not budgets:
        return
    if not streaming:
        raise ConfigError("token_budgets read the start of each file as it streams: set streaming: true (or "
                          "token_budgets: null to read the files whole)")
    if hub:
        raise ConfigError(f"token_budgets apply to local files, and the corpus also reads hub datasets {hub}: give "
                          f"the corpus as files only, or token_budgets: null")
    names = [Path(name).name for name in files]
    unbudgeted = [name for name in names if name not in budgets]
    if unbudgeted:
        raise ConfigError(f"token_budgets gives no budget to {unbudgeted}: give every file one (each file's first "
                          f"tokens are an extract only beside the others'), or token_budgets: null")
    for name, budget in budgets.items():
        if names.count(name) != 1:
            found = "no file" if name not in names else f"{names.count(name)} files"
            raise ConfigError(f"token_budgets names {name!r}, which is the name of {found} of files {names}: key each "
                              f"budget by the name of one file")
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise ConfigError(f"token_budgets[{name!r}]={budget!r} must be a positive number of tokens")


def text_digest(text) -> bytes:
    """8 bytes identifying a text, the same in every process (no Python ``hash()``)."""
    value = text if isinstance(text, str) else ""
    return hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=8).digest()


class HeldOut:
    """Batched filter: keep the texts that are not validation texts (by digest); picklable for workers."""

    def __init__(self, digests: set[bytes], column: str) -> None:
        self.digests = digests
        self.column = column

    def __call__(self, batch: dict[str, list]) -> list[bool]:
        return [text_digest(text) not in self.digests for text in batch[self.column]]


class BlockBuilder:
    """Batched map: encode texts, concatenate, cut into ``cls + (max_length - 2) codes + sep`` blocks.

    The tail shorter than a block is dropped per batch of texts, except when a batch gives no
    full block, where it becomes one shorter block (small corpora still train).
    """

    def __init__(self, encoder: TextEncoder, max_length: int, column: str) -> None:
        self.encoder = encoder
        self.body = max_length - 2
        self.column = column

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        texts = [t if isinstance(t, str) else "" for t in batch[self.column]]
        encoded = [codes for codes in self.encoder.encode(texts) if len(codes)]
        if not encoded:
            return {"codes": []}
        stream = np.concatenate(encoded)
        cls, sep = self.encoder.special_code("cls"), self.encoder.special_code("sep")
        count = max(1, len(stream) // self.body)
        blocks = [
            np.concatenate([cls[None], stream[i * self.body : (i + 1) * self.body], sep[None]]) for i in range(count)
        ]
        return {"codes": blocks}
