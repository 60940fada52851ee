"""Weight initialisation as the HashFormers authors' code does it; their paper says nothing about it.

Their ``RobertaPreTrainedModel._init_weights`` (HUIYINXUE/hashformer, ``src/model/model.py`` lines 760-777), which
``init_weights`` applies to every module of a model (backbone, hash layers and task heads alike), draws every weight
of an ``nn.Linear``, ``nn.Embedding`` and of their hash layers ``DropoutLinear`` and ``DropoutLinearCosNorm`` from a
normal of std ``initializer_range`` (0.02) cut at two standard deviations (``a=-2 * std, b=2 * std``), zeroes the
Linear biases and sets LayerNorm to 1 and 0. Padding rows are not zeroed (the zeroing is commented out, lines
769-772): an ``nn.Embedding``'s padding row keeps its random start, as it gets no gradient. Pool's chunk weights, a
bare parameter, get the same truncated normal (line 302).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

#: BERT's and RoBERTa's ``initializer_range``, the authors' std.
STD = 0.02


def truncated_normal_(tensor: Tensor, std: float = STD) -> Tensor:
    """Fill ``tensor`` from a normal of mean 0 and ``std`` cut at +-2 ``std`` (values beyond are redrawn, so the
    result's standard deviation is 0.88 ``std``).

    Only the values beyond are redrawn: PyTorch's ``trunc_normal_`` (2.13) draws a whole tensor again for every
    round of them, about six rounds for a 50265 x 768 table, which made this most of a BERT-base model's build."""
    if tensor.is_meta:  # a model built only to be counted
        return tensor
    bound = 2 * std
    with torch.no_grad():
        flat = tensor.reshape(-1)  # a view where the tensor is contiguous, else a copy written back below
        flat.normal_(0.0, std)
        outside = (flat.abs() > bound).nonzero().squeeze(1)
        while outside.numel():
            redrawn = flat.new_empty(outside.numel()).normal_(0.0, std)
            flat[outside] = redrawn
            outside = outside[redrawn.abs() > bound]
        if flat.data_ptr() != tensor.data_ptr():
            tensor.copy_(flat.view_as(tensor))
    return tensor


def truncated_normal_init(module: nn.Module, std: float = STD) -> None:
    """Initialise every weight of ``module`` as the authors' ``_init_weights``: each matrix (the weights of Linear,
    Embedding and hash layers) truncated normal, Linear biases zero, LayerNorm weights 1 and biases 0."""
    with torch.no_grad():
        for part in module.modules():
            if isinstance(part, nn.Linear) and part.bias is not None:
                part.bias.zero_()
            elif isinstance(part, nn.LayerNorm) and part.elementwise_affine:
                part.weight.fill_(1.0)
                if part.bias is not None:
                    part.bias.zero_()
        for parameter in module.parameters():
            if parameter.dim() >= 2:
                truncated_normal_(parameter, std)


__all__ = ["STD", "truncated_normal_", "truncated_normal_init"]
