"""CANINE's character embedding (Clark et al., 2022), the HashFormers paper's CANINE-C baseline.

A character's code is its Unicode codepoint; its vector is the concatenation of ``num_hashes`` slices,
slice ``k`` looked up in a table of ``num_buckets`` rows at ``((codepoint + 1) * prime_k) % num_buckets``:
transformers' ``CanineEmbeddings`` exactly, moved out of the backbone so that CANINE runs through the same
strategy seam, fine-tuning module and data pipeline as every other model. Special tokens are CANINE's
private-use codepoints (``[CLS]`` U+E000, ``[SEP]`` U+E001, ``[MASK]`` U+E003, padding 0).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.errors import ConfigError

#: transformers' ``modeling_canine._PRIMES``: hash function ``k`` multiplies by ``PRIMES[k]``.
PRIMES = (31, 43, 59, 61, 73, 97, 103, 113, 137, 149, 157, 173, 181, 193, 211, 223)
#: CANINE's special codepoints (its tokenizer's).
CANINE_SPECIALS = {"pad": 0, "cls": 0xE000, "sep": 0xE001, "mask": 0xE003, "unk": 0xFFFD}


class CharacterTextEncoder:
    """Text as Unicode codepoints, one per character (CANINE reads characters, no tokenizer)."""

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64) for text in texts]

    def special_code(self, name: str) -> np.ndarray:
        return np.asarray(CANINE_SPECIALS[name], dtype=np.int64)

    def fingerprint(self) -> str:
        return "canine-codepoints-" + hashlib.sha256(repr(sorted(CANINE_SPECIALS.items())).encode()).hexdigest()[:12]


class CanineHashEmbedding(EmbeddingStrategy):
    """CANINE's multi-hash codepoint embedding: ``num_hashes`` tables of ``num_buckets`` rows, each
    ``hidden_size / num_hashes`` wide (CANINE-C: 8 x 16,384 x 96, 12.6M parameters).

    Started from a pretrained CANINE (``google/canine-c``), the backbone hands its tables over (see
    :class:`lit_embed.models.Encoder`). Any codepoint is accepted, so ``vocab_size`` stays unset.

    Args:
        num_hashes: hash functions, one table each (at most 16).
        num_buckets: rows of each table.
        counted_buckets: count the embedding as ``counted_buckets x hidden_size`` parameters, as the HashFormers
            paper's eq. 10 counts CANINE-C's (16,000 buckets, the figure CANINE's paper gives), instead of the
            tables' ``num_hashes x num_buckets x hidden_size / num_hashes``; at most ``num_buckets``.
        budget: size ``num_buckets`` to this many bytes at inference (a number: the vocabulary is unlimited).
    """

    unlimited_vocabulary = True
    size_parameter = "num_buckets"

    def __init__(self, vocab_size: int | None, hidden_size: int, num_hashes: int = 8, num_buckets: int = 16384,
                 counted_buckets: int | None = None, budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size)
        if not 1 <= num_hashes <= len(PRIMES):
            raise ConfigError(f"num_hashes={num_hashes} must be between 1 and {len(PRIMES)} (CANINE's primes)")
        if hidden_size % num_hashes:
            raise ConfigError(f"hidden_size={hidden_size} is not divisible by num_hashes={num_hashes}: pick a divisor")
        if num_buckets < 2:
            raise ConfigError(f"num_buckets={num_buckets} must be at least 2")
        if counted_buckets is not None and not 1 <= counted_buckets <= num_buckets:
            raise ConfigError(f"counted_buckets={counted_buckets} must lie in [1, num_buckets={num_buckets}]: it "
                              f"counts buckets the tables hold")
        self.num_hashes = num_hashes
        self.num_buckets = num_buckets
        self.counted_buckets = counted_buckets
        self.tables = nn.ModuleList(nn.Embedding(num_buckets, hidden_size // num_hashes) for _ in range(num_hashes))
        for table in self.tables:
            nn.init.normal_(table.weight, std=0.02)  # CANINE's initializer_range

    def num_embedding_parameters(self) -> int:
        if self.counted_buckets is None:
            return super().num_embedding_parameters()
        return self.counted_buckets * self.hidden_size

    @classmethod
    def count_parameters(cls, vocab_size: None, hidden_size: int, num_hashes: int = 8, num_buckets: int = 16384,
                         counted_buckets: int | None = None, **_) -> int:
        if counted_buckets is not None:
            return counted_buckets * hidden_size
        return num_hashes * num_buckets * (hidden_size // num_hashes)

    @classmethod
    def size_range(cls, vocab_size: None, hidden_size: int, counted_buckets: int | None = None, **_) -> tuple[int, int]:
        return max(2, counted_buckets or 2), 2**31 - 1

    def counting_rule(self) -> str | None:
        if self.counted_buckets is None:
            return None
        return (f"HashFormers eq. 10: {self.counted_buckets:,} hash buckets x {self.hidden_size} (the tables hold "
                f"{self.num_hashes} x {self.num_buckets:,} x {self.hidden_size // self.num_hashes})")

    def text_encoder(self, tokenizer: str | None) -> CharacterTextEncoder:
        """Codepoints (the data's ``tokenizer`` is not used)."""
        return CharacterTextEncoder()

    def forward(self, codes: Tensor) -> Tensor:
        return torch.cat([table(((codes + 1) * prime) % self.num_buckets) for table, prime in zip(self.tables, PRIMES)], -1)

    def load_pretrained(self, weight: Tensor) -> bool:
        """CANINE's tables side by side (``num_buckets x hidden_size``), as the backbone hands them over."""
        if tuple(weight.shape) != (self.num_buckets, self.hidden_size):
            raise ConfigError(
                f"the pretrained CANINE tables are {tuple(weight.shape)}, not num_buckets x hidden_size = "
                f"{(self.num_buckets, self.hidden_size)}: set num_buckets to the model's num_hash_buckets"
            )
        with torch.no_grad():
            for table, part in zip(self.tables, weight.split(self.hidden_size // self.num_hashes, dim=1)):
                table.weight.copy_(part)
        return True

    def code_sampler(self) -> Callable[[tuple[int, ...]], Tensor]:
        """Random codepoints of the Basic Multilingual Plane's letters and symbols (U+0020 to U+D7FF)."""
        return functools.partial(torch.randint, 0x20, 0xD800)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, hashes={self.num_hashes}, buckets={self.num_buckets}"
