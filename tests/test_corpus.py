"""The pre-training corpus: local files of every type, blocks, caching, and bad input."""

from __future__ import annotations

import json

import pytest

from lit_embed.cli import main
from lit_embed.data.corpus import CorpusDataModule
from tests.helpers import CONFIGS

TEXTS = [f"the {animal} number {i} crosses the river at night ." for i in range(60) for animal in ("fox", "owl")]


def write(tmp_path, kind: str):
    path = tmp_path / f"corpus.{kind}"
    if kind == "txt":
        path.write_text("\n".join(TEXTS) + "\n")
    elif kind == "jsonl":
        path.write_text("\n".join(json.dumps({"body": t, "id": i}) for i, t in enumerate(TEXTS)) + "\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"body": TEXTS}), path)
    return path


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_local_files_become_wrapped_blocks(tmp_path, kind):
    column = "text" if kind == "txt" else "body"
    dm = CorpusDataModule("all-MiniLM-L6-v2", files=[str(write(tmp_path, kind))], text_column=column,
                          max_length=32, batch_size=4, val_size=0.1)
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["codes"].shape == (4, 32)
    assert (batch["codes"][:, 0] == 101).all() and (batch["codes"][:, -1] == 102).all()  # [CLS] ... [SEP]


def test_blocks_are_reused_from_the_datasets_cache(tmp_path):
    path = write(tmp_path, "txt")
    first = CorpusDataModule("all-MiniLM-L6-v2", files=[str(path)], max_length=32, val_size=2)
    first.setup("fit")
    second = CorpusDataModule("all-MiniLM-L6-v2", files=[str(path)], max_length=32, val_size=2)
    second.setup("fit")
    assert first.train_set.cache_files and first.train_set.cache_files[0]["filename"]
    blocks_a = first._blocks(first.text_encoder_for())
    blocks_b = second._blocks(second.text_encoder_for())
    assert blocks_a._fingerprint == blocks_b._fingerprint


def test_streaming_reads_the_same_blocks(tmp_path):
    path = write(tmp_path, "txt")
    dm = CorpusDataModule("all-MiniLM-L6-v2", files=[str(path)], max_length=32, val_size=2, streaming=True, batch_size=2)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["codes"].shape == (2, 32)


def test_the_shipped_sample_corpus_resolves_by_name():
    dm = CorpusDataModule("all-MiniLM-L6-v2", files=["sample-corpus"], max_length=64, val_size=0.05)
    dm.setup("fit")
    assert len(dm.train_set) > 500


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"\n \n\t\n", "gives 0 block"), (b"fine line\nbad \xff\xfe bytes\n", r"corpus.txt:2: not valid UTF-8")],
)
def test_bad_corpora_are_refused_with_the_file_and_fix(tmp_path, content, message):
    (tmp_path / "corpus.txt").write_bytes(content)
    dm = CorpusDataModule("all-MiniLM-L6-v2", files=[str(tmp_path / "corpus.txt")], max_length=32)
    with pytest.raises(ValueError, match=message):
        dm.setup("fit")


def test_missing_column_and_file_are_named(tmp_path):
    path = write(tmp_path, "jsonl")
    with pytest.raises(ValueError, match="no column 'text'.*set data.text_column"):
        CorpusDataModule("all-MiniLM-L6-v2", files=[str(path)]).setup("fit")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        CorpusDataModule("all-MiniLM-L6-v2", files=[str(tmp_path / "nope.txt")]).setup("fit")
    with pytest.raises(ValueError, match="the corpus is empty"):
        CorpusDataModule("all-MiniLM-L6-v2")


def test_offline_hub_names_say_how_to_use_local_files(tmp_path):
    with pytest.raises(OSError, match="files:"):
        CorpusDataModule("all-MiniLM-L6-v2", datasets=["no-such-org/no-such-corpus"]).setup("fit")
    with pytest.raises(OSError, match="local folder"):
        CorpusDataModule("no-such-org/no-such-tokenizer", files=["sample-corpus"]).setup("fit")


def fit_demo(tmp_path, monkeypatch, *extra):
    monkeypatch.chdir(tmp_path)
    return main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--trainer.max_steps", "2", *extra])


def test_block_longer_than_the_backbone_fails_before_any_checkpoint(tmp_path, monkeypatch, capsys):
    assert fit_demo(tmp_path, monkeypatch, "--data.init_args.max_length", "512") == 2
    assert "max_length=512 exceeds the backbone's 128 positions" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.ckpt"))


def test_empty_corpus_fails_before_any_checkpoint(tmp_path, monkeypatch, capsys):
    (tmp_path / "empty.txt").write_text("\n\n")
    assert fit_demo(tmp_path, monkeypatch, "--data.init_args.files", f"[{tmp_path / 'empty.txt'}]") == 2
    assert "gives 0 block(s)" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.ckpt"))


def test_unreachable_cluster_source_fails_before_any_checkpoint(tmp_path, monkeypatch, capsys):
    source = "--model.init_args.embedding.init_args.assignment"
    args = [source, "lit_embed.embeddings.ClusterAssignment", f"{source}.source", "no-such-org/no-model"]
    assert fit_demo(tmp_path, monkeypatch, *args) == 2
    assert "HF_HUB_OFFLINE" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.ckpt"))


def test_cluster_matrix_of_another_vocabulary_fails_before_any_checkpoint(tmp_path, monkeypatch, capsys):
    import numpy as np

    np.save(tmp_path / "other.npy", np.zeros((1000, 8), dtype=np.float32))
    source = "--model.init_args.embedding.init_args.assignment"
    args = [source, "lit_embed.embeddings.ClusterAssignment", f"{source}.source", str(tmp_path / "other.npy")]
    assert fit_demo(tmp_path, monkeypatch, *args) == 2
    assert "has 1000 rows but the vocabulary has 30522 tokens" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.ckpt"))


def test_the_shipped_corpus_is_what_the_generator_writes():
    import subprocess
    import sys

    from tests.helpers import REPO

    done = subprocess.run([sys.executable, str(REPO / "tools" / "make_sample_corpus.py"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_predict_on_a_pretraining_corpus_says_what_predict_runs(tmp_path):
    from lit_embed.errors import ConfigError

    data = CorpusDataModule("all-MiniLM-L6-v2", files=["sample-corpus"])
    with pytest.raises(ConfigError, match="runs a fine-tuned model .*fill-mask is not available yet"):
        data.predict_dataloader()
