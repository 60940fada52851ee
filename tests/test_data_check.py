"""`lit-embed data check`: every hub name a config uses, looked up in a folder tree standing in for the hub."""

from __future__ import annotations

import hashlib
import json

import pytest

from lit_embed.commands import main
from lit_embed.commands.data_check import parse_config
from lit_embed.data import hub_names as check
from lit_embed.data.finetune import TaskDataModule
from lit_embed.data.hub_names import names_in
from tests.helpers import CONFIGS

GLUE = "nyu-mll/glue@0de23925db68e9cf6287d3776a0f67f5267a42eb"
JGLUE = "shunk031/JGLUE@3a4a622d8ae03c700184c17da7afa1d3dc870cd3"
LINE = "line-corporation/line-distilbert-base-japanese"
AUTO_MAP = {"AutoTokenizer": ["tokenization_ja.JapaneseTokenizer", None]}
#: repo type, repo id -> its files ({name: text}).
REPOS = {
    ("dataset", "acme/wiki"): {"README.md": "", "20240101.en/train-00000-of-00002.parquet": "",
                               "20240101.en/train-00001-of-00002.parquet": ""},
    ("dataset", "acme/books"): {"README.md": "", "books.py": "import datasets"},
    ("dataset", "nyu-mll/glue"): {f"rte/{split}-00000-of-00001.parquet": "" for split in ("train", "validation", "test")},
    ("dataset", "shunk031/JGLUE"): {"JGLUE.py": "", "MARC-ja/jglue-train.parquet": "", "MARC-ja/jglue-validation.parquet": "",
                                    "MARC-ja/train/index.duckdb": ""},
    ("model", "acme/bert"): {"config.json": "{}", "model.safetensors": "", "tokenizer.json": "{}",
                             "tokenizer_config.json": json.dumps({"do_lower_case": True})},
    ("model", "acme/ja"): {"config.json": "{}", "pytorch_model.bin": "", "spiece.model": "",
                           "tokenizer_config.json": json.dumps({"auto_map": AUTO_MAP})},
    ("model", LINE): {"config.json": "{}", "pytorch_model.bin": "", "tokenizer_config.json": json.dumps({"auto_map": AUTO_MAP})},
}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The hub as folders (``<type>s/<owner>/<name>/...``); a commit is a digest of the name and revision."""
    root = tmp_path / "hub"
    for (kind, repo), files in REPOS.items():
        for name, text in files.items():
            (root / f"{kind}s" / repo / name).parent.mkdir(parents=True, exist_ok=True)
            (root / f"{kind}s" / repo / name).write_text(text)
    asked = []

    def lookup(repo_id: str, repo_type: str, revision: str | None) -> check.Repo:
        asked.append((repo_id, repo_type, revision))
        folder = root / f"{repo_type}s" / repo_id
        if not folder.is_dir():
            raise check.NotFound("no such repository")
        local = check.local_repo(folder)
        return check.Repo(revision or sha(repo_id), local.files, local.read)

    monkeypatch.setattr(check, "lookup", lookup)
    monkeypatch.chdir(tmp_path)
    return asked


def sha(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()


def data_check(capsys, config: str, *overrides: str) -> tuple[int, list[str], str]:
    status = main(["data", "check", "--config", str(CONFIGS / config), *overrides])
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


def test_a_corpus_of_parquet_and_a_tokenizer_with_safetensors_load(hub, capsys):
    status, out, err = data_check(
        capsys, "experiments/subspace/roberta_s_3se_kmeans_q100.yaml",
        "--data.init_args.datasets", "[acme/wiki:20240101.en]", "--data.init_args.tokenizer", "acme/bert",
        "--model.init_args.embedding.init_args.assignment.init_args.source", "acme/bert",
    )
    assert status == 0, err
    assert f"| acme/wiki:20240101.en | data.datasets | yes | parquet | no | {sha('acme/wiki')} (main) |" in out
    assert (f"| acme/bert | data.tokenizer, model.embedding.assignment.source | yes | weights: safetensors | no | "
            f"{sha('acme/bert')} (main) |") in out
    assert hub == [("acme/wiki", "dataset", None), ("acme/bert", "model", None)]  # one lookup per name
    assert out[-1].startswith("Every name loads without remote code")


def test_a_script_a_remote_code_tokenizer_and_a_missing_name_exit_2_naming_each(hub, capsys):
    status, out, err = data_check(
        capsys, "demo.yaml", "--data.init_args.files", "[sample-corpus, missing.txt]",
        "--data.init_args.datasets", "[acme/wiki:20240101.en, acme/books, acme/nothing@v2]",
        "--data.init_args.tokenizer", "acme/ja",
    )
    assert status == 2
    assert "| acme/books | data.datasets | yes | script (books.py) | yes: loading script |" in "\n".join(out)
    assert ("| acme/ja | data.tokenizer | yes | weights: bin (read with weights_only) | "
            "yes: tokenizer tokenization_ja.JapaneseTokenizer |") in "\n".join(out)
    assert "| sample-corpus | data.files | local (shipped) | text | no | - |" in out
    assert "| missing.txt | data.files | no: missing | text | no | - |" in out
    assert "| acme/nothing@v2 | data.datasets | not found | ? | ? | v2 |" in out
    said = [line for line in err.splitlines() if line.startswith("data check name")]  # stderr no terminal: a log
    assert [line.split(" (")[0] for line in said] == [f"data check name {n}/6" for n in range(1, 7)]  # one a name
    assert said[0].endswith(", checked acme/wiki:20240101.en, reachable yes") and ", ETA " in said[0]
    assert said[-1].endswith(", checked acme/ja, reachable yes") and ", done in " in said[-1]
    assert err.splitlines()[len(said)].startswith("lit-embed: error: data check: 4 name(s) cannot be used as configured")
    for expected in ("missing.txt: missing (relative paths are read from", "acme/books: a loading script (books.py), which datasets 4+ refuses",
                     "acme/nothing@v2: no such repository", "acme/ja: its tokenizer_config.json maps AutoTokenizer",
                     "trust_remote_code"):
        assert expected in err
    assert ("acme/nothing", "dataset", "v2") in hub


def test_a_task_is_checked_at_its_pinned_commit_with_every_split_it_reads(hub, capsys):
    status, out, err = data_check(capsys, "experiments/finetune/glue/rte.yaml", "--data.init_args.tokenizer", "acme/bert")
    assert status == 0, err
    assert f"| {GLUE} | task rte | yes | parquet | no | 0de23925db68e9cf6287d3776a0f67f5267a42eb (pinned) |" in out
    assert ("nyu-mll/glue", "dataset", "0de23925db68e9cf6287d3776a0f67f5267a42eb") in hub


def test_jglue_is_read_as_parquet_files_and_its_model_runs_the_code_the_config_trusts(hub, capsys):
    status, out, err = data_check(capsys, "experiments/finetune/jglue/marc_ja.yaml")
    assert status == 0, err
    assert f"| {JGLUE} | task marc_ja | yes | parquet | no | 3a4a622d8ae03c700184c17da7afa1d3dc870cd3 (pinned) |" in out
    assert (f"| {LINE} | model.encoder.pretrained | yes | weights: bin (read with weights_only) | "
            f"yes: tokenizer tokenization_ja.JapaneseTokenizer (trusted by the config) |") in "\n".join(out)
    # A split whose files are not at the pinned commit is named (this hub holds no JNLI): exit 2.
    status, out, err = data_check(capsys, "experiments/finetune/jglue/jnli.yaml")
    assert status == 2 and "no files JNLI/train/*.parquet, JNLI/validation/*.parquet at this revision" in err


def test_offline_without_a_fake_asks_no_network_and_says_how_to_run_it(tmp_path, monkeypatch, capsys):
    import socket

    monkeypatch.chdir(tmp_path)
    asked = []
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: asked.append(args) or [])
    monkeypatch.setattr(socket.socket, "connect", lambda sock, address: asked.append(address))
    with pytest.raises(check.HubDown, match="HF_HUB_OFFLINE=1 is set"):
        check.lookup("nyu-mll/glue", "dataset", None)
    assert asked == []  # no name looked up, no connection opened: offline is honoured before any request
    status, out, err = data_check(capsys, "experiments/hashformers/bert_mlm.yaml")
    assert status == 2
    assert "| rojagtap/bookcorpus | data.datasets | no (HF_HUB_OFFLINE=1 is set) | ? | ? | main (unresolved) |" in out
    assert "the hub could not be reached (HF_HUB_OFFLINE=1 is set), so 3 hub name(s) were not checked" in err
    assert "HF_HUB_OFFLINE=0 lit-embed data check --config" in err


def test_a_hub_that_does_not_answer_is_named_as_found_not_as_a_setting_the_user_never_made(tmp_path, monkeypatch, capsys):
    """Without HF_HUB_OFFLINE, one probe finds no hub (the task's data module would make the same probe): the check
    says so, and does not tell the user to unset what they never set."""
    from lit_embed import hub

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.setattr(hub, "_answered", None)
    monkeypatch.setattr(hub, "hub_answers", lambda timeout=hub.PROBE_TIMEOUT: False)
    status, out, err = data_check(capsys, "experiments/finetune/glue/rte.yaml")
    assert status == 2 and "HF_HUB_OFFLINE" not in "\n".join(out) + err, err
    assert "| roberta-base | data.tokenizer | no (https://huggingface.co did not answer within 5 s) |" in "\n".join(out)
    assert "the hub could not be reached (https://huggingface.co did not answer within 5 s)" in err
    assert "hub is reachable (lit-embed data check --config" in err


def test_offline_a_known_loading_script_is_still_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    status, out, err = data_check(capsys, "demo.yaml", "--data.init_args.datasets", "[statmt/cc100:en]")
    assert status == 2
    assert "| statmt/cc100:en | data.datasets | no (HF_HUB_OFFLINE=1 is set) | script (known) | yes: loading script |" in "\n".join(out)
    assert "statmt/cc100:en: a loading script on the hub" in "\n".join(out)


@pytest.mark.parametrize("argv", [["data"], ["data", "chek", "--config", "x.yaml"], ["data", "check"]])
def test_usage_errors_exit_2(argv, capsys):
    assert main(argv) == 2
    assert "usage: lit-embed data check --config FILE" in capsys.readouterr().err


def test_a_data_piece_and_a_task_of_your_own_in_local_files_are_checked_as_files(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    status, out, _ = data_check(capsys, "data/sample.yaml")  # the data piece alone
    assert status == 0 and "| sample-corpus | data.files | local (shipped) | text |" in "\n".join(out)
    (tmp_path / "train.csv").write_text("text,label\na,b\n")
    own = {"name": "mine", "text_columns": ["text"], "files": {"train": "train.csv", "test": "gone.csv"}}
    status, out, err = data_check(capsys, "experiments/finetune/own_data/topics.yaml",
                                  "--data.init_args.task", json.dumps(own), "--model.init_args.task", json.dumps(own))
    assert status == 2 and "| train.csv | task mine (train) | local |" in "\n".join(out), out
    assert "gone.csv" in err and "missing" in err and "hub could not be reached" not in err
    status, _, err = data_check(capsys, "backbone/tiny.yaml")
    assert status == 2 and "is a piece of a config (lit_embed.models.Encoder)" in err


class OwnTaskData(TaskDataModule):
    """A data module of the user's: it reads what its own methods say."""

    def test_sources(self):
        return {"": (self.task.config, "test")}


def test_a_data_module_of_your_own_is_checked_by_the_sources_it_reads(tmp_path, monkeypatch, capsys):
    """fit's own parser composes the config, so a class lit-embed does not know is built and asked."""
    monkeypatch.chdir(tmp_path)
    argv = ["--config", str(CONFIGS / "experiments/finetune/glue/rte.yaml"),
            "--data.class_path", "tests.test_data_check.OwnTaskData"]
    names, _ = names_in(*parse_config(argv))
    (glue,) = [name for name in names if name.kind == "dataset"]
    assert glue.needs == ["rte/train-*", "rte/validation-*", "rte/test-*"]
    assert main(["data", "check", *argv]) == 2  # offline: the hub's names are not checked
    assert "| nyu-mll/glue@" in capsys.readouterr().out


def test_a_task_defined_on_the_command_line_of_a_papers_config_is_parsed_as_one_in_its_file(tmp_path, monkeypatch):
    """The paper's evaluation schedule asks the task table for a definition jsonargparse parsed from the command line
    (a Namespace, not the mapping a file gives): it is read as the file's would be."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.csv").write_text("text,label\nthe sea,sea\na city,city\n")
    own = '{"name": "cmdline", "text_columns": [text], "files": mine.csv, "labels": [city, sea]}'
    argv = ["--config", str(CONFIGS / "experiments/finetune/glue/rte.yaml"), "--data.init_args.task", own,
            "--model.init_args.task", own]
    names, _ = names_in(*parse_config(argv))
    assert ("mine.csv", "file", ["task cmdline (train)"]) in [(n.shown, n.kind, n.uses) for n in names]
