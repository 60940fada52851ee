"""Checkpoints: read without running code, refused with the reason, old ones still load, and every way a model
starts trains with dropout on."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from lit_embed.checkpoints.format import model_differences, plain, read_checkpoint, recorded_model
from lit_embed.commands import main
from lit_embed.errors import CheckpointError, MissingFileError
from tests.helpers import CONFIGS, REPO

LEGACY = REPO / "tests" / "data" / "main-1efeeea"
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


class Marker:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def test_a_crafted_checkpoint_is_refused_naming_the_type_and_runs_nothing(tmp_path):
    torch.save({"state_dict": {}, "hyper_parameters": {"x": Marker(tmp_path / "ran")}}, tmp_path / "evil.ckpt")
    with pytest.raises(CheckpointError, match=r"holds a Python object of type posix\.system.*convert --trust"):
        read_checkpoint(tmp_path / "evil.ckpt")
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", r"is empty \(0 bytes\)"), (b"\x80\x04junk", "is (truncated or corrupt|not a readable checkpoint)"), (None, "does not exist")],
    ids=["empty", "junk", "missing"],
)
def test_unreadable_checkpoints_are_refused_naming_the_file(content, message, tmp_path):
    path = tmp_path / "bad.ckpt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises((CheckpointError, MissingFileError), match=message):
        read_checkpoint(path)


def test_the_allow_list_is_empty_every_checkpoint_is_plain_data():
    """lit-embed writes only tensors and plain data, so weights_only needs no allowed class of its own."""
    assert not [g for g in torch.serialization.get_safe_globals() if "lit_embed" in getattr(g, "__module__", "")]
    for path in LEGACY.rglob("*.ckpt"):
        read_checkpoint(path)


def test_convert_rewrites_a_trusted_checkpoint_as_plain_data(tmp_path):
    import numpy as np

    from lit_embed.commands.convert import main as convert_main
    from lit_embed.models.optim import OptimConfig

    torch.save({"state_dict": {"w": torch.ones(2)}, "hyper_parameters": {"optim": OptimConfig(lr=0.1), "x": np.arange(3)}},
               tmp_path / "old.ckpt")
    with pytest.raises(CheckpointError, match="OptimConfig"):
        read_checkpoint(tmp_path / "old.ckpt")
    with pytest.raises(SystemExit):  # --trust is required
        convert_main([str(tmp_path / "old.ckpt"), str(tmp_path / "new.ckpt")])
    assert convert_main(["--trust", str(tmp_path / "old.ckpt"), str(tmp_path / "new.ckpt")]) == 0
    new = read_checkpoint(tmp_path / "new.ckpt")
    assert new["hyper_parameters"]["optim"]["lr"] == 0.1 and torch.equal(new["hyper_parameters"]["x"], torch.arange(3))
    assert plain({"a": (1, Path("b"))}) == {"a": (1, "b")}


def test_differences_name_what_makes_another_model():
    recorded = read_checkpoint(LEGACY / "pretrain.ckpt")
    model = recorded_model(recorded)
    assert model_differences(model, json.loads(json.dumps(model))) == []
    other = json.loads(json.dumps(model))
    other["init_args"]["optim"]["lr"] = 1.0  # a training argument: not another model
    other["init_args"]["encoder"]["init_args"]["dropout"] = 0.0
    assert model_differences(model, other) == []
    other["init_args"]["embedding"]["init_args"]["num_tables"] = 4
    other["init_args"]["vocab_size"] = 50265
    assert model_differences(model, other) == [
        "model.embedding.num_tables: checkpoint 3, config 4", "model.vocab_size: checkpoint 30522, config 50265"]


# -- checkpoints written by main before the safe reader (tests/data/main-1efeeea) --------------------------------


def small(*extra: str) -> list[str]:
    return ["--model.init_args.encoder.init_args.hidden_size", "16", "--model.init_args.encoder.init_args.num_heads", "2",
            "--model.init_args.encoder.init_args.intermediate_size", "32", "--model.init_args.encoder.init_args.num_layers",
            "1", *QUIET, *extra]


def test_an_old_pretraining_checkpoint_starts_a_fine_tuning(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    probe = {"class_path": "tests.helpers.probes.ModeProbe", "init_args": {"out": str(tmp_path / "modes.json")}}
    assert main(["fit", "--config", str(CONFIGS / "demo_finetune.yaml"), *small(), "--model.init_args.checkpoint",
                 str(LEGACY / "pretrain.ckpt"), "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
                 "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1",
                 "--trainer.callbacks", json.dumps([probe])]) == 0
    check_dropout(tmp_path / "modes.json")


def test_an_old_fine_tuned_checkpoint_tests_and_resumes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["--config", str(CONFIGS / "demo_finetune.yaml"), *small(), "--trainer.limit_test_batches", "2"]
    assert main(["test", *args, "--ckpt_path", str(LEGACY / "finetune.ckpt")]) == 0
    results = json.loads((tmp_path / "runs/demo_finetune/version_0/results.json").read_text())
    assert "test/accuracy" in results["metrics"]
    assert main(["fit", *args, "--ckpt_path", str(LEGACY / "finetune.ckpt"), "--trainer.max_epochs", "2",
                 "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1"]) == 0


def loads_of(path: Path, monkeypatch) -> list[str]:
    """Every torch.load of ``path`` from now on (by name, or through the file object Lightning's loader opens)."""
    loads, real, target = [], torch.load, os.path.abspath(path)

    def load(f, *args, **kwargs):
        name = f if isinstance(f, (str, os.PathLike)) else getattr(f, "path", getattr(f, "name", None))
        if isinstance(name, (str, os.PathLike)) and os.path.abspath(name) == target:
            loads.append(target)
        return real(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    return loads


@pytest.mark.parametrize("command", ["test", "fit"])
def test_a_command_reads_its_ckpt_path_once(command, tmp_path, monkeypatch):
    """--ckpt_path is read once, checked, and handed to Lightning (which read it a second time, and LightningCLI
    a third to apply the model it records over the config)."""
    monkeypatch.chdir(tmp_path)
    ckpt = tmp_path / "finetune.ckpt"
    shutil.copy(LEGACY / "finetune.ckpt", ckpt)
    loads = loads_of(ckpt, monkeypatch)
    args = ["--config", str(CONFIGS / "demo_finetune.yaml"), *small(), "--trainer.limit_test_batches", "1",
            "--trainer.limit_val_batches", "1", "--trainer.limit_train_batches", "2", "--trainer.max_epochs", "2"]
    assert main([command, *args, "--ckpt_path", str(ckpt)]) == 0
    assert len(loads) == 1


@pytest.mark.parametrize("model", ["given", "taken"])
def test_a_fine_tuning_reads_its_start_checkpoint_once(model, tmp_path, monkeypatch):
    """model.init_args.checkpoint is read once, where fit assembles the run, whether the config gives the backbone,
    strategy and vocabulary or takes them from it (the model read it in its constructor, then again when fitting
    started); the run records which file it took."""
    monkeypatch.chdir(tmp_path)
    start = tmp_path / "pretrain.ckpt"
    shutil.copy(LEGACY / "pretrain.ckpt", start)
    loads = loads_of(start, monkeypatch)
    sizes = small() if model == "given" else [*QUIET, *[a for key in ("encoder", "embedding", "vocab_size")
                                                       for a in (f"--model.init_args.{key}", "null")]]
    assert main(["fit", "--config", str(CONFIGS / "demo_finetune.yaml"), *sizes, "--model.init_args.checkpoint", str(start),
                 "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
                 "--trainer.limit_test_batches", "1"]) == 0
    assert len(loads) == 1
    run = tmp_path / "runs/demo_finetune/version_0"
    results = json.loads((run / "results.json").read_text())
    assert [(t["what"], t["file"]) for t in results["checkpoints_taken"]] == [("pre-training checkpoint", str(start))]
    finetuned = torch.load(next((run / "checkpoints").glob("*.ckpt")), map_location="cpu", weights_only=False)
    assert finetuned["hyper_parameters"]["checkpoint"] == str(start)
    assert finetuned["hyper_parameters"]["encoder"]["init_args"]["hidden_size"] == 16  # rebuilds without the start file
    assert finetuned["hyper_parameters"]["trained_tokenizer"] == "all-MiniLM-L6-v2"


def test_an_old_compressed_model_tests_and_fine_tunes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "compressed"
    shutil.copytree(LEGACY / "compressed", folder)
    config, model = str(folder / "config.yaml"), str(folder / "model.ckpt")
    assert main(["test", "--config", config, "--ckpt_path", model, "--trainer.limit_test_batches", "2", *QUIET]) == 0
    probe = {"class_path": "tests.helpers.probes.ModeProbe", "init_args": {"out": str(tmp_path / "modes.json")}}
    assert main(["fit", "--config", config, "--model.init_args.checkpoint", model, "--trainer.max_epochs", "1",
                 "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1",
                 "--trainer.callbacks", json.dumps([probe]), *QUIET]) == 0
    check_dropout(tmp_path / "modes.json")


def test_a_fine_tuned_model_rebuilt_from_its_checkpoint_keeps_its_own_weights(tmp_path, monkeypatch):
    """analyze, export and compress rebuild a fine-tuned model outside a trainer: the pre-training checkpoint it
    started from (recorded as runs/demo/checkpoints/last.ckpt, here another model's weights) is not loaded over its
    fine-tuned backbone and strategy when its text encoder is made."""
    from lit_embed.checkpoints.format import load_model

    monkeypatch.chdir(tmp_path)
    start = tmp_path / "runs/demo/checkpoints/last.ckpt"
    start.parent.mkdir(parents=True)
    shutil.copy(LEGACY / "pretrain.ckpt", start)
    model, checkpoint = load_model(LEGACY / "finetune.ckpt")
    assert model.checkpoint == "runs/demo/checkpoints/last.ckpt"
    model.text_encoder(model.expected_tokenizer)
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in checkpoint["state_dict"].items())
    start.unlink()  # and without the starting point at all
    assert main(["analyze", "--ckpt", str(LEGACY / "finetune.ckpt"), "--max-texts", "10", "--points", "200",
                 "--out", str(tmp_path / "analysis")]) == 0  # not beside the checkpoint, in the repository


def test_fine_tuning_from_a_checkpoint_of_another_backbone_is_refused_naming_it(tmp_path, monkeypatch, capsys):
    """A config that sets the backbone or strategy otherwise than the pre-training did (here 4 heads where it
    had 2: the shapes agree) would record a model its weights are not."""
    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", str(CONFIGS / "demo_finetune.yaml"), *small("--model.init_args.encoder.init_args.num_heads", "4"),
            "--model.init_args.checkpoint", str(LEGACY / "pretrain.ckpt"), "--trainer.max_epochs", "1",
            "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "1"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "pre-trained as another model" in err and "model.encoder.num_heads: checkpoint 2, config 4" in err, err
    assert not list(tmp_path.rglob("*.ckpt"))


def test_analyze_reads_an_old_checkpoint_and_writes_no_stray_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copy(LEGACY / "pretrain.ckpt", tmp_path / "pretrain.ckpt")
    assert main(["analyze", "--ckpt", "pretrain.ckpt", "--max-texts", "10", "--points", "200"]) == 0
    assert "no TensorBoard run folder" in capsys.readouterr().out
    assert not list(tmp_path.rglob("events.out.tfevents*"))  # TensorBoard would show it as a run of its own
    assert (tmp_path / "analysis" / "analysis.json").is_file()


# -- every way a model starts trains with dropout on, and evaluates with it off -----------------------------------


def check_dropout(path: Path) -> None:
    seen = json.loads(path.read_text())
    assert seen["train"] and all(on == total > 0 for on, total in seen["train"]), seen["train"]
    assert seen["val"] and all(on == 0 for on, _ in seen["val"]), seen["val"]


@pytest.mark.parametrize("start", ["scratch", "huggingface"])
def test_every_dropout_trains_whatever_the_model_starts_from(start, tmp_path, monkeypatch, minilm_path):
    """Lightning keeps each module's mode, and from_pretrained returns eval mode: the papers' dropout of 0.1
    must be on in every training step (the lit-embed checkpoint and compressed starts: the tests above)."""
    monkeypatch.chdir(tmp_path)
    probe = {"class_path": "tests.helpers.probes.ModeProbe", "init_args": {"out": str(tmp_path / "modes.json")}}
    config = {"scratch": CONFIGS / "demo.yaml", "huggingface": CONFIGS / "experiments/sparse_coding/minilm_topics.yaml"}[start]
    assert main(["fit", "--config", str(config), "--trainer.max_steps", "2", "--trainer.val_check_interval", "2",
                 "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1", "--data.init_args.batch_size", "4",
                 "--trainer.callbacks", json.dumps([probe]), *QUIET]) == 0
    check_dropout(tmp_path / "modes.json")


def test_fine_tuning_needs_only_the_checkpoint_and_the_task(tmp_path, monkeypatch):
    """Like from_pretrained: the backbone, strategy and vocabulary come from the checkpoint (an old one here),
    and the fine-tuned checkpoint records them, so testing it needs no other file."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(LEGACY / "pretrain.ckpt", tmp_path / "pretrain.ckpt")
    (tmp_path / "finetune.yaml").write_text(
        "model:\n  class_path: lit_embed.models.SequenceClassifier\n  init_args:\n    task: topics\n"
        "    checkpoint: pretrain.ckpt\n"
        "data:\n  class_path: lit_embed.data.TaskDataModule\n  init_args:\n    task: topics\n    batch_size: 8\n"
        "trainer:\n  max_epochs: 1\n  limit_train_batches: 2\n  limit_val_batches: 1\n  limit_test_batches: 1\n"
    )
    assert main(["fit", "--config", "finetune.yaml", *QUIET]) == 0
    finetuned = next((tmp_path / "runs/finetune/version_0/checkpoints").glob("*.ckpt"))
    recorded = read_checkpoint(finetuned)["lit_embed"]["model"]["init_args"]
    assert recorded["embedding"]["class_path"] == "lit_embed.embeddings.SubspaceEmbedding"
    assert recorded["encoder"]["init_args"]["hidden_size"] == 16 and recorded["vocab_size"] == 30522
    (tmp_path / "pretrain.ckpt").unlink()
    assert main(["test", "--config", "finetune.yaml", "--ckpt_path", str(finetuned), *QUIET]) == 0
