"""Step 1 of the paper: split the vocabulary by token frequency in the fine-tuning data."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from lit_embed.embeddings.text import VocabTextEncoder
from lit_embed.errors import ConfigError


@dataclass(frozen=True)
class VocabularySplit:
    """Which ids stay common (V_C) and how they were chosen.

    Attributes:
        common_ids: V_C in increasing id order: the ``kept`` most frequent tokens of the data plus
            every special token (special tokens always stay common).
        seen: tokens of the vocabulary that occur in the data at least once.
        kept: how many of them ``retention`` kept.
        special_ids: the tokenizer's special tokens.
    """

    common_ids: torch.Tensor
    seen: int
    kept: int
    special_ids: tuple[int, ...]


def split_vocabulary(counts: np.ndarray, retention: float, special_ids: Iterable[int]) -> VocabularySplit:
    """Keep the ``round(retention * seen)`` most frequent tokens (ties: the smaller id) and the specials.

    ``retention`` is the paper's r(V_C): 1.0 keeps every token seen in the fine-tuning data, 0.5 half.
    """
    check_retention(retention)
    seen = int((counts > 0).sum())
    if seen == 0:
        raise ConfigError(
            "no token of the vocabulary occurs in the data (it is empty or has no text): give the training "
            "texts the model was fine-tuned on (--data: a task data config or text files)"
        )
    kept = max(1, math.floor(retention * seen + 0.5))
    by_frequency = np.argsort(-counts, kind="stable")[:kept]
    specials = tuple(sorted({int(i) for i in special_ids if 0 <= int(i) < len(counts)}))
    common = np.union1d(by_frequency, np.asarray(specials, dtype=np.int64))
    return VocabularySplit(torch.as_tensor(common, dtype=torch.long), seen, kept, specials)


def coverage(examples: Iterable[list[str]], encoder: VocabTextEncoder, common_ids: torch.Tensor) -> dict:
    """The sparse-coding paper's coverage of test data by V_C: the share of its tokens that are common (Table 5)
    and of its examples whose every token is (Table 6: there the compressed model computes exactly as the original).

    An example is what the model reads (both sides of a pair); no special tokens are counted.
    """
    common = np.zeros(int(common_ids.max()) + 1 if len(common_ids) else 0, dtype=bool)
    common[common_ids.numpy()] = True
    tokens = covered_tokens = examples_seen = covered_examples = 0
    for batch in _batches(examples, 1000):
        flat = encoder.encode([text for example in batch for text in example])
        start = 0
        for example in batch:
            ids = np.concatenate([np.asarray(a, dtype=np.int64) for a in flat[start:start + len(example)]] or [np.zeros(0, np.int64)])
            start += len(example)
            hits = int(common[ids[ids < len(common)]].sum())
            tokens, covered_tokens = tokens + len(ids), covered_tokens + hits
            examples_seen, covered_examples = examples_seen + 1, covered_examples + (hits == len(ids))
    if examples_seen == 0:
        raise ConfigError("the task's test sets hold no example: coverage needs the test data")
    return {"tokens": covered_tokens / tokens if tokens else 1.0, "sentences": covered_examples / examples_seen,
            "examples": examples_seen}


def check_retention(retention: float) -> None:
    if not 0.0 < retention <= 1.0:
        raise ConfigError(
            f"retention={retention} is outside (0, 1]: it is the share of the tokens seen in the training data "
            f"that stay common (the paper uses 0.5 to 1.0)"
        )


def _batches(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


__all__ = ["VocabularySplit", "check_retention", "coverage", "split_vocabulary"]
