"""How text becomes codes: the text half of the strategy seam.

A :class:`TextEncoder` turns strings into one code array per text and names the codes of the
special tokens the data pipeline adds (``cls``, ``sep``, ``pad``, ``mask``). Vocabulary strategies use a
HuggingFace tokenizer's ids; hash strategies supply their own encoder.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import numpy as np

from lit_embed.errors import ConfigError
from lit_embed.hub import load_tokenizer

SPECIAL_NAMES = ("cls", "sep", "pad", "mask", "unk")


@runtime_checkable
class TextEncoder(Protocol):
    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """One array of codes per text, shaped ``(tokens, *code_shape)``, without special tokens."""

    def special_code(self, name: str) -> np.ndarray:
        """The code of special token ``name`` (one of ``SPECIAL_NAMES``), shaped like one token's code."""

    def fingerprint(self) -> str:
        """A stable string that changes whenever the codes would change (keys the datasets cache)."""


@runtime_checkable
class FittableTextEncoder(TextEncoder, Protocol):
    """A text encoder whose codes depend on the corpus (LSH's n-gram vocabulary).

    The data module calls :meth:`fit` on the training texts before encoding them, unless
    ``fitted`` (the state came with the model, e.g. from a checkpoint), and writes the fitted state
    beside the run (:meth:`artefact`). The state lives in the strategy's persistent buffers, so the
    checkpoint keeps it; fitting is deterministic, so every process fits the same.
    """

    fitted: bool

    def fit(self, texts: Iterable[str]) -> None:
        """Fit on the corpus's texts; the codes (and the fingerprint) change."""

    def artefact(self) -> tuple[str, str] | None:
        """The fitted state as a file to keep beside the run: its name and text (``None``: nothing to keep)."""


class VocabTextEncoder:
    """A HuggingFace tokenizer's vocabulary ids as codes.

    Args:
        tokenizer: a hub name or a local folder; ``all-MiniLM-L6-v2`` resolves to the packaged copy.
        max_vocab_size: the embedding's vocabulary size; a tokenizer with more ids is refused.
    """

    def __init__(self, tokenizer: str | None, max_vocab_size: int | None = None) -> None:
        if tokenizer is None:
            raise ConfigError("this strategy encodes text with a tokenizer: set data.init_args.tokenizer (e.g. roberta-base)")

        self.name = tokenizer
        self.tokenizer = load_tokenizer(tokenizer)
        self._fingerprint: str | None = None
        size = len(self.tokenizer)
        if max_vocab_size is not None and size > max_vocab_size:
            raise ConfigError(
                f"tokenizer {tokenizer!r} has {size} ids but the embedding's vocab_size is {max_vocab_size}: "
                f"set vocab_size to at least {size}"
            )
        t = self.tokenizer
        self.special = {
            "cls": t.cls_token_id if t.cls_token_id is not None else t.bos_token_id,
            "sep": t.sep_token_id if t.sep_token_id is not None else t.eos_token_id,
            "pad": t.pad_token_id if t.pad_token_id is not None else t.eos_token_id,
            "mask": t.mask_token_id,
            "unk": t.unk_token_id,
        }

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        # split_special_tokens: a literal "<mask>" in the corpus is text, not a special token.
        out = self.tokenizer(
            texts, add_special_tokens=False, return_attention_mask=False, split_special_tokens=True, verbose=False
        )["input_ids"]
        return [np.asarray(ids, dtype=np.int64) for ids in out]

    def special_code(self, name: str) -> np.ndarray:
        code = self.special[name]
        if code is None:
            raise ConfigError(f"tokenizer {self.name!r} has no {name} token, which this objective needs")
        return np.asarray(code, dtype=np.int64)

    def fingerprint(self) -> str:
        # Once per encoder (the tokenizer is never changed after loading): a data module asks for it per split and
        # per pass, and hashing a 30k-250k vocabulary takes 60 ms or more each time.
        if self._fingerprint is None:
            digest = hashlib.sha1(type(self.tokenizer).__name__.encode())
            for token, idx in sorted(self.tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
                digest.update(f"{idx}\t{token}\n".encode("utf-8", "surrogatepass"))
            self._fingerprint = f"vocab-{digest.hexdigest()[:16]}"
        return self._fingerprint

    def __len__(self) -> int:
        return len(self.tokenizer)
