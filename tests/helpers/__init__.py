"""What several test modules share: paths, a tiny encoder, the offline switch. Test modules import from
here (and from the modules beside this one), never from each other."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"


def go_offline(monkeypatch, tmp_path_factory) -> None:
    """No hub access, and caches that do not leak between test sessions."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    cache = tmp_path_factory.getbasetemp() / "cache"
    monkeypatch.setenv("LIT_EMBED_CACHE", str(cache / "lit_embed"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache / "datasets"))


def tiny_encoder(hidden: int = 32, **kwargs):
    """A one-layer RoBERTa-shaped encoder that builds in milliseconds."""
    from lit_embed.models import Encoder

    return Encoder(hidden_size=hidden, num_layers=1, num_heads=2, intermediate_size=64, max_position_embeddings=66, **kwargs)


#: A one-layer CANINE from its config (google/canine-c is on the hub), as a ``--model.init_args.encoder`` value.
TINY_CANINE = ('{"class_path": "lit_embed.models.Encoder", "init_args": {"arch": "canine", "hidden_size": 32, '
               '"num_layers": 1, "num_heads": 2, "intermediate_size": 64, "max_position_embeddings": 256, "pretrained": null, '
               '"trained_positions": null}}')
#: CANINE's hash tables at TINY_CANINE's size, counted as they are.
TINY_CANINE_TABLES = ('{"class_path": "lit_embed.embeddings.CanineHashEmbedding", "init_args": {"num_buckets": 97, '
                      '"counted_buckets": null}}')


__all__ = ["CONFIGS", "REPO", "TINY_CANINE", "TINY_CANINE_TABLES", "go_offline", "tiny_encoder"]
