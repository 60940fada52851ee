"""Pre-training corpora: text -> the strategy's codes -> fixed-length blocks -> batches."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytorch_lightning as pl
from torch.utils.data import DataLoader

from lit_embed.data.collate import PadCollator
from lit_embed.data.sources import load_files, load_hub
from lit_embed.embeddings.text import FittableTextEncoder, TextEncoder, VocabTextEncoder

PIPELINE_VERSION = 1


class CorpusDataModule(pl.LightningDataModule):
    """A pre-training corpus grouped into ``max_length`` blocks of the strategy's codes.

    Texts are concatenated and cut into blocks of ``max_length - 2`` codes, each wrapped in the
    ``cls``/``sep`` specials (RoBERTa's FULL-SENTENCES). The block-building map runs once, in
    ``prepare_data`` (one process per node), and every rank reuses its ``datasets`` cache in ``setup``.
    A text encoder whose codes depend on the corpus (LSH hashing) is first fitted on its texts, and
    the fitted state is written beside the run (``lsh_ngrams.json``).

    Args:
        tokenizer: HF tokenizer name or folder (``all-MiniLM-L6-v2`` works offline); the model's
            strategy decides how it is used (vocabulary ids, or hashed pieces). Word-level hash
            strategies need none.
        datasets: hub datasets, ``name`` or ``name:config``, e.g. ``wikimedia/wikipedia:20231101.en``.
        files: local files (txt: one text per line; jsonl/csv/parquet: ``text_column``), or ``sample-corpus``.
        text_column: column holding the text.
        max_length: tokens per block, specials included.
        batch_size: blocks per batch on each device.
        val_size: validation blocks, a fraction below 1 or a count (a count when streaming).
        streaming: stream the corpora (larger than the disk); shards by rank and worker.
        max_texts: read at most this many texts per source (quick runs).
        num_workers: DataLoader worker processes.
        seed: seeds the train/validation split and the streaming shuffle.
    """

    def __init__(
        self,
        tokenizer: str | None = None,
        datasets: list[str] | None = None,
        files: list[str] | None = None,
        text_column: str = "text",
        max_length: int = 512,
        batch_size: int = 32,
        val_size: float = 0.02,
        streaming: bool = False,
        max_texts: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if not datasets and not files:
            raise ValueError("the corpus is empty: give hub `datasets` or local `files` (e.g. files: [sample-corpus])")
        if max_length < 3:
            raise ValueError(f"max_length={max_length} leaves no room for text between cls and sep: use at least 3")
        if streaming and not (val_size >= 1 and float(val_size).is_integer()):
            raise ValueError(f"streaming needs val_size as a number of blocks, got {val_size}")
        self.save_hyperparameters()
        self.tokenizer = tokenizer
        self.sources = list(datasets or [])
        self.files = list(files or [])
        self.text_column = text_column
        self.max_length = max_length
        self.batch_size = batch_size
        self.val_size = val_size
        self.streaming = streaming
        self.max_texts = max_texts
        self.num_workers = num_workers
        self.seed = seed
        self.text_encoder: TextEncoder | None = None
        self._unsaved = False
        self.collate = None
        self.train_set = self.val_set = None

    # -- Lightning hooks -------------------------------------------------------------------------
    def prepare_data(self) -> None:
        self._blocks(self._text_encoder())  # downloads and builds the cache once per node

    def setup(self, stage: str | None = None) -> None:
        module = self.trainer.lightning_module if self.trainer is not None else None
        encoder = self._text_encoder()
        if module is not None:
            limit = module.encoder.max_length
            if self.max_length > limit:
                raise ValueError(
                    f"max_length={self.max_length} exceeds the backbone's {limit} positions: lower "
                    f"data.max_length or raise encoder.max_position_embeddings"
                )
        if self._unsaved and self.trainer is not None:
            folder = self.trainer.log_dir or self.trainer.default_root_dir  # on every rank: log_dir broadcasts
            if self.trainer.is_global_zero:
                encoder.save(Path(folder))  # the fitted state (LSH n-grams) beside the run
            self._unsaved = False
        self.collate = module.collator(encoder) if module is not None else PadCollator(encoder)
        blocks = self._blocks(encoder)
        if self.streaming:
            blocks = self._shard(blocks)
            count = int(self.val_size)
            self.val_set, self.train_set = blocks.take(count), blocks.skip(count).shuffle(self.seed, buffer_size=10_000)
        else:
            split = blocks.train_test_split(test_size=self._val_count(len(blocks)), seed=self.seed, shuffle=True)
            self.train_set, self.val_set = split["train"], split["test"]

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=not self.streaming)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    # -- pipeline --------------------------------------------------------------------------------
    def _text_encoder(self) -> TextEncoder:
        if self.text_encoder is None:
            module = self.trainer.lightning_module if self.trainer is not None else None
            encoder = module.text_encoder(self.tokenizer) if module is not None else VocabTextEncoder(self.tokenizer)
            if isinstance(encoder, FittableTextEncoder) and not encoder.fitted:
                encoder.fit(self._text_stream())  # deterministic: every process fits the same
                self._unsaved = True
            self.text_encoder = encoder
        return self.text_encoder

    def _text_stream(self) -> Iterator[str]:
        """Every text of the corpus, in order (what a corpus-fitted text encoder learns from)."""
        for batch in self._texts().iter(batch_size=1000):
            yield from batch[self.text_column]

    def _texts(self):
        parts = [load_hub(name, streaming=self.streaming) for name in self.sources]
        if self.files:
            parts.append(load_files(self.files, streaming=self.streaming))
        columns = []
        for part, name in zip(parts, self.sources + ["files"] * bool(self.files)):
            names = part.column_names or [self.text_column]
            if self.text_column not in names:
                raise ValueError(f"{name}: no column {self.text_column!r} (columns: {names}); set data.text_column")
            part = part.select_columns([self.text_column])
            if self.max_texts is not None:
                part = part.take(self.max_texts)
            columns.append(part)
        return datasets.concatenate_datasets(columns) if len(columns) > 1 else columns[0]

    def _blocks(self, encoder: TextEncoder):
        texts = self._texts()
        builder = BlockBuilder(encoder, self.max_length, self.text_column)
        kwargs: dict[str, Any] = {"batched": True, "batch_size": 1000, "remove_columns": [self.text_column]}
        if self.streaming:
            return texts.map(builder, **kwargs)
        key = f"{texts._fingerprint}|{encoder.fingerprint()}|{self.max_length}|{PIPELINE_VERSION}"
        kwargs["new_fingerprint"] = hashlib.sha256(key.encode()).hexdigest()[:32]
        blocks = texts.map(builder, desc="Tokenising into blocks", **kwargs)
        if len(blocks) < 2:
            raise ValueError(
                f"the corpus {self.sources + self.files} gives {len(blocks)} block(s) of {self.max_length} tokens: "
                f"at least 2 are needed (one to train, one to validate); add text or lower max_length"
            )
        return blocks.with_format("numpy")

    def _val_count(self, total: int) -> int:
        count = int(round(self.val_size * total)) if self.val_size < 1 else int(self.val_size)
        if not 1 <= count < total:
            raise ValueError(f"val_size={self.val_size} gives {count} of {total} blocks: pick between 1 and {total - 1}")
        return count

    def _shard(self, blocks):
        from datasets.distributed import split_dataset_by_node

        trainer = self.trainer
        if trainer is not None and trainer.world_size > 1:
            return split_dataset_by_node(blocks, rank=trainer.global_rank, world_size=trainer.world_size)
        return blocks

    def _loader(self, dataset, shuffle: bool) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            collate_fn=self.collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )


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
