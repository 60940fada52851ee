"""The HashFormers' hash functions: a word to a bucket or to a T-bit vector, the same on every machine.

A hasher is a module whose defining state (the MD5 key; LSH's n-gram vocabulary and Gaussian
vector) lives in persistent buffers, so a checkpoint restores it exactly. The hashing itself is done
by a plain NumPy snapshot of that state (:meth:`Hasher.function`), which the data pipeline and its
worker processes use without touching the module or the device it sits on. Nothing here uses
Python's ``hash()``.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable
from itertools import chain, islice, repeat
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from lit_embed.embeddings.state import CheckpointSized, init_args_of
from lit_embed.errors import ConfigError


class WordHash(Protocol):
    """A hasher's state frozen into plain Python and NumPy: what the data pipeline calls."""

    def buckets(self, words: list[str]) -> np.ndarray:
        """``(W,)`` int64 buckets in ``[0, num_outputs)``."""

    def bits(self, words: list[str]) -> np.ndarray:
        """``(W, num_outputs)`` uint8 bits, the most significant first."""

    def fingerprint(self) -> str:
        """Changes whenever any word's bucket or bits would."""


class Hasher(CheckpointSized, ABC):
    """Maps words to ``num_outputs`` buckets (HashFormer-Emb) or to ``num_outputs`` bits (Pool, Add, Proj).

    Args:
        num_outputs: N buckets or T bits, chosen by the strategy that owns the hasher.
    """

    #: The most bits one word can get (``None``: any number).
    max_bits: int | None = None

    def __init__(self, num_outputs: int) -> None:
        super().__init__()
        if num_outputs < 1:
            raise ConfigError(f"a hasher needs at least one output bucket or bit, got num_outputs={num_outputs}")
        self.num_outputs = num_outputs

    @property
    def fitted(self) -> bool:
        """Whether the state that defines the codes is there (LSH needs its n-grams fitted on a corpus)."""
        return True

    def fit(self, texts: Iterable[list[str]]) -> None:
        """Fit corpus-dependent state on the tokens of each text (a no-op for hashers without any)."""

    def artefact(self) -> tuple[str, str] | None:
        """The fitted state as a file to keep beside a run (its name and text), or ``None`` when there is none:
        the data module writes it (no strategy module writes files; an export carries them)."""
        return None

    @abstractmethod
    def function(self) -> WordHash:
        """A snapshot of the current state that hashes words."""

    def init_args(self) -> dict[str, Any]:
        """The constructor arguments but ``num_outputs`` (the strategy gives it), as plain data."""
        return init_args_of(self, skip=("num_outputs",))


# -- MD5 ----------------------------------------------------------------------------------------------


class MD5Hasher(Hasher):
    """HMAC-MD5 with a secret key over the UTF-8 bytes of each (lowercased) token.

    The digest is read as a big-endian 128-bit integer v: bucket ``v % N``, bits the 128 bits of v,
    most significant first (the first T of them when T < 128).

    Args:
        num_outputs: N buckets or T <= 128 bits.
        key: the HMAC key (HashFormers: ``en``); kept in the checkpoint.
    """

    max_bits = 128
    sized_by_checkpoint = ("key",)  # as long as the key's bytes

    def __init__(self, num_outputs: int, key: str = "en") -> None:
        super().__init__(num_outputs)
        if num_outputs > 2**32:
            raise ConfigError(f"num_outputs={num_outputs} exceeds 2^32 buckets: use fewer")
        self.register_buffer("key", torch.tensor(list(key.encode("utf-8")), dtype=torch.uint8), persistent=True)

    def function(self) -> MD5Hash:
        return MD5Hash(bytes(self.key.cpu().tolist()), self.num_outputs)

    def init_args(self) -> dict[str, Any]:
        return {"key": bytes(self.key.cpu().tolist()).decode("utf-8")}

    def extra_repr(self) -> str:
        return f"num_outputs={self.num_outputs}"


class MD5Hash:
    """HMAC-MD5 (RFC 2104) with the key's inner and outer pads hashed once: twice as fast as ``hmac.digest``."""

    def __init__(self, key: bytes, num_outputs: int) -> None:
        self.key = key
        self.num_outputs = num_outputs
        block = (hashlib.md5(key).digest() if len(key) > 64 else key).ljust(64, b"\0")
        self._inner = hashlib.md5(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.md5(bytes(b ^ 0x5C for b in block))

    def __getstate__(self) -> dict:
        return {"key": self.key, "num_outputs": self.num_outputs}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["key"], state["num_outputs"])

    def _digest(self, word: str) -> bytes:
        inner = self._inner.copy()
        inner.update(word.encode("utf-8", "surrogatepass"))
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def digests(self, words: list[str]) -> np.ndarray:
        """``(W, 16)`` uint8 digests."""
        return np.frombuffer(b"".join(map(self._digest, words)), dtype=np.uint8).reshape(len(words), 16)

    def buckets(self, words: list[str]) -> np.ndarray:
        # v = hi * 2^64 + lo; v mod n = ((hi mod n) * (2^64 mod n) + lo mod n) mod n, exact in uint64 for n <= 2^32.
        halves = self.digests(words).view(">u8").astype(np.uint64)
        n = np.uint64(self.num_outputs)
        wrap = np.uint64((1 << 64) % self.num_outputs)
        return (((halves[:, 0] % n) * wrap + halves[:, 1] % n) % n).astype(np.int64)

    def bits(self, words: list[str]) -> np.ndarray:
        if self.num_outputs > 128:
            raise ConfigError(f"MD5 gives 128 bits, not {self.num_outputs}: use at most 128 bits or the LSH hasher")
        return np.unpackbits(self.digests(words), axis=1)[:, : self.num_outputs]

    def fingerprint(self) -> str:
        return f"md5-{hashlib.sha1(self.key).hexdigest()[:12]}-{self.num_outputs}"


# -- LSH ----------------------------------------------------------------------------------------------


def char_ngrams(token: str, max_n: int) -> list[str]:
    """Every character n-gram of ``token`` for n = 1..max_n, with repeats (so counts weight them)."""
    return [token[i : i + n] for n in range(1, max_n + 1) for i in range(len(token) - n + 1)]


class LSHHasher(Hasher):
    """Locality-sensitive hashing of character n-grams (the HashFormers paper, section 3.3).

    A token is the vector x of its character n-gram counts (n = 1..max_ngram) over the ``num_ngrams``
    most frequent n-grams of the pre-training corpus. Hyperplane j is one stored Gaussian vector eta
    rolled by j + 1 (the paper's ``r^1 = [eta_2, ..., eta_1]``), so no projection matrix is stored.
    Buckets: ``argmax_j x . r^j`` over N hyperplanes; bits: ``b_j = [x . r^j >= 0]`` over T hyperplanes.
    eta has ``max(num_ngrams, num_outputs)`` entries so that all N shifts differ when N exceeds the
    number of features. Scores add eta entries in a fixed order, without products: the same codes on
    every machine.

    Args:
        num_outputs: N buckets or T bits.
        num_ngrams: features kept (the paper: the top 50K n-grams).
        max_ngram: longest character n-gram (the paper: 4).
        seed: seeds eta (kept in the checkpoint as well).
        ngrams: a saved n-gram vocabulary (``lsh_ngrams.json`` of an earlier run) to use instead of
            fitting one on the corpus.
        fit_texts: fit on at most this many texts of the corpus (``None``: all of it).
    """

    ARTEFACT = "lsh_ngrams.json"
    sized_by_checkpoint = ("ngram_bytes", "ngram_ends")  # a fitted vocabulary has its own size

    def __init__(
        self,
        num_outputs: int,
        num_ngrams: int = 50_000,
        max_ngram: int = 4,
        seed: int = 0,
        ngrams: str | None = None,
        fit_texts: int | None = None,
    ) -> None:
        super().__init__(num_outputs)
        if num_ngrams < 1:
            raise ConfigError(f"num_ngrams={num_ngrams} must be at least 1")
        if max_ngram < 1:
            raise ConfigError(f"max_ngram={max_ngram} must be at least 1")
        if fit_texts is not None and fit_texts < 1:
            raise ConfigError(f"fit_texts={fit_texts} must be at least 1 (or unset for the whole corpus)")
        self.num_ngrams = num_ngrams
        self.max_ngram = max_ngram
        self.seed = seed
        self.ngrams_file = ngrams
        self.fit_texts = fit_texts
        eta = np.random.default_rng(seed).standard_normal(max(num_ngrams, num_outputs)).astype(np.float32)
        self.register_buffer("eta", torch.from_numpy(eta), persistent=True)
        self.register_buffer("ngram_bytes", torch.zeros(0, dtype=torch.uint8), persistent=True)
        self.register_buffer("ngram_ends", torch.zeros(0, dtype=torch.int64), persistent=True)
        if ngrams is not None:
            self.set_ngrams(read_ngrams(Path(ngrams), max_ngram))

    # -- the n-gram vocabulary ------------------------------------------------------------------------
    @property
    def fitted(self) -> bool:
        return self.ngram_ends.numel() > 0

    def fit(self, texts: Iterable[list[str]]) -> None:
        """Keep the ``num_ngrams`` n-grams most frequent in the corpus (ties by the n-gram itself).

        Tokens are counted first, so each unique token's n-grams are extracted once.
        """
        token_counts: Counter = Counter()
        for tokens in islice(texts, self.fit_texts):
            token_counts.update(tokens)
        counts: dict[str, int] = {}
        get = counts.get
        for token, count in token_counts.items():
            for gram in char_ngrams(token, self.max_ngram):
                counts[gram] = get(gram, 0) + count
        if not counts:
            raise ConfigError("cannot fit the LSH n-gram vocabulary: the corpus has no tokens")
        top = heapq.nsmallest(self.num_ngrams, counts.items(), key=lambda kv: (-kv[1], kv[0]))
        self.set_ngrams([gram for gram, _ in top])

    def set_ngrams(self, ngrams: list[str]) -> None:
        if not ngrams or len(ngrams) > self.num_ngrams:
            raise ConfigError(f"an LSH vocabulary needs 1 to num_ngrams={self.num_ngrams} n-grams, got {len(ngrams)}")
        encoded = [g.encode("utf-8", "surrogatepass") for g in ngrams]
        device = self.eta.device
        self.ngram_bytes = torch.tensor(list(b"".join(encoded)), dtype=torch.uint8, device=device)
        self.ngram_ends = torch.tensor(np.cumsum([len(e) for e in encoded]), dtype=torch.int64, device=device)

    def ngrams(self) -> list[str]:
        data = bytes(self.ngram_bytes.cpu().tolist())
        ends = self.ngram_ends.cpu().tolist()
        return [data[a:b].decode("utf-8", "surrogatepass") for a, b in zip([0, *ends[:-1]], ends)]

    def init_args(self) -> dict[str, Any]:
        return {"num_ngrams": self.num_ngrams, "max_ngram": self.max_ngram, "seed": self.seed,
                "ngrams": self.ngrams_file, "fit_texts": self.fit_texts}

    def artefact(self) -> tuple[str, str]:
        """``lsh_ngrams.json``, for people to read and for ``ngrams:`` to reuse."""
        payload = {"format": "lit-embed LSH n-grams", "max_ngram": self.max_ngram, "ngrams": self.ngrams()}
        return self.ARTEFACT, json.dumps(payload, ensure_ascii=False)

    def function(self) -> LSHHash:
        if not self.fitted:
            raise RuntimeError(
                "the LSH n-gram vocabulary is not fitted: the data module fits it on the corpus; otherwise call "
                "fit(), give ngrams: lsh_ngrams.json, or load a checkpoint"
            )
        return LSHHash(self.ngrams(), self.eta.cpu().numpy(), self.max_ngram, self.num_outputs)

    def extra_repr(self) -> str:
        return f"num_outputs={self.num_outputs}, num_ngrams={self.num_ngrams}, max_ngram={self.max_ngram}"


def read_ngrams(path: Path, max_ngram: int) -> list[str]:
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read the LSH n-gram vocabulary {str(path)!r} ({error}): give an lsh_ngrams.json") from error
    if payload.get("max_ngram") != max_ngram:
        raise ConfigError(
            f"{path} holds n-grams up to length {payload.get('max_ngram')}, but max_ngram={max_ngram}: make them match"
        )
    return list(payload["ngrams"])


class LSHHash:
    """The LSH hasher's state as a dictionary and float32 arrays: the hashing the pipeline runs.

    Every n-gram occurrence adds its hyperplane entries one at a time (no products), in a fixed
    order: the same float32 sums, so the same bits and buckets, on every machine.
    """

    def __init__(self, ngrams: list[str], eta: np.ndarray, max_ngram: int, num_outputs: int) -> None:
        self.ngrams = ngrams
        self.index = {gram: i for i, gram in enumerate(ngrams)}
        self.eta = np.asarray(eta, dtype=np.float32)
        self.max_ngram = max_ngram
        self.num_outputs = num_outputs
        self._eta2 = np.concatenate([self.eta, self.eta])  # eta[(f + j) % L] = eta2[f + j]
        self._planes: np.ndarray | None = None

    def __getstate__(self) -> dict:
        return {"ngrams": self.ngrams, "eta": self.eta, "max_ngram": self.max_ngram, "num_outputs": self.num_outputs}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def features(self, words: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(owner, feature)`` of every n-gram occurrence in the vocabulary; owners ascending."""
        grams = [char_ngrams(word, self.max_ngram) for word in words]
        flat = list(chain.from_iterable(grams))
        features = np.fromiter(map(self.index.get, flat, repeat(-1)), dtype=np.int64, count=len(flat))
        owners = np.repeat(np.arange(len(words)), [len(g) for g in grams])
        known = features >= 0
        return owners[known], features[known]

    def scores(self, words: list[str]) -> np.ndarray:
        """``(W, T)`` dot products ``x . r^j`` with the T hyperplanes: the sparse count vectors times
        the ``features x T`` slice of the hyperplanes (built once, on first use)."""
        from scipy import sparse

        if self._planes is None:
            windows = np.lib.stride_tricks.sliding_window_view(self._eta2, self.num_outputs)
            self._planes = np.ascontiguousarray(windows[1 : len(self.ngrams) + 1])
        owners, features = self.features(words)
        indptr = np.searchsorted(owners, np.arange(len(words) + 1))
        counts = sparse.csr_matrix(
            (np.ones(len(features), np.float32), features, indptr), shape=(len(words), len(self.ngrams))
        )
        return np.asarray(counts @ self._planes)

    def bits(self, words: list[str]) -> np.ndarray:
        """``b_j = [x . r^j >= 0]``: the paper's ``sgn(sgn(x . r^j) + 1)``."""
        return (self.scores(words) >= 0).astype(np.uint8)

    def buckets(self, words: list[str]) -> np.ndarray:
        """Index of the hyperplane with the largest dot product, one word at a time (N can be 50K)."""
        n, out = self.num_outputs, np.zeros(len(words), dtype=np.int64)
        owners, features = self.features(words)
        bounds = np.searchsorted(owners, np.arange(len(words) + 1))
        scores = np.empty(n, dtype=np.float32)
        for w in range(len(words)):
            scores[:] = 0.0
            for f in features[bounds[w] : bounds[w + 1]]:
                scores += self._eta2[f + 1 : f + 1 + n]
            out[w] = int(scores.argmax())
        return out

    def fingerprint(self) -> str:
        digest = hashlib.sha1(self.eta.tobytes())
        digest.update(json.dumps(self.ngrams, ensure_ascii=False).encode("utf-8", "surrogatepass"))
        return f"lsh-{digest.hexdigest()[:16]}-{self.max_ngram}-{self.num_outputs}"


__all__ = ["Hasher", "LSHHash", "LSHHasher", "MD5Hash", "MD5Hasher", "WordHash", "char_ngrams"]
