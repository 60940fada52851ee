"""A config's local data files checked before torch and Lightning load (lit_embed/commands/early_data.py): missing,
unreadable or without the task's columns, said in one line, exit 2, as the data module would say it after the imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow
import pyarrow.parquet
import pytest

from lit_embed.commands import early_data, main
from lit_embed.commands.early_data import given_data
from tests.helpers import CONFIGS, REPO

OWN = {
    "model": {"class_path": "lit_embed.models.SequenceClassifier",
              "init_args": {"vocab_size": 30522, "encoder": str(CONFIGS / "backbone/tiny.yaml")}},
    "data": {"class_path": "lit_embed.data.TaskDataModule",
             "init_args": {"task": {"name": "my_reviews", "files": "reviews.csv", "text_columns": ["review"],
                                    "label_column": "stars"}}},
    "trainer": {"max_steps": 1},
}


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder with the user's data (reviews.csv, notes.tsv) and config (own.yaml), as the working directory."""
    (tmp_path / "reviews.csv").write_text("\ufeffreview,stars\n\"good, \"\"very\"\" good\",5\nbad,1\n")
    (tmp_path / "notes.tsv").write_text("text\tlabel\nfine\tok\n")
    (tmp_path / "reviews.jsonl").write_text('{"review": "good"}\n\n{"review": "bad", "stars": 1}\n')  # a key first missing
    pyarrow.parquet.write_table(pyarrow.table({"text": ["fine"], "label": ["ok"]}), tmp_path / "notes.parquet")
    (tmp_path / "own.yaml").write_text(json.dumps(OWN))
    monkeypatch.chdir(tmp_path)
    return tmp_path


CASES = [
    (["--data.init_args.task.files", "reveiws.csv"],
     "data file 'reveiws.csv' does not exist (relative paths are read from {cwd}) (did you mean reviews.csv?)"),
    (["--data.init_args.task.label_column=label"], "reviews.csv: no column(s) ['label'] (columns: ['review', 'stars']); "
     "task 'my_reviews' expects ['review', 'label']: set text_columns and label_column to its columns"),
    (["--data.init_args.task.files", "{train: reviews.csv, test: notes.tsv}"],
     "notes.tsv: no column(s) ['review', 'stars'] (columns: ['text', 'label'])"),
    (["--data.init_args.task.files", "[reviews.csv, data]"], "data file 'data' is a folder"),
    (["--data.init_args.task.files", "reviews.jsonl", "--data.init_args.task.text_columns", "[text]"],
     "reviews.jsonl: no column(s) ['text'] (columns: ['review', 'stars'])"),
    (["--data.init_args.task.files", "{train: reviews.jsonl, test: notes.parquet}"],
     "notes.parquet: no column(s) ['review', 'stars'] (columns: ['text', 'label'])"),
    (["--data", "{class_path: lit_embed.data.TaskDataModule, init_args: {task: topics, data_dir: topcs}}"], None),
    (["--data.init_args.task", "topics", "--data.init_args.data_dir", "topcs"],
     "data_dir 'topcs' is not a folder: check the path"),
    (["--config", str(CONFIGS / "demo.yaml"), "--data.init_args.files", "[corpus.txt]"],
     "data file 'corpus.txt' does not exist"),
]


@pytest.mark.parametrize(("extra", "expected"), CASES, ids=[case[1] and case[1][:30] or "not plain data" for case in CASES])
def test_given_data_is_refused_or_left_to_the_parser(folder, extra, expected, capsys):
    (folder / "data").mkdir()
    argv = ["fit", "--config", "own.yaml", *extra]
    if expected is None:  # a whole --data value: not read here; the parser and the data module judge it
        assert given_data(argv[1:]) is None
        return
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected.format(cwd=folder) in err[0], err


def test_columns_are_read_as_the_loader_reads_them_and_no_further_than_needed(folder):
    """A jsonl file's columns are its lines' keys together (a key the first line lacks is still a column); its reading
    stops at the line that completes the columns wanted; what the loader itself refuses (not JSON lines) is left to it."""
    from lit_embed.data.sources import header

    assert header("reviews.jsonl") == ["review", "stars"] and header("reviews.jsonl", ["review"]) == ["review"]
    early_data.check_data_files(["fit", "--config", "own.yaml", "--data.init_args.task.files", "reviews.jsonl"])
    assert header("notes.parquet") == ["text", "label"]
    (folder / "broken.jsonl").write_text("[1, 2]\n")
    (folder / "broken.parquet").write_text("review,stars\n")
    assert header("broken.jsonl") is None and header("broken.parquet") is None


def test_a_config_printed_or_help_asked_is_not_checked(folder, monkeypatch):
    from lit_embed.commands import early_data

    monkeypatch.setattr(early_data, "given_data", lambda words: pytest.fail("read"))
    for extra in (["--print_config"], ["--print_config=skip_null"], ["--help"]):
        early_data.check_data_files(["fit", "--config", "own.yaml", *extra])


def test_the_data_section_is_merged_as_given(folder):
    """Configs in order (a later one's init_args merged key by key, another class replacing them), then --data.* values."""
    (folder / "later.yaml").write_text(json.dumps({"data": {"init_args": {"task": {"files": "b.csv"}, "batch_size": 8}}}))
    (folder / "other.yaml").write_text(json.dumps({"data": {"class_path": "x.Other", "init_args": {"files": ["c.txt"]}}}))
    data = given_data(["--config", "own.yaml", "-c", "later.yaml", "--trainer.max_steps", "3",
                       "--data.init_args.task.text_columns=[a, b]"])
    assert data["init_args"]["task"] == {"name": "my_reviews", "files": "b.csv", "text_columns": ["a", "b"], "label_column": "stars"}
    assert data["init_args"]["batch_size"] == 8
    assert given_data(["--config", "own.yaml", "--config", "other.yaml"]) == {"class_path": "x.Other",
                                                                            "init_args": {"files": ["c.txt"]}}
    short = given_data(["--config", "own.yaml", "--data.task.files", "b.csv", "--data.batch_size=4"])  # init_args left out
    assert short["init_args"]["task"]["files"] == "b.csv" and short["init_args"]["batch_size"] == 4


def test_the_errors_come_before_torch_or_lightning_is_imported(folder):
    """In a fresh process, as a user runs it: a wrong path and a missing column, each one line, exit 2, nothing heavy
    imported."""
    code = ("import sys; from lit_embed.commands import main; "
            "statuses = [main(['fit', '--config', 'own.yaml', *extra]) for extra in "
            "(['--data.init_args.task.files', 'reveiws.csv'], ['--data.init_args.task.label_column', 'label'], "
            "['--data.init_args.task.files', 'notes.parquet'], ['--data.init_args.task.files', 'reviews.jsonl', "
            "'--data.init_args.task.label_column', 'label'])]; "
            "print(statuses, sorted(m for m in ('torch', 'pytorch_lightning', 'transformers', 'datasets') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=folder,
                          env={**os.environ, "LIT_EMBED_PLUGINS": "0", "PYTHONPATH": str(REPO)})
    assert done.stdout.strip().splitlines()[-1] == "[2, 2, 2, 2] []", done.stderr[-2000:]
    assert "(did you mean reviews.csv?)" in done.stderr and "no column(s) ['label']" in done.stderr
    assert "notes.parquet: no column(s) ['review', 'stars']" in done.stderr and "reviews.jsonl: no column(s) ['label']" in done.stderr


def test_a_file_it_cannot_read_is_named(folder, capsys):
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    (folder / "reviews.csv").chmod(0)
    assert main(["fit", "--config", "own.yaml"]) == 2
    assert "data file 'reviews.csv' cannot be read (permission denied)" in capsys.readouterr().err
