"""The pre-training corpus: local files of every type, blocks, caching, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_embed.commands import main
from lit_embed.data.corpus import CorpusDataModule
from lit_embed.hub import resolve_pretrained
from lit_embed.interfaces import wire
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


def _checkpoint(run: Path) -> Path:
    return next((run / "checkpoints").glob("*.ckpt"))


def _predict_fills(run: Path, out: Path, *extra: str) -> int:
    return main(["predict", "--config", str(CONFIGS / "demo.yaml"), "--ckpt_path", str(_checkpoint(run)),
                 "--output", str(out / "fill"), "--trainer.enable_progress_bar", "false", *extra])


def test_predict_fills_in_masks_with_a_masked_lm(demo_runs, tmp_path):
    """lit-embed predict on a MaskedLM checkpoint: the top-k tokens of every mask, as the model scores them."""
    import torch
    from transformers import AutoTokenizer

    from lit_embed.checkpoints.format import load_model

    texts = tmp_path / "masks.txt"
    texts.write_text("The cat sat on the [MASK].\nParis is the capital of <mask>, a <mask> city.\n")
    assert _predict_fills(demo_runs["subspace"], tmp_path, "--data.init_args.predict_input", str(texts),
                          "--data.init_args.top_k", "3") == 0
    rows = [json.loads(line) for line in (tmp_path / "fill" / "predictions.jsonl").read_text().splitlines()]
    assert [row["text"] for row in rows] == texts.read_text().splitlines()
    assert [len(row["fills"]) for row in rows] == [1, 2]
    results = json.loads((tmp_path / "fill" / "results.json").read_text())  # which model predicted
    ckpt = _checkpoint(demo_runs["subspace"])
    assert results["command"] == "predict" and {"what": "--ckpt_path checkpoint", "given": str(ckpt), "file": str(ckpt),
                                                "step": 10, "why": "the file given"} in results["checkpoints_taken"]
    module, checkpoint = load_model(_checkpoint(demo_runs["subspace"]))
    tokenizer = AutoTokenizer.from_pretrained(resolve_pretrained("all-MiniLM-L6-v2"))
    ids = tokenizer(["The cat sat on the [MASK]."], return_tensors="pt")["input_ids"]  # the tokenizer's own specials
    with torch.no_grad():
        hidden = module.eval().encode({"codes": ids, "attention_mask": torch.ones_like(ids)}).last_hidden_state
        probabilities = module.vocabulary_logits(hidden[ids == tokenizer.mask_token_id]).softmax(-1)[0]
    top = probabilities.topk(3)
    fills = rows[0]["fills"][0]
    assert [fill["id"] for fill in fills] == top.indices.tolist()
    assert [fill["token"] for fill in fills] == tokenizer.convert_ids_to_tokens(top.indices.tolist())
    assert [fill["p"] for fill in fills] == pytest.approx(top.values.tolist(), abs=1e-5)


def test_predict_on_a_corpus_refuses_texts_without_a_mask(demo_runs, tmp_path, capsys):
    texts = tmp_path / "plain.txt"
    texts.write_text("A text with a [MASK].\nA text without one.\n")
    assert _predict_fills(demo_runs["subspace"], tmp_path, "--data.init_args.predict_input", str(texts)) == 2
    assert "predict_input text 2 ('A text without one.') has no <mask> or [MASK] to fill in" in capsys.readouterr().err
    assert _predict_fills(demo_runs["subspace"], tmp_path) == 2
    assert "needs the texts to fill in: --data.init_args.predict_input FILE" in capsys.readouterr().err
    assert not (tmp_path / "fill").exists()  # a refused predict leaves no folder


def test_predict_on_a_corpus_refuses_a_model_that_does_not_predict_tokens():
    """Shuffle+Random scores no vocabulary: refused before its hasher is fitted on the corpus."""
    from types import SimpleNamespace

    from lit_embed.embeddings import HashProj
    from lit_embed.errors import ConfigError
    from lit_embed.models import ShuffleRandom
    from tests.helpers import tiny_encoder

    model = ShuffleRandom(tiny_encoder(16), embedding=HashProj)
    data = CorpusDataModule(files=["sample-corpus"], predict_input=["a <mask>"])
    wire(model, data)
    data.trainer = SimpleNamespace(state=SimpleNamespace(fn="predict"))
    with pytest.raises(ConfigError, match="fills in <mask> with a MaskedLM; ShuffleRandom does not predict tokens"):
        data.prepare_data()
    assert data.text_encoder is None
