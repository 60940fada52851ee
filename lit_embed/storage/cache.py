"""lit-embed's cache of what it computes once: a cluster assignment's codes (and the commands' help:
:mod:`lit_embed.commands.helptext`), under ``$LIT_EMBED_CACHE`` (default ``~/.cache/lit_embed``).

A cached file is safetensors (tensors and a header of strings: nothing in it runs when it is read), written
atomically with the key it was computed for and a digest of its content, and read back only when it is exactly
that: one array of the dtype and shape asked for, under its own key, unchanged. Anything else (damaged,
truncated, another key's, another format such as ``.npy``, ``.npz`` or a pickle, edited) is computed again:
never an error, never unpickled. Strategies reach this module by import, so an export carries none of it.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from lit_embed.storage.files import atomic_writer

if TYPE_CHECKING:  # numpy is imported where arrays are read or written: the help cache reads the folder alone
    import numpy as np

log = logging.getLogger(__name__)

#: What the header of a cached array says it is (changed if the layout does).
FORMAT = "lit-embed cached codes 1"
NAME = "codes"


def cache_folder(cache_dir: str | None = None) -> Path:
    """``cache_dir``, else ``$LIT_EMBED_CACHE``, else ``~/.cache/lit_embed``."""
    return Path(cache_dir or os.environ.get("LIT_EMBED_CACHE", "~/.cache/lit_embed")).expanduser()


def read_codes(path: Path, key: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """The int64 array of ``shape`` that :func:`write_codes` cached at ``path`` for ``key``; ``None`` (compute it
    again) for anything else."""
    if not path.is_file():
        return None
    import numpy as np
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np") as handle:
            meta, names = handle.metadata() or {}, list(handle.keys())
            codes = handle.get_tensor(NAME) if names == [NAME] else None
    except Exception:  # whatever a damaged or foreign file makes the reader trip over
        meta, codes = {}, None
    exact = (codes is not None and codes.dtype == np.int64 and codes.shape == tuple(shape)
             and meta == {"format": FORMAT, "key": key, "sha256": _digest(codes)})
    if not exact:
        log.warning("ignoring %s: not the cached codes lit-embed wrote for this key; computing them again", path)
        return None
    return codes


def write_codes(path: Path, key: str, codes: np.ndarray) -> None:
    """Cache ``codes`` (as int64) at ``path`` for ``key``, atomically: readers see the whole file or none."""
    import numpy as np
    from safetensors.numpy import save

    codes = np.ascontiguousarray(codes, dtype=np.int64)
    content = save({NAME: codes}, metadata={"format": FORMAT, "key": key, "sha256": _digest(codes)})
    with atomic_writer(path) as handle:
        handle.write(content)


def _digest(codes: np.ndarray) -> str:
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(codes).tobytes()).hexdigest()
