"""Text to hash codes: word-level tokens with an unlimited vocabulary, hashed once per unique word.

Tokens are the lowercased text split by ``\\w+|[^\\w\\s]+`` (runs of word characters; runs of
punctuation, symbols, emoji and control characters), or, as an option, the pieces of a HuggingFace
tokenizer (the HashFormers paper's Appendix C). The special tokens keep RoBERTa's ids:
``<s>``=0, ``<pad>``=1, ``</s>``=2, ``<unk>``=3, ``<mask>``=4; hashed tokens come after them.

Two code layouts carry both the special id and the hash:

* :class:`BucketCodes` (HashFormer-Emb): one integer, the special's id or ``5 + bucket``;
* :class:`BitCodes` (Pool, Add, Proj, ProFormer): ``[row, w_0, w_1, ...]``, ``row`` the special's id or
  5 for a hashed token, then the T bits packed into int64 words, most significant bit first
  (all zero for specials). 128 bits take 2 words: a 512-token block is 12 KB, not 66 KB of bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain, repeat

import numpy as np
import torch
from torch import Tensor

from lit_embed.embeddings.hashers import Hasher, WordHash
from lit_embed.embeddings.text import VocabTextEncoder
from lit_embed.errors import ConfigError

WORD_PATTERN = re.compile(r"\w+|[^\w\s]+")
SPECIAL_IDS = {"cls": 0, "pad": 1, "sep": 2, "unk": 3, "mask": 4}
NUM_SPECIAL = 5
#: ``row`` of a hashed token in :class:`BitCodes` (and the shared row of the special-token table).
WORD_ROW = NUM_SPECIAL


def split_words(text: str) -> list[str]:
    """The HashFormers' word tokens: lowercase, then ``\\w+|[^\\w\\s]+``."""
    return WORD_PATTERN.findall(text.lower())


# -- code layouts -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BucketCodes:
    """One integer per token: the special ids 0-4, then ``5 + bucket`` for N - 5 word buckets."""

    num_buckets: int

    @property
    def code_shape(self) -> tuple[int, ...]:
        return ()

    def of_words(self, function: WordHash, words: list[str]) -> np.ndarray:
        return function.buckets(words) + NUM_SPECIAL

    def special(self, special_id: int) -> np.ndarray:
        return np.asarray(special_id, dtype=np.int64)

    def random(self, shape: tuple[int, ...]) -> Tensor:
        """Uniform word buckets (Shuffle+Random's random tokens); a picklable bound method."""
        return torch.randint(NUM_SPECIAL, self.num_buckets, tuple(shape))


@dataclass(frozen=True)
class BitCodes:
    """``[row, packed T bits]`` per token: row 0-4 a special (bits zero), 5 a hashed token."""

    num_bits: int

    @property
    def num_words(self) -> int:
        return -(-self.num_bits // 64)

    @property
    def code_shape(self) -> tuple[int, ...]:
        return (1 + self.num_words,)

    def of_words(self, function: WordHash, words: list[str]) -> np.ndarray:
        return self._with_row(WORD_ROW, pack_bits(function.bits(words)))

    def special(self, special_id: int) -> np.ndarray:
        return self._with_row(special_id, np.zeros((self.num_words,), dtype=np.int64))

    def random(self, shape: tuple[int, ...]) -> Tensor:
        """Uniformly random bits of a hashed token (Shuffle+Random's random tokens in code space)."""
        bits = torch.randint(0, 2, (*shape, self.num_bits), dtype=torch.uint8)
        return torch.from_numpy(self._with_row(WORD_ROW, pack_bits(bits.numpy())))

    @staticmethod
    def _with_row(row: int, words: np.ndarray) -> np.ndarray:
        return np.concatenate([np.full((*words.shape[:-1], 1), row, dtype=np.int64), words], axis=-1)


def pack_bits(bits: np.ndarray) -> np.ndarray:
    """``(..., T)`` zeros and ones to ``(..., ceil(T/64))`` int64 words; bit 0 is the top bit of word 0."""
    num_bits = bits.shape[-1]
    padded = np.zeros((*bits.shape[:-1], -(-num_bits // 64) * 64), dtype=np.uint8)
    padded[..., :num_bits] = bits
    return np.ascontiguousarray(np.packbits(padded, axis=-1)).view(">i8").astype(np.int64)


def unpack_bits(words: Tensor, num_bits: int) -> Tensor:
    """Inverse of :func:`pack_bits` on any device: ``(..., ceil(T/64))`` int64 to ``(..., T)`` 0/1 int64."""
    shifts = torch.arange(63, -1, -1, device=words.device)
    return ((words.unsqueeze(-1) >> shifts) & 1).flatten(-2)[..., :num_bits]


# -- the text encoder ---------------------------------------------------------------------------------


class HashTextEncoder:
    """Text to hash codes with a cache of every unique token's code (no hashing twice).

    Encoding a batch tokenises every text, looks all tokens up in the cache at once, hashes only the
    new ones (in one vectorised call) and gathers the codes with one NumPy index. The cache is
    emptied when it would exceed ``cache_size`` tokens. Pickled (for DataLoader workers) it keeps the
    NumPy snapshot of the hasher and drops the module and the cache.

    Args:
        hasher: the strategy's hasher (its state is fitted through :meth:`fit` where it needs that).
        codes: the code layout.
        pieces: hash the pieces of this tokenizer instead of words (the paper's Appendix C).
        cache_size: most unique tokens kept.
    """

    def __init__(
        self,
        hasher: Hasher,
        codes: BucketCodes | BitCodes,
        pieces: VocabTextEncoder | None = None,
        cache_size: int = 1 << 22,
    ) -> None:
        if cache_size < 1:
            raise ConfigError(f"cache_size={cache_size} must be at least 1")
        self._hasher: Hasher | None = hasher
        self.codes = codes
        self.cache_size = cache_size
        self.pieces = pieces
        self._function = hasher.function() if hasher.fitted else None
        self._clear()

    def __getstate__(self) -> dict:
        cache = ("_index", "_table", "_piece_codes")
        return {key: value for key, value in self.__dict__.items() if key not in cache} | {"_hasher": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._clear()

    # -- fitting (LSH's n-gram vocabulary) ------------------------------------------------------------
    @property
    def fitted(self) -> bool:
        return self._function is not None

    def fit(self, texts: Iterable[str]) -> None:
        """Fit the hasher on the token frequencies of ``texts``; the codes change, so does the fingerprint."""
        if self._hasher is None:
            raise RuntimeError("this text encoder was copied to another process without its hasher: fit the original")
        self._hasher.fit(self.tokens(text if isinstance(text, str) else "") for text in texts)
        self._function = self._hasher.function()
        self._clear()

    def artefact(self) -> tuple[str, str] | None:
        """The fitted state as a file to keep beside the run (``lsh_ngrams.json``): its name and text."""
        return self._hasher.artefact() if self._hasher is not None else None

    # -- the TextEncoder protocol ---------------------------------------------------------------------
    def tokens(self, text: str) -> list[str]:
        """The tokens that get hashed: words, or the tokenizer's pieces."""
        if self.pieces is None:
            return split_words(text)
        return self.pieces.tokenizer.convert_ids_to_tokens(self.pieces.encode([text])[0].tolist())

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        function = self._ready()
        if self.pieces is not None:
            table = self._piece_table(function)
            return [table[ids] for ids in self.pieces.encode(texts)]
        per_text = [split_words(text) for text in texts]
        tokens = list(chain.from_iterable(per_text))
        rows = self._rows(tokens, function)  # may grow the table: index it after
        codes = self._table[rows]
        return np.split(codes, np.cumsum([len(words) for words in per_text])[:-1])

    def special_code(self, name: str) -> np.ndarray:
        return self.codes.special(SPECIAL_IDS[name])

    def fingerprint(self) -> str:
        source = "words" if self.pieces is None else self.pieces.fingerprint()
        return f"hash-{self.codes}-{self._ready().fingerprint()}-{source}"

    # -- the cache ------------------------------------------------------------------------------------
    def _ready(self) -> WordHash:
        if self._function is None:
            raise RuntimeError(
                "the hasher is not fitted: fit(texts) on the corpus first (CorpusDataModule does), or load a checkpoint"
            )
        return self._function

    def _clear(self) -> None:
        self._index: dict[str, int] = {}
        self._table = np.zeros((1024, *self.codes.code_shape), dtype=np.int64)
        self._piece_codes: np.ndarray | None = None

    def _rows(self, tokens: list[str], function: WordHash) -> np.ndarray:
        index = self._index
        rows = np.fromiter(map(index.get, tokens, repeat(-1)), dtype=np.int64, count=len(tokens))
        missing = np.flatnonzero(rows < 0)
        if not len(missing):
            return rows
        new = list(dict.fromkeys(tokens[i] for i in missing))
        if index and len(index) + len(new) > self.cache_size:
            self._clear()
            return self._rows(tokens, function)
        start = len(index)
        if start + len(new) > len(self._table):
            grown = np.zeros((max(2 * len(self._table), start + len(new)), *self._table.shape[1:]), dtype=np.int64)
            grown[:start] = self._table[:start]
            self._table = grown
        self._table[start : start + len(new)] = self.codes.of_words(function, new)
        index.update(zip(new, range(start, start + len(new))))
        rows[missing] = [index[tokens[i]] for i in missing]
        return rows

    def _piece_table(self, function: WordHash) -> np.ndarray:
        """Codes of every id of the tokenizer, hashed once; its unknown token is ``<unk>``."""
        if self._piece_codes is None:
            tokenizer = self.pieces.tokenizer
            pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
            table = self.codes.of_words(function, [p if isinstance(p, str) else "" for p in pieces])
            if tokenizer.unk_token_id is not None:
                table[tokenizer.unk_token_id] = self.special_code("unk")
            self._piece_codes = table
        return self._piece_codes


__all__ = [
    "NUM_SPECIAL", "SPECIAL_IDS", "WORD_PATTERN", "WORD_ROW", "BitCodes", "BucketCodes", "HashTextEncoder",
    "pack_bits", "split_words", "unpack_bits",
]
