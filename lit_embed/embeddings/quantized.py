"""Quantised tables, each fitted post hoc to a dense table by ``lit-embed compress`` (:mod:`lit_embed.compress.methods`).

Additive quantization, every token a sum of one vector from each of M codebooks of K vectors: the baseline the
sparse-coding paper compares with (Babenko & Lempitsky 2014, learned as Shu & Nakayama 2017 do); unlike the
partial strategies it approximates the whole table, common tokens too (``--method aq``). Per-row scalar
quantisation to 8 or 4 bits (``--method int8`` / ``int4``) and product quantisation (``--method pq``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.errors import ConfigError


class PackedCodes(nn.Module):
    """A strategy whose ``codes`` buffer holds each row's codes packed at their bit width (:func:`pack_codes`)."""

    codes: Tensor
    vocab_size: int

    def code_layout(self) -> tuple[int, int]:
        """Codes a row, and K (each code lies below it)."""
        raise NotImplementedError

    def code_table(self) -> Tensor:
        """``(V, codes a row)`` each token's codes, unpacked."""
        return unpack_codes(self.codes, *self.code_layout())

    def set_codes(self, codes: Tensor) -> None:
        """Keep ``(V, codes a row)`` codes, packed."""
        self.codes.copy_(pack_codes(codes, self.code_layout()[1]))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        repack(state_dict, prefix + "codes", self.vocab_size, *self.code_layout())
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class AdditiveQuantizedEmbedding(PackedCodes, EmbeddingStrategy):
    """``e(n) = sum_m codebooks[m, codes[n, m]]``.

    The codes (``vocab_size x M`` indices below K) define the model, kept packed at their bit width (a persistent
    ``uint8`` buffer of ``ceil(M log2 K / 8)`` bytes a row: :func:`pack_codes`); parameters counted: the ``M K d``
    codebook entries plus the ``V M`` codes (each a log2(K)-bit index, counted as one parameter as sparse coding counts
    its ids).

    Args:
        vocab_size: V, the table's rows.
        hidden_size: d, its width.
        codebooks: M.
        codewords: K, vectors per codebook (at most 256).
        budget: size M to this many bytes at inference (or this fraction of the dense table's).
    """

    size_parameter = "codebooks"
    vocab_size: int  # a vocabulary strategy: never None
    codes: Tensor  # packed (pack_codes)

    def __init__(self, vocab_size: int, hidden_size: int, codebooks: int = 32, codewords: int = 16,
                 budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size)
        if codebooks < 1:
            raise ConfigError(f"codebooks={codebooks} must be at least 1")
        if not 2 <= codewords <= 256:
            raise ConfigError(f"codewords={codewords} must lie in [2, 256] (codes are stored as bytes)")
        self.num_codebooks, self.num_codewords = codebooks, codewords
        self.codebooks = nn.Parameter(torch.zeros(codebooks, codewords, hidden_size))
        self.register_buffer("codes", torch.zeros(vocab_size, packed_width(codebooks, codewords), dtype=torch.uint8),
                             persistent=True)
        self.register_buffer("offsets", torch.arange(codebooks) * codewords, persistent=False)

    def code_layout(self) -> tuple[int, int]:
        return self.num_codebooks, self.num_codewords

    def forward(self, codes: Tensor) -> Tensor:
        picks = unpack_codes(self.codes[codes.flatten()], self.num_codebooks, self.num_codewords) + self.offsets
        table = self.codebooks.reshape(-1, self.hidden_size)
        return F.embedding_bag(picks, table, mode="sum").reshape(*codes.shape, self.hidden_size)

    def num_embedding_parameters(self) -> int:
        return self.codebooks.numel() + self.vocab_size * self.num_codebooks

    @classmethod
    def count_parameters(cls, vocab_size: int, hidden_size: int, codebooks: int = 32, codewords: int = 16, **_) -> int:
        return codebooks * (codewords * hidden_size + vocab_size)

    def counting_rule(self) -> str:
        return f"each token's stored {self.num_codebooks} codes count"

    def init_args(self) -> dict:
        """The constructor arguments beyond the two sizes (the codebooks are kept as ``num_codebooks``)."""
        return {"codebooks": self.num_codebooks, "codewords": self.num_codewords, "budget": self.budget}


class ScalarQuantizedEmbedding(EmbeddingStrategy):
    """Per-row scalar quantisation: ``e(n) = offset[n] + scale[n] * q[n]``, each ``q[n, j]`` an integer of ``bits``
    bits (8: one per byte; 4: two per byte), stored in a ``uint8`` buffer; the per-row ``scale`` and ``offset``
    (float32) are parameters, so fine-tuning adapts them while the codes stay fixed.

    Counted as memory, not as values: ``num_embedding_parameters()`` is the float32 equivalent of the bytes stored,
    ``(V ceil(d bits / 8) + 8 V) / 4`` rounded up, so that a budget or a plot compares it with float tables honestly
    (a code is a quarter or an eighth of a float, not one). ``lit-embed compress --method int8`` / ``int4`` fits it.

    Args:
        vocab_size: V, the table's rows.
        hidden_size: d, its width.
        bits: bits per code, 8 or 4.
        budget: the table has one size for its bits: a budget is accepted only within 1% of it, and refused otherwise.
    """

    def __init__(self, vocab_size: int, hidden_size: int, bits: int = 8, budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size)
        if bits not in (4, 8):
            raise ConfigError(f"bits={bits} must be 8 or 4 (codes are packed into bytes)")
        self.bits = bits
        self.register_buffer("codes", torch.zeros(vocab_size, self.code_bytes(hidden_size, bits), dtype=torch.uint8))
        self.scale = nn.Parameter(torch.ones(vocab_size))
        self.offset = nn.Parameter(torch.zeros(vocab_size))

    @staticmethod
    def code_bytes(hidden_size: int, bits: int) -> int:
        """Bytes of one row's codes."""
        return -(-hidden_size * bits // 8)

    @classmethod
    def count_parameters(cls, vocab_size: int, hidden_size: int, bits: int = 8, **_) -> int:
        return -(-(vocab_size * cls.code_bytes(hidden_size, bits) + 8 * vocab_size) // 4)

    def num_embedding_parameters(self) -> int:
        return self.count_parameters(self.vocab_size, self.hidden_size, self.bits)

    def counting_rule(self) -> str:
        return (f"counted as memory: {self.bits}-bit codes and a float32 scale and offset per row, in float32 "
                f"equivalents (bytes / 4)")

    def levels(self, ids: Tensor) -> Tensor:
        """The integer codes ``q`` of ``ids``, unpacked to ``(*ids.shape, hidden_size)``."""
        packed = self.codes[ids]
        if self.bits == 8:
            return packed
        pairs = torch.stack((packed & 15, packed >> 4), dim=-1)  # low nibble first
        return pairs.flatten(-2)[..., : self.hidden_size]

    def forward(self, codes: Tensor) -> Tensor:
        levels = self.levels(codes).to(self.scale.dtype)
        return self.offset[codes].unsqueeze(-1) + self.scale[codes].unsqueeze(-1) * levels

    def quantize(self, weight: Tensor) -> None:
        """Set the codes, scales and offsets from a ``V x d`` table: each row's range split into ``2^bits - 1`` equal
        steps, every value rounded to the nearest (error at most half a step)."""
        rows = weight.detach().float()
        low, high = rows.min(-1).values, rows.max(-1).values
        top = 2**self.bits - 1
        scale = (high - low) / top
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # a constant row: every code 0
        levels = torch.round((rows - low[:, None]) / scale[:, None]).clamp(0, top).to(torch.uint8)
        if self.bits == 4:
            if self.hidden_size % 2:
                levels = torch.cat([levels, levels.new_zeros(len(levels), 1)], dim=1)
            levels = levels[:, 0::2] | (levels[:, 1::2] << 4)
        with torch.no_grad():
            self.codes.copy_(levels)
            self.scale.copy_(scale)
            self.offset.copy_(low)


class ProductQuantizedEmbedding(PackedCodes, EmbeddingStrategy):
    """Product quantisation (Jégou et al., "Product Quantization for Nearest Neighbor Search", TPAMI 2011): the
    ``d`` dimensions split into ``G`` groups of ``d / G``; a row is the concatenation of one of ``K`` codewords per
    group, ``e(n) = [codebooks[g, codes[n, g]] for g]``. The codes are fixed, kept packed at their bit width (a
    persistent ``uint8`` buffer of ``ceil(G log2 K / 8)`` bytes a row: :func:`pack_codes`); the codebooks are
    parameters. Counted as DPQ and AQ count theirs: the ``K d`` codebook values and ``V G`` codes.
    ``lit-embed compress --method pq`` fits it by k-means in each group.

    Args:
        vocab_size: V, the table's rows.
        hidden_size: d, its width.
        groups: G, dividing ``hidden_size``.
        codewords: K, codewords per group (at most 256).
        budget: size K to this many bytes at inference, or this fraction of the dense table's bytes (the ``V G`` codes are fixed by
            ``groups``, so a budget below them, or above ``256 d`` more, is refused naming what can be met).
    """

    size_parameter = "codewords"
    vocab_size: int  # a vocabulary strategy: never None
    codes: Tensor  # packed (pack_codes)

    def __init__(self, vocab_size: int, hidden_size: int, groups: int = 8, codewords: int = 256,
                 budget: int | float | None = None) -> None:
        super().__init__(vocab_size, hidden_size)
        if groups < 1 or hidden_size % groups:
            raise ConfigError(f"groups={groups} must divide hidden_size={hidden_size}")
        if not 2 <= codewords <= 256:
            raise ConfigError(f"codewords={codewords} must lie in [2, 256] (codes are stored as bytes)")
        self.groups, self.codewords = groups, codewords
        self.codebooks = nn.Parameter(torch.zeros(groups, codewords, hidden_size // groups))
        self.register_buffer("codes", torch.zeros(vocab_size, packed_width(groups, codewords), dtype=torch.uint8))
        self.register_buffer("offsets", torch.arange(groups) * codewords, persistent=False)

    def code_layout(self) -> tuple[int, int]:
        return self.groups, self.codewords

    @classmethod
    def count_parameters(cls, vocab_size: int, hidden_size: int, groups: int = 8, codewords: int = 256, **_) -> int:
        return codewords * hidden_size + vocab_size * groups

    @classmethod
    def size_range(cls, vocab_size: int, hidden_size: int, **_) -> tuple[int, int]:
        return 2, 256

    def num_embedding_parameters(self) -> int:
        return self.count_parameters(self.vocab_size, self.hidden_size, self.groups, self.codewords)

    def counting_rule(self) -> str:
        return f"each token's stored {self.groups} codes count"

    def forward(self, codes: Tensor) -> Tensor:
        picks = unpack_codes(self.codes[codes], self.groups, self.codewords) + self.offsets  # rows of the codebooks
        flat = self.codebooks.reshape(-1, self.hidden_size // self.groups)
        return F.embedding(picks, flat).flatten(-2)


def code_bits(codewords: int) -> int:
    """Bits of an index below ``codewords``: ceil(log2 K) (4 for K = 16, 8 for K = 256)."""
    return max(1, (codewords - 1).bit_length())


def packed_width(per_row: int, codewords: int) -> int:
    """Bytes of a row's ``per_row`` codes below ``codewords``, packed."""
    return -(-per_row * code_bits(codewords) // 8)


def pack_codes(codes: Tensor, codewords: int) -> Tensor:
    """``(V, n)`` indices below ``codewords`` as ``(V, packed_width)`` bytes: each row's codes one after another at
    :func:`code_bits` bits, least significant bit first, the last byte padded with zeros."""
    bits = code_bits(codewords)
    if codes.numel() and (int(codes.max()) >= codewords or int(codes.min()) < 0):
        raise ConfigError(f"codes must lie in [0, {codewords}): got {int(codes.min())}..{int(codes.max())}")
    stream = (codes.long().unsqueeze(-1) >> torch.arange(bits, device=codes.device)) & 1  # (V, n, bits)
    stream = stream.flatten(-2)
    width = packed_width(codes.shape[-1], codewords)
    stream = F.pad(stream, (0, 8 * width - stream.shape[-1])).reshape(*codes.shape[:-1], width, 8)
    return (stream << torch.arange(8, device=codes.device)).sum(-1).to(torch.uint8)


def unpack_codes(packed: Tensor, per_row: int, codewords: int) -> Tensor:
    """The ``(..., per_row)`` indices :func:`pack_codes` packed into ``(..., packed_width)`` bytes (as int64)."""
    bits = code_bits(codewords)
    if bits == 8:
        return packed.long()
    stream = (packed.long().unsqueeze(-1) >> torch.arange(8, device=packed.device)) & 1
    stream = stream.flatten(-2)[..., : per_row * bits].reshape(*packed.shape[:-1], per_row, bits)
    return (stream << torch.arange(bits, device=packed.device)).sum(-1)


def repack(state_dict: dict, key: str, vocab_size: int, per_row: int, codewords: int) -> None:
    """Pack, in ``state_dict``, codes saved one byte each (lit-embed before the codes were packed), so that they load."""
    codes = state_dict.get(key)
    if codes is not None and tuple(codes.shape) == (vocab_size, per_row) != (vocab_size, packed_width(per_row, codewords)):
        state_dict[key] = pack_codes(codes, codewords)
