"""Batching: padding of code sequences, and the corruption each pre-training objective needs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from lit_embed.embeddings.text import TextEncoder


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
            codes[row, : lengths[row]] = torch.as_tensor(np.asarray(item["codes"]))
        positions = torch.arange(longest)[None, :]
        attention = positions < lengths[:, None]
        special = ~attention | (positions == 0) | (positions == (lengths - 1)[:, None])
        batch = {"codes": codes, "attention_mask": attention.long(), "special_mask": special}
        for key, fill in (("token_type_ids", 0), ("labels", -100)):
            if key in items[0] and np.ndim(items[0][key]) == 1:
                padded = torch.full((len(items), longest), fill, dtype=torch.long)
                for row, item in enumerate(items):
                    padded[row, : lengths[row]] = torch.as_tensor(np.asarray(item[key]))
                batch[key] = padded
        return batch


class MaskedLMCollator(PadCollator):
    """RoBERTa masking: ``mask_prob`` of the non-special positions are predicted; of those 80% become
    ``mask``, 10% a random code, 10% stay. ``labels`` hold the original code there, -100 elsewhere.

    Args:
        text_encoder: gives the pad and mask codes.
        random_codes: draws random codes of a given shape (the strategy's ``random_codes``).
        mask_prob: share of positions to predict (0.15).
    """

    def __init__(
        self,
        text_encoder: TextEncoder,
        random_codes: Callable[[tuple[int, ...]], Tensor],
        mask_prob: float = 0.15,
    ) -> None:
        super().__init__(text_encoder)
        if not 0.0 < mask_prob < 1.0:
            raise ValueError(f"mask_prob={mask_prob} must lie strictly between 0 and 1")
        self.mask_code = torch.as_tensor(text_encoder.special_code("mask"))
        self.random_codes = random_codes
        self.mask_prob = mask_prob

    def __call__(self, items: list[dict]) -> dict[str, Tensor]:
        batch = super().__call__(items)
        codes, special = batch["codes"], batch["special_mask"]
        if codes.dim() != 2:
            raise ValueError("masked LM needs one vocabulary id per token; hash strategies use Shuffle+Random")
        chosen = (torch.rand(codes.shape) < self.mask_prob) & ~special
        labels = torch.where(chosen, codes, torch.full_like(codes, -100))
        action = torch.rand(codes.shape)
        to_mask = chosen & (action < 0.8)
        to_random = chosen & (action >= 0.8) & (action < 0.9)
        codes = torch.where(to_mask, self.mask_code, codes)
        codes[to_random] = self.random_codes((int(to_random.sum()),)).to(codes.dtype)
        batch["codes"], batch["labels"] = codes, labels
        return batch


#: Shuffle+Random labels (Yamaguchi et al., 2021); specials and padding get -100.
ORIGINAL, SHUFFLED, RANDOM = 0, 1, 2


class ShuffleRandomCollator(PadCollator):
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
    """

    def __init__(
        self, text_encoder: TextEncoder, random_codes: Callable[[tuple[int, ...]], Tensor], prob: float = 0.10
    ) -> None:
        super().__init__(text_encoder)
        if not 0.0 < prob < 1.0:
            raise ValueError(f"prob={prob} must lie strictly between 0 and 1")
        self.random_codes = random_codes
        self.prob = prob

    def __call__(self, items: list[dict]) -> dict[str, Tensor]:
        batch = super().__call__(items)
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
