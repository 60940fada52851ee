"""The training data's token counts, for strategies that rank tokens by frequency (``frequencies: data``: mixed
dimension's blocks).

lit-embed counts them itself, before the model is built (the blocks' widths follow the counts): a bincount of the
tokenised training texts (:meth:`~lit_embed.data.base.TextDataModule.fit_texts`), written atomically as a count file
(one count per line, line i for id i, the format a user's own count file has) in the given folder, beside the run.
The file's name holds a key of everything the counts depend on: the tokenizer's vocabulary, the data config, and the
size and modification time of every local file or folder the config names. A resumed run (or another run of the same
experiment) reuses it; another corpus or tokenizer has another key, so its counts are never taken for these.
The counts are deterministic from the data, so every DDP rank arrives at the same file.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lit_embed.data.sources import SAMPLES
from lit_embed.embeddings.mixed_dimension import read_counts
from lit_embed.embeddings.text import VocabTextEncoder
from lit_embed.errors import ConfigError
from lit_embed.files import write_atomic
from lit_embed.progress import Progress

log = logging.getLogger(__name__)

#: The count files' names: ``token_counts-KEY.txt``.
PREFIX = "token_counts-"


def counted_frequencies(data, data_config: dict, tokenizer: str, vocab_size: int, folder: Path) -> Path:
    """The count file of ``data``'s training texts tokenised by ``tokenizer``, in ``folder``: the one cached there
    under the same key, or counted now and written."""
    encoder = VocabTextEncoder(tokenizer, max_vocab_size=vocab_size)
    path = folder / f"{PREFIX}{corpus_key(encoder, data_config, vocab_size)}.txt"
    if path.is_file():
        try:
            read_counts(str(path), vocab_size)
            log.info("token frequencies: %s (cached for this data and tokenizer)", path)
            return path
        except ConfigError as error:  # damaged or edited: counted again
            log.warning("token frequencies: %s; counting them again", error)
    counts = count_tokens(data.fit_texts(), encoder, vocab_size)
    if not counts.any():
        raise ConfigError(f"the training data holds no token of tokenizer {tokenizer!r}, so there are no frequencies to "
                          f"rank by: give training texts, a count file, or frequencies: id_order")
    write_atomic(path, "".join(f"{count}\n" for count in counts.tolist()))
    log.info("token frequencies: counted %d tokens of the training data into %s", int(counts.sum()), path)
    return path


def count_tokens(texts: Iterable[str], encoder: VocabTextEncoder, vocab_size: int, batch_size: int = 1000) -> np.ndarray:
    """How often each id occurs in ``texts`` tokenized by ``encoder`` (no special tokens added): a bincount a batch."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    progress, done, texts = Progress("counting tokens,", "text"), 0, iter(texts)  # a stream: how many is not known ahead
    while batch := list(itertools.islice(texts, batch_size)):
        ids = [row for row in encoder.encode(batch) if len(row)]
        if ids:
            counts += np.bincount(np.concatenate(ids), minlength=vocab_size)[:vocab_size]
        done += len(batch)
        progress.update(done)
    progress.update(done, final=True)
    return counts


def corpus_key(encoder: VocabTextEncoder, data_config: dict, vocab_size: int) -> str:
    """16 hex digits of what the counts depend on: the vocabulary, the data config and its files as they are now."""
    described = {"vocabulary": encoder.fingerprint(), "vocab_size": vocab_size, "data": data_config,
                 "files": {str(path): _stamp(path) for path in _local_files(data_config)}}
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _local_files(value: Any) -> Iterator[Path]:
    """Every local file or folder a config names (a packaged sample by its name, ``sample-corpus``)."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _local_files(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _local_files(item)
    elif isinstance(value, str) and value in SAMPLES:
        yield Path(SAMPLES[value])
    elif isinstance(value, str) and value and len(value) < 4096 and Path(value).expanduser().exists():
        yield Path(value).expanduser().resolve()


def _stamp(path: Path) -> list[int]:
    """Size and modification time of a file, or of every file under a folder."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    stats = [p.stat() for p in files]
    return [len(stats), sum(s.st_size for s in stats), max((s.st_mtime_ns for s in stats), default=0)]


__all__ = ["PREFIX", "corpus_key", "count_tokens", "counted_frequencies"]
