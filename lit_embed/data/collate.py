"""Batching: padding of code sequences, and the corruption each pre-training objective needs."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from lit_embed.embeddings.text import TextEncoder
from lit_embed.errors import ConfigError


class PadCollator:
    """Pads ``codes`` (and ``token_type_ids``/``labels`` when present) to the longest item.

    Every item is ``{"codes": array (L, *code_shape), ...}`` whose first and last positions are the
    ``cls``/``sep`` specials; the batch gets ``attention_mask`` and ``special_mask`` (cls, sep, pad).
    """

    def __init__(self, text_encoder: TextEncoder) -> None:
        self.pad_code = torch.as_tensor(text_encoder.special_code("pad"))

    def __call__(self, items: list[dict]) -> dict[str, Tensor]:
        lengths = torch.tensor([len(item["codes"]) for item in items])
        longest = int(lengths.max())
        first = np.asarray(items[0]["codes"])
        codes = self.pad_code.expand(len(items), longest, *first.shape[1:]).clone()
        for row, item in enumerate(items):
            codes[row, : lengths[row]] = torch.tensor(np.asarray(item["codes"]))  # a copy: datasets hands out read-only arrays
        positions = torch.arange(longest)[None, :]
        attention = positions < lengths[:, None]
        special = ~attention | (positions == 0) | (positions == (lengths - 1)[:, None])
        batch = {"codes": codes, "attention_mask": attention.long(), "special_mask": special}
        for key, fill in (("token_type_ids", 0), ("labels", -100)):
            if key in items[0] and np.ndim(items[0][key]) == 1:
                padded = torch.full((len(items), longest), fill, dtype=torch.long)
                for row, item in enumerate(items):
                    padded[row, : lengths[row]] = torch.tensor(np.asarray(item[key]))
                batch[key] = padded
        if "index" in items[0]:
            batch["index"] = torch.as_tensor(np.asarray([item["index"] for item in items]), dtype=torch.long)
        return batch


class TaskCollator(PadCollator):
    """Pads codes, segment ids and the row ``index``; adds ``labels`` (class ids, or float scores)."""

    def __init__(self, text_encoder: TextEncoder, regression: bool) -> None:
        super().__init__(text_encoder)
        self.label_dtype = torch.float32 if regression else torch.long

    def __call__(self, items: list[dict]) -> dict[str, Tensor]:
        batch = super().__call__([{k: v for k, v in item.items() if k != "labels"} for item in items])
        if "labels" in items[0]:  # not in the texts a model predicts on
            batch["labels"] = torch.as_tensor(np.asarray([item["labels"] for item in items]), dtype=self.label_dtype)
        return batch


class FillMaskCollator(PadCollator):
    """Pads the texts a MaskedLM fills in and marks their mask positions (``fill``)."""

    def __init__(self, text_encoder: TextEncoder) -> None:
        super().__init__(text_encoder)
        self.mask_code = torch.as_tensor(text_encoder.special_code("mask"))

    def __call__(self, items: list[dict]) -> dict[str, Tensor]:
        batch = super().__call__(items)
        batch["fill"] = (batch["codes"] == self.mask_code) & batch["attention_mask"].bool()
        return batch


#: Padding value of each batch key when rows of different lengths are stacked (``codes``: the pad code).
_FILLS = {"attention_mask": 0, "special_mask": True, "labels": -100, "token_type_ids": 0}


class CorruptingCollator(PadCollator):
    """A pre-training objective's corruption of padded batches (:meth:`corrupt`).

    Training draws it from the global random state. With ``seed`` (the data modules' validation
    batches), each block's corruption is drawn from ``(seed, index)`` alone, ``index`` being the
    block's row number: the figures are then the same on any number of devices, in any batch
    composition and on every run, and a block a ``DistributedSampler`` repeats is corrupted the same.
    """

    def __init__(self, text_encoder: TextEncoder, seed: int | None = None) -> None:
        super().__init__(text_encoder)
        self.seed = seed

    def corrupt(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        raise NotImplementedError

    def __call__(self, items: list[dict]) -> dict[str, Tensor]:
        if self.seed is None or "index" not in items[0]:
            return self.corrupt(super().__call__(items))
        rows = []
        for item in items:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(row_seed(self.seed, int(item["index"])))
                rows.append(self.corrupt(super().__call__([item])))
        return self._stack(rows)

    def _stack(self, rows: list[dict[str, Tensor]]) -> dict[str, Tensor]:
        longest = max(row["codes"].shape[1] for row in rows)
        batch = {}
        for key, first in rows[0].items():
            if first.dim() < 2:
                batch[key] = torch.cat([row[key] for row in rows])
                continue
            fill = self.pad_code if key == "codes" else _FILLS[key]
            padded = [torch.cat([row[key], fill_like(row[key], longest, fill)], dim=1) for row in rows]
            batch[key] = torch.cat(padded)
        return batch


def fill_like(rows: Tensor, length: int, fill) -> Tensor:
    """The ``(B, length - L, ...)`` padding of ``(B, L, ...)`` rows, every position ``fill``."""
    shape = (rows.shape[0], length - rows.shape[1], *rows.shape[2:])
    return torch.as_tensor(fill, dtype=rows.dtype).expand(shape)


def row_seed(seed: int, index: int) -> int:
    """A 63-bit seed of ``(seed, index)``, the same on every machine (no Python ``hash()``)."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class MaskedLMCollator(CorruptingCollator):
    """RoBERTa masking: ``mask_prob`` of the non-special positions are predicted; of those 80% become
    ``mask``, 10% a random code, 10% stay. ``labels`` hold the original code there, -100 elsewhere, and
    ``predicted`` the flat index (row x length + position) of each predicted position, found here on the CPU so that
    the model gathers them without reading a mask's count back from the device (a GPU sync).

    Args:
        text_encoder: gives the pad and mask codes.
        random_codes: draws random codes of a given shape (the strategy's ``code_sampler()``).
        mask_prob: share of positions to predict (0.15).
        seed: draw each block's masking from ``(seed, index)`` (see :class:`CorruptingCollator`).
    """

    def __init__(
        self,
        text_encoder: TextEncoder,
        random_codes: Callable[[tuple[int, ...]], Tensor],
        mask_prob: float = 0.15,
        seed: int | None = None,
    ) -> None:
        super().__init__(text_encoder, seed)
        if not 0.0 < mask_prob < 1.0:
            raise ConfigError(f"mask_prob={mask_prob} must lie strictly between 0 and 1")
        self.mask_code = torch.as_tensor(text_encoder.special_code("mask"))
        self.random_codes = random_codes
        self.mask_prob = mask_prob

    def corrupt(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        codes, special = batch["codes"], batch["special_mask"]
        if codes.dim() != 2:
            raise ConfigError("masked LM needs one vocabulary id per token; hash strategies use Shuffle+Random")
        chosen = (torch.rand(codes.shape) < self.mask_prob) & ~special
        labels = torch.where(chosen, codes, torch.full_like(codes, -100))
        action = torch.rand(codes.shape)
        to_mask = chosen & (action < 0.8)
        to_random = chosen & (action >= 0.8) & (action < 0.9)
        codes = torch.where(to_mask, self.mask_code, codes)
        codes[to_random] = self.random_codes((int(to_random.sum()),)).to(codes.dtype)
        batch["codes"], batch["labels"] = codes, labels
        return batch

    def __call__(self, items: list[dict]) -> dict[str, Tensor]:
        batch = super().__call__(items)
        batch["predicted"] = (batch["labels"] != -100).flatten().nonzero()[:, 0]
        return batch


#: Shuffle+Random labels (Yamaguchi et al., 2021); specials and padding get -100.
ORIGINAL, SHUFFLED, RANDOM = 0, 1, 2


class ShuffleRandomCollator(CorruptingCollator):
    """Shuffle+Random corruption: each non-special position is shuffled with probability ``prob``
    (one random permutation of the positions per batch); of the others, each becomes a random code
    with probability ``prob``. A special token shuffled into a position is put back (the label stays
    "shuffled"). ``labels``: 0 original, 1 shuffled, 2 random, -100 special or padding.

    Random codes come from the strategy's ``code_sampler`` (vocabulary ids; random buckets or bits
    for hash strategies), so the corruption works in any strategy's code space.

    Args:
        text_encoder: gives the pad code.
        random_codes: draws random codes of a given shape (the strategy's ``code_sampler``).
        prob: the shuffle and the random probability (0.10).
        seed: draw each block's corruption from ``(seed, index)`` (see :class:`CorruptingCollator`;
            the permutation is then one per block rather than one per batch).
    """

    def __init__(
        self,
        text_encoder: TextEncoder,
        random_codes: Callable[[tuple[int, ...]], Tensor],
        prob: float = 0.10,
        seed: int | None = None,
    ) -> None:
        super().__init__(text_encoder, seed)
        if not 0.0 < prob < 1.0:
            raise ConfigError(f"prob={prob} must lie strictly between 0 and 1")
        self.random_codes = random_codes
        self.prob = prob

    def corrupt(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        codes, special = batch["codes"], batch["special_mask"]
        length = codes.shape[1]
        shuffled = (torch.rand(special.shape) < self.prob) & ~special
        randomised = (torch.rand(special.shape) < self.prob) & ~special & ~shuffled
        order = torch.randperm(length)
        moved = shuffled & ~special[:, order]  # a special moved in is put back
        out = codes.clone()
        out[moved] = codes[:, order][moved]
        out[randomised] = self.random_codes((int(randomised.sum()),)).to(codes.dtype)
        labels = torch.full(special.shape, ORIGINAL, dtype=torch.long)
        labels[shuffled], labels[randomised], labels[special] = SHUFFLED, RANDOM, -100
        batch["codes"], batch["labels"] = out, labels
        return batch
