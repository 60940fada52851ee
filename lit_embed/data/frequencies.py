"""The training data's token counts, for strategies that rank tokens by frequency (``frequencies: data``: mixed
dimension's blocks).

lit-embed counts them itself, before the model is built (the blocks' widths follow the counts): a bincount of the
tokenised training texts (:meth:`~lit_embed.data.base.TextDataModule.fit_texts`), written atomically as a count file
(one count per line, line i for id i, the format a user's own count file has) in the given folder, beside the run.
The file's name holds a key of everything the counts depend on: the tokenizer's vocabulary, the data config, and the
size and modification time of every local file or folder the config names. A resumed run (or another run of the same
experiment) reuses it; another corpus or tokenizer has another key, so its counts are never taken for these.
The counts are deterministic from the data, so every DDP rank arrives at the same file.

Only the training data's first ``counted_tokens`` tokens are counted (5 M by default; the texts in order, the last one
cut where the sample ends; ``None``: all of them): tokenising runs at 0.2-0.5 M tokens/s on one core, so a
Wikipedia-scale corpus would take hours and a stream might never end. The cap is part of the key, and a sidecar
``token_counts-KEY.json`` records what was counted (tokens, texts, whether that was all of it).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from lit_embed.data.sources import SAMPLES
from lit_embed.embeddings.mixed_dimension import SAMPLE_TOKENS, read_counts
from lit_embed.embeddings.text import VocabTextEncoder
from lit_embed.errors import ConfigError
from lit_embed.progress import Progress
from lit_embed.storage.files import write_atomic

log = logging.getLogger(__name__)

#: The count files' names: ``token_counts-KEY.txt`` (and the sidecar ``token_counts-KEY.json``).
PREFIX = "token_counts-"


class Counted(NamedTuple):
    """What :func:`count_tokens` counted: the counts, how many texts they come from, whether that was all of them."""

    counts: np.ndarray
    texts: int
    whole: bool

    def described(self, size: int | None = None) -> str:
        """``the first 5,000,000 tokens of the training data (1,234 of 56,789 texts: 2.2%)``, or ``all ...``; ``size``,
        the data's texts where known."""
        tokens, texts = int(self.counts.sum()), f"{self.texts:,} text{'s' * (self.texts != 1)}"
        if self.whole:
            return f"all {tokens:,} tokens of the training data ({texts})"
        share = f"{self.texts:,} of {size:,} texts: {self.texts / size:.1%}" if size else f"{texts}; it holds more"
        return f"the first {tokens:,} tokens of the training data ({share})"


def counted_frequencies(data, data_config: dict, tokenizer: str, vocab_size: int, folder: Path,
                        most: int | None = SAMPLE_TOKENS) -> Path:
    """The count file of ``data``'s first ``most`` training tokens (``None``: all) tokenised by ``tokenizer``, in
    ``folder``: the one cached there under the same key, or counted now and written."""
    if most is not None and (isinstance(most, bool) or not isinstance(most, int) or most < 1):
        raise ConfigError(f"counted_tokens={most!r} must be a number of tokens of at least 1, or null to count all the "
                          f"training data")
    encoder = VocabTextEncoder(tokenizer, max_vocab_size=vocab_size)
    path = folder / f"{PREFIX}{corpus_key(encoder, data_config, vocab_size, most)}.txt"
    sidecar = path.with_suffix(".json")
    if path.is_file():
        try:
            read_counts(str(path), vocab_size)
            what = json.loads(sidecar.read_text())["counted"] if sidecar.is_file() else "no record of what"
            log.info("token frequencies: %s (cached for this data, tokenizer and cap: %s)", path, what)
            return path
        except (ConfigError, ValueError, KeyError) as error:  # damaged or edited: counted again
            log.warning("token frequencies: %s; counting them again", error)
    counted = count_tokens(data.fit_texts(), encoder, vocab_size, most=most)
    described = counted.described(None if counted.whole else data.fit_size())
    if not counted.counts.any():
        raise ConfigError(f"the training data holds no token of tokenizer {tokenizer!r}, so there are no frequencies to "
                          f"rank by: give training texts, a count file, or frequencies: id_order")
    record = {"counted": described, "tokens": int(counted.counts.sum()), "texts": counted.texts,
              "whole_split": counted.whole, "counted_tokens": most, "tokenizer": tokenizer}
    write_atomic(sidecar, json.dumps(record, indent=2) + "\n")  # first: the count file's presence is the cache
    write_atomic(path, "".join(f"{count}\n" for count in counted.counts.tolist()))
    log.info("token frequencies: counted %s into %s%s", described, path,
             "" if counted.whole or most is None else "; counted_tokens: null counts them all")
    return path


def count_tokens(texts: Iterable[str], encoder: VocabTextEncoder, vocab_size: int, batch_size: int = 1000,
                 most: int | None = None) -> Counted:
    """How often each id occurs in the first ``most`` tokens (``None``: all) of ``texts`` tokenized by ``encoder`` (no
    special tokens added): a bincount a batch. A stream is read a batch at a time and no further than the batch that
    reaches ``most``."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    progress, done, total, texts = Progress("counting tokens,", "text"), 0, 0, iter(texts)  # a stream: length unknown
    left = False  # texts (or a text's end) drawn and not counted
    while (most is None or total < most) and (batch := list(itertools.islice(texts, batch_size))):
        rows = encoder.encode(batch)
        if most is not None:
            ends = np.cumsum([len(row) for row in rows])
            last = int(np.searchsorted(ends, most - total))  # the text that reaches the cap, cut where it does
            if last < len(rows):
                before = int(ends[last - 1]) if last else 0
                keep = most - total - before
                left = last + 1 < len(batch) or keep < int(ends[last]) - before
                rows, batch = [*rows[:last], rows[last][:keep]], batch[:last + 1]
        ids = [row for row in rows if len(row)]
        if ids:
            flat = np.concatenate(ids)
            counts += np.bincount(flat, minlength=vocab_size)[:vocab_size]
            total += len(flat)
        done += len(batch)
        progress.update(done)
    progress.update(done, final=True)
    whole = most is None or total < most or not left and next(texts, None) is None
    return Counted(counts, done, whole)


def corpus_key(encoder: VocabTextEncoder, data_config: dict, vocab_size: int, most: int | None = SAMPLE_TOKENS) -> str:
    """16 hex digits of what the counts depend on: the vocabulary, the data config and its files as they are now, the
    cap."""
    described = {"vocabulary": encoder.fingerprint(), "vocab_size": vocab_size, "data": data_config, "most": most,
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


__all__ = ["PREFIX", "Counted", "corpus_key", "count_tokens", "counted_frequencies"]
