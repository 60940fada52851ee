"""Quiet, true output: no adverts or deprecation noise, a progress bar and model summary that say what is true."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from lit_embed.callbacks.console import EpochProgressBar, LayerSummary
from lit_embed.notices import quiet


def test_lightning_tips_are_dropped_and_its_other_messages_kept(caplog):
    quiet()
    rank_zero = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    with caplog.at_level(logging.INFO):
        rank_zero.info("💡 Tip: For seamless cloud logging and experiment tracking, try installing litlogger")
        rank_zero.info("GPU available: False, used: False")
        rank_zero.info("Loading `train_dataloader` to estimate number of stepping batches.")
    assert [r.getMessage() for r in caplog.records] == ["GPU available: False, used: False"]


def test_the_devices_every_trainer_names_are_said_once_a_command(caplog):
    """compress builds a Trainer per candidate k: Lightning's "GPU available / TPU available" lines come once."""
    import pytorch_lightning as pl

    def said() -> list[str]:
        with caplog.at_level(logging.INFO):
            for _ in range(3):
                pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
        messages = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("GPU available", "TPU available"))]
        caplog.clear()
        return messages

    quiet("compress")
    first = said()
    assert [m[:3] for m in first] == ["GPU", "TPU"] and said() == []
    quiet("compress")  # the next command in this process says them again
    assert said() == first


def test_params_says_no_seed_it_set(caplog, capsys):
    """Counting parameters is no run: no "Seed set to 0" (a model built alone is seeded quietly)."""
    from lit_embed.commands import main
    from tests.helpers import CONFIGS

    with caplog.at_level(logging.INFO):
        assert main(["params", "--config", str(CONFIGS / "demo.yaml")]) == 0
    out, err = capsys.readouterr()
    assert "embedding params" in out and "Seed" not in err and not [r for r in caplog.records if "Seed" in r.getMessage()]


def test_notices_that_say_nothing_true_about_the_run_are_dropped():
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet("predict")
        warnings.warn("No seed found, seed set to 0", UserWarning, stacklevel=1)  # the seed is recorded
        warnings.warn("The dirpath has changed from 'runs/x/version_0' to 'runs/x/version_1', therefore", UserWarning, stacklevel=1)
        warnings.warn("The number of training batches (3) is smaller than the logging interval", UserWarning, stacklevel=1)
    assert [str(w.message)[:22] for w in seen] == ["The number of training"]


def bar_of(max_epochs: int | None) -> EpochProgressBar:
    bar = EpochProgressBar()
    bar._trainer = SimpleNamespace(max_epochs=max_epochs)  # the attribute Lightning's ``trainer`` property reads
    return bar


def test_the_progress_bar_counts_epochs_only_where_they_bound_training():
    assert bar_of(-1)._get_train_description(4).strip() == "Epoch 4"  # max_steps bounds it: not "Epoch 4/-2"
    assert bar_of(5)._get_train_description(4).strip() == "Epoch 4/4"


def test_the_model_summary_leaves_out_flops_nobody_counted(caplog):
    columns = [(" ", ["0"]), ("Name", ["encoder"]), ("Type", ["Encoder"]), ("Params", ["79.6 K"]),
               ("Mode", ["train"]), ("FLOPs", ["0"])]
    with caplog.at_level(logging.INFO, logger="pytorch_lightning.callbacks.model_summary"):
        LayerSummary.summarize(columns, 79_600, 79_600, 0.3, {"train": 1, "eval": 0}, 0)
    text = caplog.text
    assert "encoder" in text and "FLOPs" not in text and "Total Flops" not in text.title()


def test_a_run_whose_output_goes_to_a_file_says_its_progress_in_lines(tmp_path, monkeypatch, capsys):
    """stderr no terminal (pytest's capture, as ``> log 2>&1``): the CLI's progress is LogProgress's lines, here
    every step (interval 0): step counts of the run's total, a rate, an ETA while running, the last loss, and a
    closing line per stage."""
    import json
    import re

    from lit_embed.commands import main
    from tests.helpers import CONFIGS

    monkeypatch.chdir(tmp_path)
    every_step = {"class_path": "lit_embed.callbacks.console.LogProgress", "init_args": {"interval": 0}}
    assert main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--trainer.max_steps", "4", "--trainer.val_check_interval",
                 "4", "--trainer.limit_val_batches", "2", "--trainer.callbacks+", json.dumps(every_step)]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("train ", "validate ", "sanity"))]
    train = [line for line in lines if line.startswith("train step")]
    assert [re.match(r"train step (\d+)/4 \(", line).group(1) for line in train] == ["1", "2", "3", "4", "4"]
    assert all(", ETA " in line and "train/loss " in line for line in train[:3]) and "done in" in train[-1]
    assert any(re.match(r"validate batch 2/2 \(100\.0%\), [\d.]+ batches/s, done in", line) for line in lines)
    assert lines[0].startswith("sanity check batch 1/2")


def test_progress_is_a_bar_on_a_terminal_and_lines_in_a_log(monkeypatch):
    import sys

    from lit_embed.callbacks.console import LogProgress, progress_bar

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert isinstance(progress_bar(), LogProgress)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert not isinstance(progress_bar(), LogProgress)


def test_log_progress_counts_test_and_predict_batches(capsys):
    import pytorch_lightning as pl
    from pytorch_lightning.demos.boring_classes import BoringModel

    from lit_embed.callbacks.console import LogProgress

    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_model_summary=False,
                         callbacks=[LogProgress(interval=0)], limit_test_batches=3, limit_predict_batches=2)
    trainer.test(BoringModel(), verbose=False)
    trainer.predict(BoringModel(), return_predictions=False)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("test ", "predict "))]
    assert [line.split(",")[0] for line in lines] == ["test batch 1/3 (33.3%)", "test batch 2/3 (66.7%)",
                                                     "test batch 3/3 (100.0%)", "test batch 3/3 (100.0%)",
                                                     "predict batch 1/2 (50.0%)", "predict batch 2/2 (100.0%)",
                                                     "predict batch 2/2 (100.0%)"]
    assert "done in" in lines[3] and "done in" in lines[-1]
