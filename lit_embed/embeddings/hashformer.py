"""HashFormers (Xue & Aletras, 2022): vocabulary-free embeddings of hashed words, and ProFormer's.

Every strategy here supports an unlimited vocabulary (``vocab_size`` is ``None``): its text encoder
hashes each word (MD5 or LSH, see :mod:`lit_embed.embeddings.hashers`) in the data pipeline, once per
unique word, and ``forward`` turns the codes into vectors with tensor operations only.

* :class:`HashEmbedding` (Emb): a table of N rows; the specials are rows 0-4, words ``5 + bucket``.
* :class:`HashPool`, :class:`HashAdd`, :class:`HashProj`: vectors computed from T hash bits. A 6-row
  special-token table adds the specials' own vectors (rows 0-4) and one vector shared by every hashed
  word (row 5); special tokens get only their row.
* :class:`ProFormerEmbedding`: 420 LSH bits through a linear projection (Sankar et al., 2021).

Parameter counts follow the paper's Appendix B, which leaves out what only special tokens use:
Emb N*d; Pool (ceil(T/k) + 2^k + 1)*d; Add (2T + 1)*d; Proj (T + 1)*d (the +1 is the shared word
row; this reproduces Table 2's 797.2K, 197.4K and 99.1K); ProFormer 420*d.

The paper gives neither regularisation nor initialisation; the authors' model code decides both
(HUIYINXUE/hashformer, ``src/model/model.py``): Add's two maps are DropConnect layers (``DropoutLinear``,
lines 116-147: ``F.linear(x, nn.Dropout(0.1)(W))``), Pool drops its looked-up codebook vectors (line 347),
Proj has no dropout (``DropoutLinearCosNorm``, lines 79-113, despite the name), and every weight starts
from their truncated normal (:mod:`lit_embed.embeddings.initialisation`), special-token table included, its padding
row not zeroed. ProFormer's code is not theirs (nor released): it follows the same initialisation.
"""

from __future__ import annotations

import functools
import math
from abc import abstractmethod
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.embeddings.hash_text import (
    NUM_SPECIAL,
    SPECIAL_IDS,
    WORD_ROW,
    BitCodes,
    BucketCodes,
    HashTextEncoder,
    unpack_bits,
)
from lit_embed.embeddings.hashers import Hasher, LSHHasher, MD5Hasher
from lit_embed.embeddings.initialisation import truncated_normal_
from lit_embed.embeddings.text import VocabTextEncoder
from lit_embed.errors import ConfigError

#: A hasher still missing its number of outputs (N buckets or T bits), which the strategy gives.
HasherFactory = Callable[[int], Hasher]
Tokenization = Literal["word", "subword"]


class HashStrategy(EmbeddingStrategy):
    """What every hash strategy shares: the hasher, the text encoder, random codes, the vocabulary check.

    Args:
        vocab_size: must be ``None`` (the vocabulary is unlimited); the model passes it.
        hidden_size: width of each vector.
        codes: the code layout.
        num_outputs: buckets or bits the hasher produces.
        hasher: ``MD5Hasher`` (default) or ``LSHHasher``, without its number of outputs.
        tokenization: ``word`` (the paper) or ``subword`` (hash the data tokenizer's pieces, Appendix C).
    """

    unlimited_vocabulary = True

    def __init__(
        self,
        vocab_size: int | None,
        hidden_size: int,
        codes: BucketCodes | BitCodes,
        num_outputs: int,
        hasher: HasherFactory | None = None,
        tokenization: Tokenization = "word",
    ) -> None:
        super().__init__(vocab_size, hidden_size)
        if tokenization not in ("word", "subword"):
            raise ConfigError(f"tokenization={tokenization!r} must be 'word' or 'subword'")
        self.codes = codes
        self.code_shape = codes.code_shape
        self.tokenization = tokenization
        self.hasher = (hasher or MD5Hasher)(num_outputs)

    @property
    def reads_tokenizer(self) -> bool:
        return self.tokenization == "subword"

    def text_encoder(self, tokenizer: str | None) -> HashTextEncoder:
        """Words (the data's ``tokenizer`` is not used), or that tokenizer's pieces with ``tokenization: subword``."""
        pieces = VocabTextEncoder(tokenizer) if self.tokenization == "subword" else None
        return HashTextEncoder(self.hasher, self.codes, pieces)

    def code_sampler(self) -> Callable[[tuple[int, ...]], Tensor]:
        return self.codes.random

    @staticmethod
    def _max_bits(hasher: HasherFactory | None, default: type[Hasher] = MD5Hasher) -> int:
        """The most bits the hasher gives (MD5's 128; LSH's: as many as asked, here up to 2^16). A factory from a config
        is a partial whose class may be among its arguments (jsonargparse's), not its function."""
        factory = hasher or default
        if isinstance(factory, functools.partial):
            factory = next((a for a in (factory.func, *factory.args) if isinstance(a, type) and issubclass(a, Hasher)),
                           factory.func)
        return getattr(factory, "max_bits", None) or 2**16


class HashEmbedding(HashStrategy):
    """HashFormer-Emb: ``E[5 + H(t) % (N - 5)]`` from an N-row table; rows 0-4 are the special tokens.

    With MD5, ``H(t)`` is the digest as a 128-bit integer (``hello`` -> 46797 for N = 50265); with
    LSH, the index of the nearest of N - 5 hyperplanes.

    ``hasher`` and ``tokenization``: see :class:`HashStrategy`.

    Args:
        num_buckets: N, the table's rows (specials included).
        init_std: standard deviation of the truncated normal initialisation (cut at +-2 ``init_std``, as the
            authors' ``_init_weights``).
        budget: size N to this many bytes at inference (a number: the vocabulary is unlimited).
    """

    size_parameter = "num_buckets"

    def __init__(
        self,
        vocab_size: int | None,
        hidden_size: int,
        num_buckets: int = 50265,
        hasher: HasherFactory | None = None,
        tokenization: Tokenization = "word",
        init_std: float = 0.02,
        budget: int | float | None = None,
    ) -> None:
        if num_buckets <= NUM_SPECIAL:
            raise ConfigError(
                f"num_buckets={num_buckets} leaves no bucket for words after the {NUM_SPECIAL} special tokens: "
                f"use at least {NUM_SPECIAL + 1}"
            )
        super().__init__(vocab_size, hidden_size, BucketCodes(num_buckets), num_buckets - NUM_SPECIAL, hasher, tokenization)
        self.num_buckets = num_buckets
        self.init_std = init_std
        self.weight = nn.Parameter(truncated_normal_(torch.empty(num_buckets, hidden_size), init_std))

    def forward(self, codes: Tensor) -> Tensor:
        return nn.functional.embedding(codes, self.weight)

    @classmethod
    def count_parameters(cls, vocab_size: None, hidden_size: int, num_buckets: int = 50265, **_) -> int:
        return num_buckets * hidden_size

    @classmethod
    def size_range(cls, vocab_size: None, hidden_size: int, **_) -> tuple[int, int]:
        return NUM_SPECIAL + 1, 2**31 - 1

    def extra_repr(self) -> str:
        return f"num_buckets={self.num_buckets}, hidden_size={self.hidden_size}"


class BitHashStrategy(HashStrategy):
    """A strategy computing each word's vector from its T hash bits, plus the special-token table.

    Subclasses define :meth:`word_vectors`. The table (before the backbone's LayerNorm, like the
    token embedding it replaces) has rows 0-4 for the specials and, where ``shared_word_row``, row 5
    added to every hashed word. Specials get only their row: the bit part is masked to zero. The padding
    row is an ``nn.Embedding`` padding row, never trained, and, as in the authors' code, not zeroed.
    """

    #: Whether every hashed word gets the special table's row 5 (HashFormers) or nothing (ProFormer).
    shared_word_row = True

    def __init__(
        self,
        vocab_size: int | None,
        hidden_size: int,
        num_bits: int,
        hasher: HasherFactory | None = None,
        tokenization: Tokenization = "word",
    ) -> None:
        if num_bits < 1:
            raise ConfigError(f"num_bits={num_bits} must be a positive number of hash bits (T)")
        super().__init__(vocab_size, hidden_size, BitCodes(num_bits), num_bits, hasher, tokenization)
        limit = self.hasher.max_bits
        if limit is not None and num_bits > limit:
            raise ConfigError(
                f"num_bits={num_bits} exceeds the {limit} bits of {type(self.hasher).__name__}: use at most {limit} "
                f"bits or the LSHHasher"
            )
        self.num_bits = num_bits
        pad = SPECIAL_IDS["pad"]
        self.special = nn.Embedding(NUM_SPECIAL + 1, hidden_size, padding_idx=pad)
        truncated_normal_(self.special.weight)

    @abstractmethod
    def word_vectors(self, bits: Tensor) -> Tensor:
        """``(..., T)`` 0/1 bits to ``(..., hidden_size)`` vectors."""

    def forward(self, codes: Tensor) -> Tensor:
        """Each distinct code's vector once, gathered back to its tokens, on the CPU: real text repeats its words (a
        batch of 4,096 tokens holds about 1,200 distinct ones), and the unpacking, projection, word mask and special
        rows then run on those alone. Elsewhere every token's: on a GPU finding the distinct codes would make the host
        wait for the device, and projecting every token costs it little."""
        if codes.device.type != "cpu":
            return self._vectors(codes)
        distinct, inverse = distinct_rows(codes.reshape(-1, codes.shape[-1]))
        return nn.functional.embedding(inverse, self._vectors(distinct)).view(*codes.shape[:-1], self.hidden_size)

    def _vectors(self, codes: Tensor) -> Tensor:
        row = codes[..., 0]
        is_word = (row == WORD_ROW).unsqueeze(-1)
        special = self.special(row)
        if not self.shared_word_row:
            special = special.masked_fill(is_word, 0.0)
        return self._plus_word_vectors(special, unpack_bits(codes[..., 1:], self.num_bits), is_word)

    def _plus_word_vectors(self, special: Tensor, bits: Tensor, is_word: Tensor) -> Tensor:
        """``special`` plus the words' vectors (zero where ``is_word`` is false)."""
        return special + self.word_vectors(bits) * is_word

    def num_embedding_parameters(self) -> int:
        own = sum(p.numel() for name, p in self.named_parameters() if not name.startswith("special."))
        return own + (self.hidden_size if self.shared_word_row else 0)

    def counting_rule(self) -> str:
        left_out = "the 5 special-token rows" if self.shared_word_row else "the special-token table"
        return f"HashFormers Appendix B: {left_out} of {self.hidden_size} are not counted"

    @staticmethod
    def _weight(*shape: int) -> nn.Parameter:
        """A hash layer's weight, initialised as the authors' ``_init_weights`` does."""
        return nn.Parameter(truncated_normal_(torch.empty(*shape)))

    def extra_repr(self) -> str:
        return f"num_bits={self.num_bits}, hidden_size={self.hidden_size}"


class ProjectedBits(BitHashStrategy):
    """A strategy whose word vectors are one product, ``features(bits) @ matrix()``: the word mask goes into the
    features (a row of zeros for a special token) and the special rows into the product's sum (``addmm``), so that
    apart from the matrix product nothing runs over the ``codes x d`` vectors but the gather back to the tokens."""

    @abstractmethod
    def features(self, bits: Tensor) -> Tensor:
        """``(..., T)`` 0/1 bits to the ``(..., F)`` rows the matrix maps."""

    @abstractmethod
    def matrix(self) -> Tensor:
        """The ``(F, hidden_size)`` map (dropped out in training where the strategy drops weights)."""

    def word_vectors(self, bits: Tensor) -> Tensor:
        return self.features(bits) @ self.matrix()

    def _plus_word_vectors(self, special: Tensor, bits: Tensor, is_word: Tensor) -> Tensor:
        features = (self.features(bits) * is_word).flatten(0, -2)
        return torch.addmm(special.flatten(0, -2), features, self.matrix()).view(special.shape)


class HashPool(BitHashStrategy):
    """HashFormer-Pool: the T bits cut into ceil(T/k) chunks of k bits (the last one shorter), each
    chunk's integer a row of a shared ``2^k x d`` codebook B, pooled with a softmax over chunks per
    dimension: ``e = sum_j softmax(A)_j * B[c_j]`` with A learnable ``(ceil(T/k), d)``. In training the
    looked-up vectors ``B[c_j]`` pass through dropout first (the authors' ``emb_dropout``, model.py:318, 347).

    ``hasher`` and ``tokenization``: see :class:`HashStrategy`.

    Args:
        num_bits: T (128 for MD5).
        chunk_bits: k (the paper: 10, so 13 chunks and 1024 codebook rows).
        dropout: probability of dropping each value of the looked-up codebook vectors in training (the
            authors' 0.1; off in evaluation).
        budget: size k to this many bytes at inference (a number: the vocabulary is unlimited).
    """

    size_parameter = "chunk_bits"

    def __init__(
        self,
        vocab_size: int | None,
        hidden_size: int,
        num_bits: int = 128,
        chunk_bits: int = 10,
        dropout: float = 0.1,
        hasher: HasherFactory | None = None,
        tokenization: Tokenization = "word",
        budget: int | float | None = None,
    ) -> None:
        super().__init__(vocab_size, hidden_size, num_bits, hasher, tokenization)
        self.dropout = _probability("dropout", dropout)
        if not 1 <= chunk_bits <= num_bits:
            raise ConfigError(f"chunk_bits k={chunk_bits} must lie between 1 and num_bits T={num_bits}")
        if chunk_bits > 24:
            raise ConfigError(f"chunk_bits k={chunk_bits} makes a codebook of 2^{chunk_bits} rows: use k <= 24")
        self.chunk_bits = chunk_bits
        self.num_chunks = -(-num_bits // chunk_bits)
        self.codebook = self._weight(2**chunk_bits, hidden_size)
        self.chunk_weights = self._weight(self.num_chunks, hidden_size)
        # Place values: bit i of chunk c weighs 2^(last bit of c - i), so a short last chunk reads as its own integer.
        position = torch.arange(self.num_chunks * chunk_bits)
        end = torch.clamp((position // chunk_bits + 1) * chunk_bits, max=num_bits)
        places = torch.where(position < num_bits, 2 ** (end - 1 - position).clamp(min=0), 0)
        self.register_buffer("places", places.view(self.num_chunks, chunk_bits), persistent=False)

    @classmethod
    def count_parameters(cls, vocab_size: None, hidden_size: int, num_bits: int = 128, chunk_bits: int = 10, **_) -> int:
        return (-(-num_bits // chunk_bits) + 2**chunk_bits + 1) * hidden_size

    @classmethod
    def size_range(cls, vocab_size: None, hidden_size: int, num_bits: int = 128, **_) -> tuple[int, int]:
        return 1, min(num_bits, 24)

    @property
    def dropping(self) -> bool:
        return self.training and self.dropout > 0

    def forward(self, codes: Tensor) -> Tensor:
        """The pooled vectors, less what dropout takes away from this batch's tokens in training."""
        vectors = super().forward(codes)
        return vectors - self.dropped(codes) if self.dropping else vectors

    def chunks(self, bits: Tensor) -> Tensor:
        """``(..., T)`` bits to ``(..., ceil(T/k))`` chunk integers in ``[0, 2^k)``."""
        padded = nn.functional.pad(bits, (0, self.places.numel() - self.num_bits))
        return (padded.view(*bits.shape[:-1], self.num_chunks, self.chunk_bits) * self.places).sum(-1)

    def pooling_weights(self) -> Tensor:
        """``softmax(A)``, over ``1 - p`` in training: the scale dropout gives the terms it keeps."""
        weights = self.chunk_weights.softmax(dim=0)
        return weights / (1 - self.dropout) if self.dropping else weights

    def word_vectors(self, bits: Tensor) -> Tensor:
        """``sum_j softmax(A)_j * B[c_j]`` (scaled for dropout in training, see :meth:`dropped`): :class:`PooledChunks`."""
        chunks = self.chunks(bits)
        pooled = PooledChunks.apply(chunks.reshape(-1, self.num_chunks), self.codebook, self.pooling_weights())
        return pooled.view(*chunks.shape[:-1], self.hidden_size)

    def dropped(self, codes: Tensor) -> Tensor:
        """The sum of the terms ``softmax(A)_jd B[c_j]_d / (1 - p)`` that dropout drops from each word's vector, each
        (token, chunk j, dimension d) independently with probability p, as ``nn.functional.dropout`` on the
        gathered ``tokens x ceil(T/k) x d`` tensor would (the authors' ``emb_dropout``).

        On the CPU only the dropped terms are visited, about p of them (:func:`bernoulli_positions`), so the
        kept ones are pooled once per distinct code: at 32 x 128 tokens and d = 512 the gathered tensor is
        109 MB, and building it, its mask and its gradient took 0.6-1.9 s a step. Elsewhere one mask over
        the gathered terms (finding the dropped positions would make the host wait for the device)."""
        words = codes[..., 0] == WORD_ROW
        chunks = self.chunks(unpack_bits(codes[..., 1:], self.num_bits))
        weights = self.pooling_weights()
        width = self.hidden_size
        if codes.device.type != "cpu":
            drop = torch.rand(*chunks.shape, width, device=codes.device) < self.dropout
            terms = nn.functional.embedding(chunks, self.codebook) * weights * drop
            return terms.sum(-2) * words.unsqueeze(-1)
        word_tokens = words.view(-1).nonzero().squeeze(1)
        word_chunks = chunks.view(-1, self.num_chunks)[word_tokens]  # (words, ceil(T/k)): a row per (word, chunk)
        rows = word_chunks.numel()
        index = torch.int32 if rows * width < 2**31 else torch.int64
        position = bernoulli_positions(rows * width, self.dropout, torch.float64)
        row = position.div(width).floor_().to(index)  # exact: positions are whole numbers below 2^53
        position = position.to(index)
        # Per row, a flat codebook, weight and output offset less the row's own (row * width): each term's is then its
        # position plus its row's value, with no division into row and dimension.
        own = torch.arange(rows, dtype=index) * width
        code_at = (word_chunks.to(index).view(-1) * width - own).index_select(0, row).add_(position)
        weight_at = ((torch.arange(self.num_chunks, dtype=index) * width).repeat(len(word_tokens)) - own).index_select(0, row)
        token_at = ((word_tokens.to(index) * width).repeat_interleave(self.num_chunks) - own).index_select(0, row)
        terms = self.codebook.view(-1).index_select(0, code_at) * weights.reshape(-1).index_select(0, weight_at.add_(position))
        token_at.add_(position)
        dropped = terms.new_zeros(words.numel() * width).index_add_(0, token_at, terms)
        return dropped.view(*words.shape, width)


class HashAdd(ProjectedBits):
    """HashFormer-Add: T codebooks of two vectors, one per bit value, summed and scaled by 1/sqrt(T):
    ``e = (B1^T b + B0^T (1 - b)) / sqrt(T)`` (the paper found sqrt(T) better than averaging).

    In training both maps are DropConnect layers, as the authors' ``DropoutLinear`` (model.py:116-147, used at
    230-231): each step drops each weight of B1 and of B0 with probability ``drop_connect``, independently for
    the two maps, and scales the kept weights by ``1 / (1 - drop_connect)`` (``nn.Dropout`` applied to the
    weight matrix), before the division by sqrt(T) (line 272). Evaluation uses the weights as they are.

    ``hasher`` and ``tokenization``: see :class:`HashStrategy`.

    Args:
        num_bits: T (128 for MD5).
        drop_connect: probability of dropping each weight in training (the authors' 0.1).
        budget: size T to this many bytes at inference (a number: the vocabulary is unlimited).
    """

    size_parameter = "num_bits"

    def __init__(
        self,
        vocab_size: int | None,
        hidden_size: int,
        num_bits: int = 128,
        drop_connect: float = 0.1,
        hasher: HasherFactory | None = None,
        tokenization: Tokenization = "word",
        budget: int | float | None = None,
    ) -> None:
        super().__init__(vocab_size, hidden_size, num_bits, hasher, tokenization)
        self.drop_connect = _probability("drop_connect", drop_connect)
        self.ones = self._weight(num_bits, hidden_size)
        self.zeros = self._weight(num_bits, hidden_size)

    @classmethod
    def count_parameters(cls, vocab_size: None, hidden_size: int, num_bits: int = 128, **_) -> int:
        return (2 * num_bits + 1) * hidden_size

    @classmethod
    def size_range(cls, vocab_size: None, hidden_size: int, hasher: HasherFactory | None = None, **_) -> tuple[int, int]:
        return 1, cls._max_bits(hasher)

    def features(self, bits: Tensor) -> Tensor:
        """The bits and a 1: ``B1^T b + B0^T (1 - b) = (B1 - B0)^T b + B0^T 1``, one product instead of two."""
        return nn.functional.pad(bits.to(self.ones.dtype), (0, 1), value=1.0)

    def matrix(self) -> Tensor:
        ones, zeros = (nn.functional.dropout(w, self.drop_connect, self.training) for w in (self.ones, self.zeros))
        return torch.cat([ones - zeros, zeros.sum(0, keepdim=True)]) / math.sqrt(self.num_bits)


class HashProj(ProjectedBits):
    """HashFormer-Proj: dimension j is the Pearson correlation between the bits and learnable axis w_j.

    ``e_j = <b - mean(b), w_j - mean(w_j)> / (|b - mean(b)| |w_j - mean(w_j)|)`` with W ``(T, d)``;
    a constant bit vector has no correlation and gives 0.

    ``hasher`` and ``tokenization``: see :class:`HashStrategy`.

    Args:
        num_bits: T (128 for MD5).
        budget: size T to this many bytes at inference (a number: the vocabulary is unlimited).
    """

    size_parameter = "num_bits"

    def __init__(
        self,
        vocab_size: int | None,
        hidden_size: int,
        num_bits: int = 128,
        hasher: HasherFactory | None = None,
        tokenization: Tokenization = "word",
        budget: int | float | None = None,
    ) -> None:
        super().__init__(vocab_size, hidden_size, num_bits, hasher, tokenization)
        self.axes = self._weight(num_bits, hidden_size)

    @classmethod
    def count_parameters(cls, vocab_size: None, hidden_size: int, num_bits: int = 128, **_) -> int:
        return (num_bits + 1) * hidden_size

    @classmethod
    def size_range(cls, vocab_size: None, hidden_size: int, hasher: HasherFactory | None = None, **_) -> tuple[int, int]:
        return 1, cls._max_bits(hasher)

    def features(self, bits: Tensor) -> Tensor:
        b = bits.to(self.axes.dtype)
        b = b - b.mean(-1, keepdim=True)
        return b / b.norm(dim=-1, keepdim=True).clamp(min=1e-8)

    def matrix(self) -> Tensor:
        w = self.axes - self.axes.mean(0, keepdim=True)
        return w / w.norm(dim=0, keepdim=True).clamp(min=1e-8)


class ProFormerEmbedding(ProjectedBits):
    """ProFormer's LSH projection embedding: T = 420 LSH bits through a linear map (no bias).

    The baseline the HashFormers paper trains from scratch on each task, with 2 transformer layers
    (``configs/backbone/proformer.yaml``): 420 * 768 = 322.6K embedding parameters.

    Args:
        num_bits: T, the LSH digest size.
        hasher: default ``LSHHasher``.
        tokenization: see :class:`HashStrategy`.
        budget: size T to this many bytes at inference (a number: the vocabulary is unlimited).
    """

    shared_word_row = False
    size_parameter = "num_bits"

    def __init__(
        self,
        vocab_size: int | None,
        hidden_size: int,
        num_bits: int = 420,
        hasher: HasherFactory | None = None,
        tokenization: Tokenization = "word",
        budget: int | float | None = None,
    ) -> None:
        super().__init__(vocab_size, hidden_size, num_bits, hasher or LSHHasher, tokenization)
        self.projection = self._weight(num_bits, hidden_size)

    @classmethod
    def count_parameters(cls, vocab_size: None, hidden_size: int, num_bits: int = 420, **_) -> int:
        return num_bits * hidden_size

    @classmethod
    def size_range(cls, vocab_size: None, hidden_size: int, hasher: HasherFactory | None = None, **_) -> tuple[int, int]:
        return 1, cls._max_bits(hasher, LSHHasher)

    def features(self, bits: Tensor) -> Tensor:
        return bits.to(self.projection.dtype)

    def matrix(self) -> Tensor:
        return self.projection


class PooledChunks(torch.autograd.Function):
    """``sum_j weights[j] * codebook[chunks[:, j]]`` for ``(n, J)`` chunk integers: HashFormer-Pool's pooling.

    One ``n x d`` gather per chunk, accumulated in place; the backward gathers each chunk's rows again rather than
    keeping them. Autograd over the same sum builds ``n x J x d`` gathered rows (or, summing a weighted codebook in
    one ``embedding_bag``, ``J x 2^k x d`` rows) and their gradients: at 32 x 128 tokens (1,194 distinct words,
    J = 13, 2^k = 1024, d = 512) 27-33 MB tensors, and a forward and backward took 39-85 ms on one thread of a
    shared CPU, against 9-23 ms here."""

    @staticmethod
    def forward(ctx, chunks: Tensor, codebook: Tensor, weights: Tensor) -> Tensor:
        ctx.save_for_backward(chunks, codebook, weights)
        pooled = codebook.new_zeros(len(chunks), codebook.shape[1])
        for j in range(chunks.shape[1]):
            pooled.addcmul_(codebook.index_select(0, chunks[:, j]), weights[j])
        return pooled

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[None, Tensor | None, Tensor | None]:
        chunks, codebook, weights = ctx.saved_tensors
        grad_codebook = torch.zeros_like(codebook) if ctx.needs_input_grad[1] else None
        grad_weights = torch.empty_like(weights) if ctx.needs_input_grad[2] else None
        for j in range(chunks.shape[1]):
            if grad_codebook is not None:
                grad_codebook.index_add_(0, chunks[:, j], grad * weights[j])
            if grad_weights is not None:
                grad_weights[j] = codebook.index_select(0, chunks[:, j]).mul_(grad).sum(0)
        return None, grad_codebook, grad_weights


def distinct_rows(rows: Tensor) -> tuple[Tensor, Tensor]:
    """The distinct rows of an ``(n, c)`` integer tensor and each row's index among them: ``torch.unique(rows, dim=0,
    return_inverse=True)``, by one stable sort per column (``unique`` with ``dim`` compares row by row: 26 ms for
    4,096 codes of MD5's 3 columns on one CPU thread, most of a HashFormer-Proj step)."""
    order = torch.arange(len(rows), device=rows.device)
    for column in reversed(range(rows.shape[1])):
        order = order[torch.sort(rows[order, column], stable=True).indices]
    ordered = rows[order]
    starts = torch.ones(len(rows), dtype=torch.bool, device=rows.device)
    starts[1:] = (ordered[1:] != ordered[:-1]).any(1)
    inverse = torch.empty_like(order)
    inverse[order] = starts.cumsum(0) - 1
    return ordered[starts], inverse


def bernoulli_positions(total: int, p: float, dtype: torch.dtype = torch.int64) -> Tensor:
    """The positions in ``[0, total)`` that ``total`` independent draws of probability ``p`` pick, ascending.

    The gaps between picks are geometric, ``floor(E / -log(1 - p))`` for an exponential ``E = -log(1 - U)``, so this
    draws about ``p * total`` uniform numbers (float64, from torch's generator: seeded as dropout is), not ``total``.
    The positions are summed in float64, exact below 2^53."""
    rate = -math.log1p(-p)
    batch = int(total * p + 8 * math.sqrt(total * p * (1 - p))) + 16  # enough, but for about 1 time in 10^15
    parts, end = [], -1.0
    while end < total:  # a position at or past the end closes the draw
        gaps = torch.rand(batch, dtype=torch.float64).neg_().log1p_().div_(-rate).floor_().add_(1)
        parts.append(gaps.cumsum_(0).add_(end))
        end = float(parts[-1][-1])
    positions = torch.cat(parts) if len(parts) > 1 else parts[0]
    return positions[: int(torch.searchsorted(positions, total))].to(dtype)


def _probability(name: str, p: float) -> float:
    if not 0.0 <= p < 1.0:
        raise ConfigError(f"{name}={p} must lie in [0, 1): the probability of dropping a value in training")
    return p


__all__ = [
    "BitHashStrategy", "HashAdd", "HashEmbedding", "HashPool", "HashProj", "HashStrategy", "HasherFactory",
    "ProFormerEmbedding",
]
