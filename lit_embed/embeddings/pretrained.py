"""Read a pretrained input-embedding matrix from a HuggingFace model or a matrix file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from lit_embed.errors import ConfigError, MissingFileError
from lit_embed.hub import loading_pretrained, resolve_pretrained
from lit_embed.storage.plain_data import load_plain

MATRIX_SUFFIXES = (".pt", ".pth", ".npy", ".safetensors")


def load_embedding_matrix(source: str) -> torch.Tensor:
    """The ``(vocab_size, dim)`` float matrix named by ``source``.

    ``source`` is a matrix file (``.pt``/``.pth`` holding a tensor or a state dict, ``.npy``,
    ``.safetensors``), or a HuggingFace model name or folder whose input embeddings are taken.
    """
    path = Path(source).expanduser()
    if path.suffix in MATRIX_SUFFIXES:
        if not path.is_file():
            raise MissingFileError(f"embedding matrix file {source!r} does not exist: check the path")
        return _as_matrix(_read_file(path), source)
    from transformers import AutoModel

    where = resolve_pretrained(source, what="pretrained model")
    with loading_pretrained(source, "pretrained model"):
        model = AutoModel.from_pretrained(where, trust_remote_code=False)  # a model's own code never runs
    return model.get_input_embeddings().weight.detach().float().clone()


def _read_file(path: Path):
    """The file's tensor (or state dict); nothing in it runs, and a file that cannot be read so is refused by name."""
    if path.suffix in (".pt", ".pth"):
        return load_plain(path, "embedding matrix file")
    try:
        if path.suffix == ".npy":
            return torch.from_numpy(np.load(path))  # allow_pickle=False: an object array is refused, not unpickled
        from safetensors.torch import load_file

        return load_file(str(path))
    except Exception as error:  # whatever a damaged or foreign file makes the reader trip over
        reason = str(error).splitlines()[0][:160] if str(error) else type(error).__name__
        raise ConfigError(f"embedding matrix file {str(path)!r} cannot be read ({reason}): save the (vocab_size, dim) "
                          f"matrix of numbers again") from None


def _as_matrix(obj, source: str) -> torch.Tensor:
    """A 2-D tensor, or the one embedding matrix inside a state dict."""
    if isinstance(obj, dict):
        matrices = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor) and v.dim() == 2}
        named = {k: v for k, v in matrices.items() if "word_embeddings" in k or "embed_tokens" in k}
        pick = named or matrices
        if len(pick) != 1:
            raise ConfigError(
                f"{source!r} holds {len(pick)} candidate matrices ({sorted(pick)[:5]}): save the single "
                f"(vocab_size, dim) embedding tensor instead"
            )
        obj = next(iter(pick.values()))
    if not isinstance(obj, torch.Tensor) or obj.dim() != 2:
        raise ConfigError(f"{source!r} does not hold a 2-D (vocab_size, dim) matrix")
    return obj.detach().float()
