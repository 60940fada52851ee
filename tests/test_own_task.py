"""Your own labelled data: a task defined in a config (files or a hub dataset, columns, labels, metrics)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from lit_embed.commands import main
from lit_embed.data.finetune import ExampleBuilder, TaskDataModule, labelled
from lit_embed.data.tasks import TASKS, TaskDefinition, get_task
from lit_embed.embeddings.text import VocabTextEncoder
from lit_embed.errors import ConfigError
from tests.helpers import CONFIGS

WORDS = {"sport": "the team won the match at the stadium", "food": "the soup and bread were warm and tasty",
         "music": "the band played a loud song on the guitar"}


def write_csv(path, rows: int = 60, labels=tuple(WORDS), seed: int = 0) -> str:
    lines = ["id,review,topic"]
    for i in range(rows):
        label = labels[(i * 7 + seed) % len(labels)]
        lines.append(f'{i},"{WORDS.get(label, "a text of " + str(label))} (number {i})",{label}')
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def definition(name: str, files, **kwargs) -> dict:
    return {"name": name, "files": files, "text_columns": ["review"], "label_column": "topic", **kwargs}


def test_labels_are_read_from_the_training_rows_in_a_stable_order(tmp_path):
    unread = get_task(definition("reviews", write_csv(tmp_path / "r.csv", labels=("music", "food", "sport"))))
    assert unread.labels == ()  # the task table reads no data: the data module (and the model) ask for them
    assert get_task(definition("ghost", str(tmp_path / "missing.csv"))).labels == ()  # nor needs it to exist
    task = labelled(unread)
    assert task.labels == ("food", "music", "sport") and TASKS["reviews"] is task
    assert task.definition["labels"] == ["food", "music", "sport"]  # recorded: a checkpoint predicts without the data
    assert labelled(get_task(definition("reviews", str(tmp_path / "r.csv")))) is task  # read once
    assert task.held_out == ("validation", "test") and task.metrics == ("accuracy",)
    numbers = labelled(get_task(definition("stars", write_csv(tmp_path / "n.csv", labels=(10, 2, 1)))))
    assert numbers.labels == ("1", "2", "10")  # numerically
    given = get_task(definition("given", str(tmp_path / "r.csv"), labels=["sport", "food", "music"]))
    assert given.labels == ("sport", "food", "music")
    stars = get_task(definition("stars_given", str(tmp_path / "n.csv"), labels=[10, 2, 1]))  # as YAML gives numbers
    assert stars.labels == ("10", "2", "1") and get_task(definition("stars_given", str(tmp_path / "n.csv"), labels=[10, 2, 1])) is stars


def test_the_same_task_and_file_with_other_labels_is_encoded_again(tmp_path):
    """The encoded rows are cached by what the task makes of them: a definition that keeps its name and file but
    orders its labels otherwise (or reads another column) must not get the earlier encoding's label ids."""
    files = write_csv(tmp_path / "r.csv", rows=30)
    ids = {}
    for order in (["food", "music", "sport"], ["sport", "music", "food"]):
        TASKS.pop("reordered", None)  # a new process, as a new run is
        data = TaskDataModule(definition("reordered", files, labels=order))
        rows = data._load(None, "train", "train")
        encoded = data._encode(rows, ExampleBuilder(VocabTextEncoder("all-MiniLM-L6-v2"), data.task, 32, 1, None), "train")
        ids[tuple(order)] = [order[i] for i in encoded["labels"]]
    first, second = ids.values()
    assert first == second == rows["topic"]


def test_one_file_is_split_into_train_validation_and_test_by_the_seed(tmp_path):
    files = write_csv(tmp_path / "r.csv", rows=100)
    data = TaskDataModule(definition("split_one", files), val_fraction=0.2, split_seed=3)
    splits = {name: data._load(None, name, name) for name in ("train", "validation", "test")}
    assert [len(rows) for rows in splits.values()] == [64, 20, 16]  # validation held out first, then test
    ids = [set(rows["id"]) for rows in splits.values()]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    again = TaskDataModule(definition("split_one", files), val_fraction=0.2, split_seed=3)
    assert again._load(None, "test", "test")["id"] == splits["test"]["id"]


@pytest.mark.parametrize(("change", "message"), [
    ({"text_columns": ["body"]}, r"no column\(s\) \['body'\]"),
    ({"label_column": "stars"}, r"no label column 'stars'"),
    ({"metrics": ["acuracy"]}, r"metric 'acuracy' is not known \(did you mean accuracy"),
    ({"metrics": ["mean_squared_error"]}, r"does not fit a classification task"),
    ({"regression": True, "labels": ["a"]}, r"is a regression .*leave labels unset"),
    ({"hub": "imdb"}, r"one of the two"),
    ({"name": "SST-2"}, r"is not the form configs find: name it 'sst2'"),
    ({"name": "Reviews Data"}, r"is not the form configs find: name it 'reviews_data'"),
    ({"name": "reviews data"}, r"is not the form configs find: name it 'reviews_data'"),
])
def test_a_definition_that_cannot_work_is_refused_naming_the_fix(tmp_path, change, message):
    files = write_csv(tmp_path / "r.csv")
    with pytest.raises(ConfigError, match=message):
        TaskDataModule({**definition("bad", files), **change})._load(None, "train", "train")


def test_a_name_of_the_table_is_not_taken_by_a_definition(tmp_path):
    with pytest.raises(ConfigError, match="a task named 'rte' exists already"):
        get_task(definition("rte", write_csv(tmp_path / "r.csv")))
    assert isinstance(TaskDefinition(**definition("ok", "f.csv")), TaskDefinition)


def finetune_config(tmp_path, task: dict) -> str:
    """A tiny model from scratch on the config's own task (seconds on a CPU)."""
    config = {
        "seed_everything": 0,
        "model": {"class_path": "lit_embed.models.SequenceClassifier", "init_args": {
            "task": task, "vocab_size": 30522, "encoder": str(CONFIGS / "backbone" / "tiny.yaml"),
            "embedding": str(CONFIGS / "embedding" / "subspace_3.yaml"), "optim": {"lr": 1.0e-2, "warmup": 0.0}}},
        "data": {"class_path": "lit_embed.data.TaskDataModule",
                 "init_args": {"task": task, "tokenizer": "all-MiniLM-L6-v2", "max_length": 32, "batch_size": 8}},
        "trainer": {"accelerator": "cpu", "max_epochs": 4, "enable_progress_bar": False, "enable_model_summary": False,
                    "default_root_dir": str(tmp_path / "runs" / "own"),
                    "callbacks": [{"class_path": "lit_embed.callbacks.ResultsWriter"},
                                  {"class_path": "pytorch_lightning.callbacks.ModelCheckpoint",
                                   "init_args": {"monitor": "val/score", "mode": "max", "save_last": True}}]},
    }
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_a_csv_of_your_own_fine_tunes_through_the_cli_and_its_checkpoint_records_the_labels(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    files = {"train": write_csv(tmp_path / "train.csv", 90), "validation": write_csv(tmp_path / "dev.csv", 15, seed=1),
             "test": write_csv(tmp_path / "test.csv", 15, seed=2)}
    task = definition("reviews", files, metrics=["accuracy", "f1_score_macro", "cohen_kappa"])
    assert main(["fit", "--config", finetune_config(tmp_path, task)]) == 0
    run = tmp_path / "runs" / "own" / "version_0"
    results = json.loads((run / "results.json").read_text())
    assert results["task"] == "reviews" and results["status"] == "complete"
    assert results["scores"] == ["accuracy", "f1_score_macro", "cohen_kappa"]  # report scales and compares these
    assert {"test/accuracy", "test/f1_score_macro", "test/cohen_kappa", "val/score"} <= set(results["metrics"])
    assert results["metrics"]["test/accuracy"] > 0.5  # three topics with distinct words: chance is 1/3
    recorded = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["hyper_parameters"]["task"]
    assert recorded["labels"] == ["food", "music", "sport"] and recorded["name"] == "reviews"

    # predict: new texts (one a line), then the test split as JSONL, each into a folder of its own beside the run's
    (tmp_path / "new.txt").write_text("the band played a song\nthe soup was warm\n")
    for file in ("train.csv", "dev.csv"):
        (tmp_path / file).unlink()  # the checkpoint's labels, not the training file, name the outputs
    predict = ["predict", "--config", finetune_config(tmp_path, task), "--ckpt_path", str(run / "checkpoints" / "last.ckpt")]
    before = listing(tmp_path / "runs")
    assert main([*predict, "--data.init_args.predict_input", "new.txt"]) == 0
    folder = tmp_path / "runs" / "own" / "version_0-predictions-new"
    assert f"predictions of 2 text(s) in {folder / 'predictions.csv'}" in capsys.readouterr().err
    assert listing(tmp_path / "runs") == {**before, **listing(tmp_path / "runs", folder)}  # the run's folder untouched
    assert {"predictions.csv", "results.json", "config.yaml"} <= set(listing(folder, folder))
    lines = (folder / "predictions.csv").read_text().splitlines()
    assert lines[0] == "review,predicted,p_food,p_music,p_sport" and len(lines) == 3
    assert lines[1].startswith("the band played a song,") and lines[1].split(",")[1] in ("food", "music", "sport")
    assert sum(map(float, lines[1].split(",")[2:])) == pytest.approx(1.0, abs=1e-5)
    writer = {"class_path": "lit_embed.callbacks.PredictionWriter", "init_args": {"format": "jsonl"}}
    by_folder = [*predict[:-1], str(tmp_path / "runs" / "own")]  # the experiment folder: its newest finished run's
    assert main([*by_folder, "--trainer.callbacks+", json.dumps(writer)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "runs/own/version_0-predictions-test/predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 15 and {"review", "topic", "predicted", "p_food"} <= set(rows[0])
    accuracy = sum(row["predicted"] == row["topic"] for row in rows) / len(rows)
    assert accuracy == pytest.approx(results["metrics"]["test/accuracy"])  # the best checkpoint was tested

    # the same input again: a folder numbered beside the first, which is kept as it was
    first = listing(folder, folder)
    assert main([*predict, "--data.init_args.predict_input", "new.txt"]) == 0
    assert (folder.parent / "version_0-predictions-new-2" / "predictions.csv").read_text() == (folder / "predictions.csv").read_text()
    assert listing(folder, folder) == first
    # where the user asks; a folder there already is refused, with nothing in it touched
    assert main([*predict, "--data.init_args.predict_input", "new.txt", "--output", "mine"]) == 0
    assert (tmp_path / "mine" / "predictions.csv").read_text() == (folder / "predictions.csv").read_text()
    capsys.readouterr()
    mine = listing(tmp_path / "mine")
    assert main([*predict, "--data.init_args.predict_input", "new.txt", "--output", "mine"]) == 2
    assert f"--output '{tmp_path / 'mine'}' exists: choose another --output, or remove it" in capsys.readouterr().err
    assert listing(tmp_path / "mine") == mine
    assert main([*predict, "--output", "mine.csv"]) == 2
    assert "--output 'mine.csv' names a folder" in capsys.readouterr().err and not (tmp_path / "mine.csv").exists()


def listing(folder, within=None) -> dict[str, str]:
    """Every file under ``folder`` (or only those under ``within``) with a hash of its content; lock files aside."""
    within = within or folder
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(within).rglob("*")) if p.is_file() and p.name != ".lock"}


def test_a_label_unseen_in_training_and_an_empty_split_fail_with_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    files = {"train": write_csv(tmp_path / "train.csv", 30), "validation": write_csv(tmp_path / "dev.csv", 6,
                                                                                        labels=("sport", "travel"))}
    assert main(["fit", "--config", finetune_config(tmp_path, definition("unseen", files))]) == 2
    assert re.search(r"dev\.csv: unseen: row \d+ has label 'travel', outside the label set \['food', 'music', 'sport'\]"
                     r".*unseen in training", capsys.readouterr().err)
    files["test"] = write_csv(tmp_path / "test.csv", 6, labels=("sport", "travel"))  # only the test file: still before training
    files["validation"] = write_csv(tmp_path / "dev.csv", 6)
    assert main(["fit", "--config", finetune_config(tmp_path, definition("unseen_test", files))]) == 2
    assert re.search(r"test\.csv: unseen_test: row \d+ has label 'travel', outside", capsys.readouterr().err)
    del files["test"]
    (tmp_path / "empty.csv").write_text("id,review,topic\n")
    files["validation"] = str(tmp_path / "empty.csv")
    assert main(["fit", "--config", finetune_config(tmp_path, definition("empty", files))]) == 2
    assert "empty.csv: the validation split of task 'empty' has no rows" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.ckpt"))


#: id, the label of every row of train, validation and test (None: three labels), the definition's changes, the
#: message (exit 2, before any training); None: the run trains.
ONE_VALUE = [
    ("a training file of one label", ("sport", None, None), {}, r"r\.csv: every row of the train split has the label "
     r"'sport' in column 'topic' \(24 rows\), and a classification needs two labels or more to learn"),
    ("given labels, a training split of one", ("sport", None, None), {"labels": ["sport", "food", "music"]},
     r"train\.csv: every row of the train split has the label 'sport' in column 'topic' \(30 rows\), and a "
     r"classification needs two labels or more to learn"),
    ("one label given", (None, None, None), {"labels": ["sport"]}, r"labels \['sport'\] name fewer than two"),
    ("a constant regression target", (2.5, None, None), {"regression": True},
     r"train\.csv: every row of the train split has the score 2\.5 in column 'topic'.*a regression learns nothing"),
    ("a regression target that is no number", ("high", None, None), {"regression": True},
     r"train\.csv: single: row \d+ has label 'high' in column 'topic'; the task's scores are numbers"),
    ("a validation split of one label, scored by matthews", (None, "sport", None), {"metrics": ["accuracy", "matthews"]},
     r"dev\.csv: every row of the validation split has the label 'sport'.*metric 'matthews' needs two labels or more"),
    ("a test split of one label, scored by auroc", (None, None, "food"), {"metrics": ["accuracy", "auroc_macro"]},
     r"test\.csv: every row of the test split has the label 'food'.*metric 'auroc_macro' needs two labels"),
    ("a constant validation score, spearman", (None, 3.0, None), {"regression": True},
     r"dev\.csv: every row of the validation split has the score 3\.0.*metric 'spearman' needs two scores"),
    ("a validation split of one label, scored by accuracy alone", (None, "sport", None), {}, None),
]


@pytest.mark.parametrize(("case", "labels", "change", "message"), ONE_VALUE, ids=[c[0] for c in ONE_VALUE])
def test_labels_of_one_value_are_refused_before_training_where_they_cannot_train_or_be_scored(
        tmp_path, monkeypatch, capsys, case, labels, change, message):
    """A training split whose labels (or scores) all have one value cannot train; an evaluation split of one value
    cannot be scored by a correlation, agreement or ranking metric (torchmetrics failed after training, leaving a run
    folder). Refused with exit 2 naming the file and the column, and nothing is left; accuracy scores one label."""
    monkeypatch.chdir(tmp_path)
    regression = change.get("regression", False)
    three = (1.0, 2.0, 4.0) if regression else ("sport", "food", "music")
    files = {split: write_csv(tmp_path / f"{name}.csv", rows, labels=three if label is None else (label,), seed=seed)
             for split, name, rows, label, seed in zip(("train", "validation", "test"), ("train", "dev", "test"),
                                                       (30, 9, 9), labels, (0, 1, 2))}
    if case == "a training file of one label":
        files = write_csv(tmp_path / "r.csv", 30, labels=("sport",))
    task = definition("single", files, **change)
    status = main(["fit", "--config", finetune_config(tmp_path, task), "--trainer.max_steps", "1"])
    error = capsys.readouterr().err
    if message is None:
        assert status == 0, error
        return
    assert status == 2, error
    assert re.search(message, error, flags=re.S), error
    assert not list((tmp_path / "runs").rglob("version_*")) and not list(tmp_path.rglob("*.ckpt"))


def test_predict_input_is_texts_a_text_file_a_table_or_a_split_and_wrong_shapes_are_refused(tmp_path):
    files = write_csv(tmp_path / "r.csv", rows=20)
    pair = definition("pairs", files, text_columns=["review", "topic"], labels=["a", "b"])
    (tmp_path / "pairs.txt").write_text("first\tsecond\nonly one part\n")
    with pytest.raises(ConfigError, match=r"text 2 has 1 part\(s\); task 'pairs' reads 2 \(review, topic\): a tab"):
        TaskDataModule(pair, predict_input=str(tmp_path / "pairs.txt"))._predict_rows()
    (tmp_path / "other.csv").write_text("body\nhello\n")
    with pytest.raises(ConfigError, match=r"has no column\(s\) \['review'\]"):
        TaskDataModule(definition("one", files), predict_input=str(tmp_path / "other.csv"))._predict_rows()
    assert TaskDataModule(definition("one", files), predict_input=["a text", "another"])._predict_rows()["review"] == [
        "a text", "another"]
    assert len(TaskDataModule(definition("one", files), predict_input=files)._predict_rows()) == 20
    assert len(TaskDataModule("topics")._predict_rows()) == 300  # a table task: its test split by default


def test_the_minilm_example_fine_tunes_a_csv_of_your_own_with_only_its_marked_lines_edited(tmp_path, monkeypatch):
    """configs/experiments/finetune/own_data/minilm.yaml, copied next to the user's files (it names no other config)
    and edited only on its EDIT lines, fine-tunes the packaged MiniLM on them (two steps: an epoch of 30 rows each)."""
    monkeypatch.chdir(tmp_path)
    for split, rows, seed in (("train", 30, 0), ("dev", 9, 1), ("test", 9, 2)):
        write_csv(tmp_path / f"{split}.csv", rows, seed=seed)
    edits = {"files": "{train: train.csv, validation: dev.csv, test: test.csv}", "text_columns": "[review]",
             "label_column": "topic", "labels": "[sport, food, music]"}
    shipped = (CONFIGS / "experiments/finetune/own_data/minilm.yaml").read_text()
    edited = re.sub(r"^( +)(\w+): .*# EDIT.*$", lambda m: f"{m[1]}{m[2]}: {edits.pop(m[2])}", shipped, flags=re.M)
    assert not edits, f"the config marks no EDIT line for {sorted(edits)}"
    (tmp_path / "minilm.yaml").write_text(edited)
    assert main(["fit", "--config", "minilm.yaml", "--trainer.accelerator", "cpu", "--trainer.max_steps", "2",
                 "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1",
                 "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]) == 0
    run = tmp_path / "runs" / "own_data_minilm" / "version_0"
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "complete" and results["task"] == "my_data" and "test/accuracy" in results["metrics"]
    hparams = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["hyper_parameters"]
    assert hparams["task"]["labels"] == ["sport", "food", "music"] and hparams["task"]["text_columns"] == ["review"]


def test_predictions_go_beside_what_owns_the_checkpoint_named_after_the_input(tmp_path):
    from lit_embed.callbacks.predictions import predictions_folder

    run = tmp_path / "runs" / "own" / "version_3"
    compressed = tmp_path / "compressed"
    compressed.mkdir()
    for name in ("config.yaml", "report.json", "model.ckpt"):  # a compress output: lit-embed's folder, not the user's
        (compressed / name).write_text("{}")
    assert predictions_folder(str(run / "checkpoints" / "last.ckpt"), "data/new texts.txt", "runs/x") == \
        tmp_path / "runs" / "own" / "version_3-predictions-new_texts"
    assert predictions_folder(str(compressed / "model.ckpt"), ["a text"], "runs/x") == tmp_path / "compressed-predictions-texts"
    assert predictions_folder(str(tmp_path / "models" / "model.ckpt"), None, "runs/x") == tmp_path / "models" / "model-predictions-test"
    assert predictions_folder(None, "validation", "runs/x") == Path("runs/x/predictions-validation")


def test_in_a_log_each_stage_of_the_libraries_work_is_one_line_and_no_bar(tmp_path):
    """Fine-tuning the packaged MiniLM on CSV files with stdout and stderr to a file, as a batch job runs it: no ``\\r``
    redraw of transformers' or datasets' bars, and each of their stages (loading the weights, reading each split,
    encoding it) said once it is done, with what it got through."""
    import os
    import subprocess
    import sys

    files = {"train": write_csv(tmp_path / "train.csv", 24), "validation": write_csv(tmp_path / "dev.csv", 6, seed=1),
             "test": write_csv(tmp_path / "test.csv", 6, seed=2)}
    task = json.dumps(definition("reviews", files, labels=sorted(WORDS), metrics=["accuracy"]))
    env = {k: v for k, v in os.environ.items() if not k.endswith("_DISABLE_PROGRESS_BARS")}
    with (tmp_path / "log").open("w") as log:
        done = subprocess.run(
            [sys.executable, "-m", "lit_embed.commands", "fit", "--config", str(CONFIGS / "experiments/finetune/own_data/minilm.yaml"),
             "--data.init_args.task", task, "--data.init_args.batch_size", "8", "--data.init_args.max_length", "32",
             "--trainer.accelerator", "cpu", "--trainer.max_steps", "1", "--trainer.limit_val_batches", "1",
             "--trainer.limit_test_batches", "1", "--trainer.default_root_dir", str(tmp_path / "runs")],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, env=env, timeout=600)
    text = (tmp_path / "log").read_text()
    assert done.returncode == 0 and "\r" not in text, text[-3000:]
    for stage in (r"pretrained encoder 'all-MiniLM-L6-v2': Loading weights: (\d+)/\1, done in \d+\.\ds",
                  r"Loading train split \(train\.csv\): 24 rows, done in", r"Encoding reviews train: 24 rows, done in",
                  r"Loading validation split \(dev\.csv\): 6 rows", r"Encoding reviews validation: 6 rows",
                  r"Loading test split \(test\.csv\): 6 rows", r"Encoding reviews test: 6 rows"):
        assert re.search(f"^{stage}", text, re.MULTILINE), (stage, text[-3000:])
