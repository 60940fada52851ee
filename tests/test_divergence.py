"""A run that diverges stops, says where and why, exits 3, is marked ``diverged`` and is never taken for a model: a
non-finite loss (at once without a gradient scaler; under fp16's scaler only when it persists) and non-finite weights
at a save. Real ``lit-embed fit`` runs of the demo, a few steps each, in this process."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from lit_embed.callbacks.guard import SKIPPED_STEPS
from lit_embed.commands import main
from lit_embed.errors import CheckpointError, MissingFileError
from lit_embed.runs.folders import newest_checkpoint, start_checkpoint
from tests.helpers import CONFIGS

QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
#: fp16 mixed precision with a gradient scaler on the CPU: what configs/trainer/gpu.yaml does on a GPU.
FP16_SCALER = json.dumps({"class_path": "pytorch_lightning.plugins.precision.MixedPrecision", "init_args": {
    "precision": "16-mixed", "device": "cpu", "scaler": {"class_path": "torch.amp.GradScaler", "init_args": {"device": "cpu"}}}})


def fit(root: Path, steps: int, *extra: str, callbacks: list[dict] = ()) -> int:
    """The demo for ``steps`` steps under ``root/runs/demo``, validating only at the end; its exit status."""
    saved = [{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint", "init_args": {"save_last": True}},
             {"class_path": "lit_embed.callbacks.ResultsWriter"}, *callbacks]
    return main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--trainer.default_root_dir", str(root / "runs/demo"),
                 "--trainer.max_steps", str(steps), "--trainer.val_check_interval", str(steps),
                 "--trainer.limit_val_batches", "2", "--data.init_args.batch_size", "4", *QUIET,
                 "--trainer.callbacks", json.dumps(saved), *extra])


def nan_loss(**init_args) -> dict:
    return {"class_path": "tests.helpers.probes.NonFiniteLoss", "init_args": init_args}


def results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


def finite(checkpoint: Path) -> bool:
    state = torch.load(checkpoint, weights_only=True)["state_dict"]
    return all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())


def test_a_learning_rate_that_diverges_stops_the_run_which_no_command_then_takes(tmp_path, monkeypatch, capsys):
    """lr 1e9: NaN from the second step. Exit 3 naming the step and the learning rate; results.json diverged; no
    checkpoint of it; its run folder, its experiment folder and --ckpt_path last refused; report shows it apart."""
    monkeypatch.chdir(tmp_path)
    assert fit(tmp_path, 6, "--model.init_args.optim.lr", "1e9") == 3
    err = capsys.readouterr().err
    assert re.search(r"lit-embed: error: training diverged: the training loss was nan at step 2\. Likely cause: a "
                     r"learning rate too high \(it was [\d.e+]+ at this step: lower model\.init_args\.optim\.lr\)", err), err
    assert "Traceback" not in err
    run = tmp_path / "runs/demo/version_0"
    found = results(run)
    assert found["status"] == "diverged" and found["global_step"] == 6  # the losses are read before the validation
    assert found["detail"] == "the training loss was nan at step 2" and math.isnan(found["metrics"]["train/loss"])
    assert not list(run.rglob("*.ckpt"))  # nothing saved after the weights went bad
    with pytest.raises(MissingFileError, match=r"holds no finished run with a checkpoint \(runs: version_0 \(diverged\)\)"):
        start_checkpoint(tmp_path / "runs/demo")
    assert main(["report", str(run)]) == 0
    captured = capsys.readouterr()
    assert "left out 1 run(s) that did not complete" in captured.err
    assert "| diverged | the training loss was nan at step 2 |" in captured.out and "Pre-training" not in captured.out


def test_non_finite_weights_at_a_save_stop_the_run_before_the_checkpoint_is_written(tmp_path, monkeypatch, capsys):
    """A save at step 2 of weights that are not finite (the loss had not shown it yet): nothing written at step 2, and
    the checkpoints of step 1 (finite) are no model of the run: its folder is refused, by name."""
    monkeypatch.chdir(tmp_path)
    every_step = {"class_path": "pytorch_lightning.callbacks.ModelCheckpoint",
                  "init_args": {"every_n_train_steps": 1, "save_top_k": -1, "save_last": True, "filename": "{step}"}}
    bad = {"class_path": "tests.helpers.probes.NonFiniteWeights", "init_args": {"step": 2}}
    assert main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--trainer.max_steps", "4", "--trainer.val_check_interval",
                 "4", "--trainer.limit_val_batches", "2", "--data.init_args.batch_size", "4", *QUIET, "--trainer.callbacks",
                 json.dumps([every_step, {"class_path": "lit_embed.callbacks.ResultsWriter"}, bad])]) == 3
    assert "training diverged: its weights were not finite at the save of step 2" in capsys.readouterr().err
    run = tmp_path / "runs/demo/version_0"
    assert sorted(p.name for p in (run / "checkpoints").glob("*.ckpt")) == ["last.ckpt", "step=1.ckpt"]
    assert all(finite(p) and torch.load(p, weights_only=True)["global_step"] == 1 for p in (run / "checkpoints").glob("*.ckpt"))
    assert results(run)["status"] == "diverged"
    for given in (run, tmp_path / "runs/demo"):
        with pytest.raises((CheckpointError, MissingFileError), match=r"diverged"):
            start_checkpoint(given, "pre-training checkpoint")
    with pytest.raises(CheckpointError, match=r"--ckpt_path last: the newest checkpoint .* which diverged \(its weights"):
        newest_checkpoint(tmp_path / "runs/demo")
    assert start_checkpoint(run / "checkpoints/step=1.ckpt") == run / "checkpoints/step=1.ckpt"  # a file, knowingly


def test_a_non_finite_loss_read_at_a_save_stops_the_run_before_the_checkpoint_is_written(tmp_path, monkeypatch, capsys):
    """The losses are read from the device every CHECK_EVERY batches, and before each save: a checkpoint every step and
    a NaN loss at step 2 leave the checkpoints of step 1 only, and the run stops at step 2, not at the next read."""
    monkeypatch.chdir(tmp_path)
    every_step = {"class_path": "pytorch_lightning.callbacks.ModelCheckpoint",
                  "init_args": {"every_n_train_steps": 1, "save_top_k": -1, "save_last": True, "filename": "{step}"}}
    assert fit(tmp_path, 6, callbacks=[every_step, nan_loss(steps=[2])]) == 3
    assert "training diverged: the training loss was nan at step 2. Likely cause" in capsys.readouterr().err
    run = tmp_path / "runs/demo/version_0"
    assert results(run)["global_step"] == 2 and results(run)["status"] == "diverged"
    assert {p.name for p in (run / "checkpoints").glob("*.ckpt")} <= {"last.ckpt", "step=1.ckpt"}
    assert all(finite(p) and torch.load(p, weights_only=True)["global_step"] == 1 for p in run.rglob("*.ckpt"))


@pytest.mark.parametrize(("precision", "steps", "status"), [
    ([], [2], 3),                     # no scaler: the first NaN has reached the weights
    (["--trainer.plugins", FP16_SCALER], [2, 3, 5], 0),  # fp16's scaler skips those steps: normal
], ids=["fp32 one NaN step", "fp16 scaler skips NaN steps"])
def test_a_non_finite_loss_is_divergence_unless_a_gradient_scaler_skipped_its_step(precision, steps, status, tmp_path,
                                                                                    monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert fit(tmp_path, 6, *precision, callbacks=[nan_loss(steps=steps)]) == status
    run = tmp_path / "runs/demo/version_0"
    if status:
        assert "training diverged: the training loss was nan at step 2. Likely cause" in capsys.readouterr().err
        assert results(run)["status"] == "diverged" and not list(run.rglob("*.ckpt"))
        return
    assert results(run)["status"] == "complete" and results(run)["global_step"] == 6
    assert math.isfinite(results(run)["metrics"]["val/loss"]) and finite(run / "checkpoints/last.ckpt")
    scaler = torch.load(run / "checkpoints/last.ckpt", weights_only=True)["MixedPrecision"]
    assert scaler["scale"] == 2.0**16 / 2 ** len(steps)  # it skipped each NaN step, halving its scale


def test_a_persistent_non_finite_loss_under_the_scaler_is_divergence(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    start = 3
    assert fit(tmp_path, start + SKIPPED_STEPS + 2, "--trainer.plugins", FP16_SCALER, callbacks=[nan_loss(from_step=start)]) == 3
    step = start + SKIPPED_STEPS - 1
    err = capsys.readouterr().err
    assert (f"the training loss was nan at step {step} ({SKIPPED_STEPS} batches in a row, each skipped by the gradient "
            f"scaler). Likely cause: a learning rate too high") in err, err
    assert "or fp16's range (precision 16-mixed: try bf16-mixed or 32-true)" in err
    found = results(tmp_path / "runs/demo/version_0")
    assert found["status"] == "diverged" and found["global_step"] == start + SKIPPED_STEPS + 2  # read at the validation
    assert found["detail"].startswith(f"the training loss was nan at step {step} ")
