"""`lit-embed data check` composes the config without Lightning (lit_embed.commands.light_config) and finds the same
names as fit's own parser, for every config lit-embed ships; where it cannot be sure, the parser answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from lit_embed.commands import light_config, main
from lit_embed.commands.data_check import parse_config
from lit_embed.data.finetune import TaskDataModule
from lit_embed.data.hub_names import names_in
from lit_embed.errors import UserError
from tests.helpers import CONFIGS, REPO

WRITTEN_FOR = json.loads(light_config.COPY.read_text())["versions"]
same_versions = pytest.mark.skipif(WRITTEN_FOR != light_config.versions(), reason=(
    f"the signatures are copied for {WRITTEN_FOR}; this machine has {light_config.versions()} (the parser answers)"))
#: Every shipped config data check accepts: whole configs (a model and data) and data pieces; not sweeps (nor the
#: stage configs beside them), compress options, or the pieces of a model or a trainer.
SHIPPED = sorted(str(p.relative_to(CONFIGS)) for p in CONFIGS.rglob("*.yaml") if p.parts[len(CONFIGS.parts)] != "sweeps"
                 and (p.parent.name == "data" or {"model", "data"} <= set(yaml.safe_load(p.read_text()) or {})))


class OwnTaskData(TaskDataModule):
    """A data module of the user's: the light composer does not know it, and it reads what its own methods say."""

    def test_sources(self):
        return {"": (self.task.config, "test")}


@pytest.fixture(autouse=True)
def plugins_off(monkeypatch):
    monkeypatch.setenv("LIT_EMBED_PLUGINS", "0")  # a test plugin may be installed here; none is on a fresh machine


def rows(composed) -> tuple[list[tuple], bool]:
    """What data check looks up, per name: shown, kind, uses, repo, revision, needs, files_only; and the trust flag."""
    names, trusted = names_in(*composed)
    return [(n.shown, n.kind, n.uses, n.repo, n.revision, n.needs, n.files_only) for n in names], trusted


def full(argv: list[str]) -> tuple[dict, object] | type[BaseException]:
    """fit's own parser's composed config and what data check finds in it, or the error it gives."""
    try:
        composed = parse_config(argv, light=False)
    except (UserError, SystemExit) as error:
        return type(error)
    return composed[0], rows(composed)


def light(argv: list[str]):
    composed = light_config.compose(argv)
    return None if composed is None else rows(composed)


@same_versions
def test_the_copy_is_the_classes_signatures():
    """Fails when a class's arguments change and the copy was not written again: run
    ``python -m lit_embed.commands.light_config``."""
    assert json.loads(light_config.COPY.read_text())["classes"] == light_config.signatures_of_classes()


@same_versions
@pytest.mark.parametrize("config", SHIPPED)
def test_every_shipped_config_gives_the_parsers_names_without_it(config):
    argv = ["--config", str(CONFIGS / config)]
    parsed = full(argv)
    if config.startswith("data/"):  # a data piece: checked as the data of a config
        assert light_config.piece(yaml.safe_load((CONFIGS / config).read_text())) is not None
        assert isinstance(parsed, tuple) and rows(parse_config(argv)) == parsed[1]
        return
    found = light(argv)
    if not isinstance(parsed, tuple):
        assert found is None, f"the parser refuses {config} ({parsed.__name__}); the light path must not answer"
        return
    composed, expected = parsed
    task = composed["data"]["init_args"].get("task")
    if isinstance(task, dict) and task.get("labels") is None and not task.get("regression"):
        assert found is None  # its labels are read from its rows, and its metrics checked with them: by the module
    else:
        assert found == expected  # own-data configs that list their labels too: the task table checks them, no rows read


@same_versions
def test_overrides_and_nested_files_compose_as_the_parser_composes_them(tmp_path, monkeypatch):
    """Overrides (dotted keys, ``key=value``, a class changed by a file), nested files relative to the file naming them
    (``../``), later files winning, from a folder other than the repository's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pieces").mkdir()
    (tmp_path / "pieces" / "source.yaml").write_text(yaml.safe_dump({"class_path": "lit_embed.embeddings.ClusterAssignment",
                                                                      "init_args": {"source": "acme/matrix"}}))
    (tmp_path / "pieces" / "embedding.yaml").write_text(yaml.safe_dump({
        "class_path": "lit_embed.embeddings.SubspaceEmbedding",
        "init_args": {"num_tables": 3, "table_size": 50, "assignment": "source.yaml"}}))
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "mine.yaml").write_text(yaml.safe_dump({
        "model": {"init_args": {"embedding": "../pieces/embedding.yaml"}},
        "data": {"init_args": {"tokenizer": "acme/bert", "datasets": ["acme/wiki:en"]}}}))
    cases = [
        ["--config", str(CONFIGS / "demo.yaml"), "--config", "exp/mine.yaml"],
        ["--config", str(CONFIGS / "demo.yaml"), "--data.init_args.files", "[a.txt, b.txt]",
         "--model.init_args.embedding.init_args.num_tables=2", "--data.init_args.tokenizer=acme/other"],
        ["--config", str(CONFIGS / "experiments/finetune/glue/rte.yaml"),
         "--model.init_args.embedding", str(CONFIGS / "embedding/subspace_3_kmeans.yaml"),
         "--model.init_args.embedding.init_args.assignment.init_args.source", "acme/bert", "--data.init_args.protocol",
         "split_train"],
        ["--config", str(CONFIGS / "experiments/finetune/xnli/cross_lingual.yaml"), "--data.init_args.test_languages",
         "[de, fr]", "--data.init_args.mode", "translate_train_all"],
    ]
    for argv in cases:
        found = light(argv)
        assert found is not None and found == full(argv)[1], argv
    names = [row[0] for row in light(cases[0])[0]]
    assert {"acme/bert", "acme/wiki:en", "acme/matrix", "sample-corpus"} <= set(names)


@same_versions
@pytest.mark.parametrize("why, argv", [
    ("a class it does not know", ["--data.class_path", "tests.test_data_check_light.OwnTaskData"]),
    ("a short class name", ["--model.init_args.embedding", "DenseEmbedding"]),
    ("a class where another kind is taken", ["--model.init_args.encoder", "{class_path: lit_embed.embeddings.DenseEmbedding}"]),
    ("a model where the data is", ["--data", "{class_path: lit_embed.models.MaskedLM}"]),
    ("an argument its class does not take", ["--data.init_args.tokenizr", "acme/bert"]),
    ("a value of another type than the names need", ["--data.init_args.tokenizer", "123"]),
    ("a nested file that is not there", ["--model.init_args.encoder", "no/such/backbone.yaml"]),
    ("a task it does not know", ["--data.init_args.task", "rtee"]),
    ("a task definition the table refuses", ["--data.init_args.task", '{"name": "mine", "text_columns": [a, b, c], "files": x.csv}']),
    ("a metric torchmetrics lacks", ["--data.init_args.task", '{"name": "mine", "text_columns": [a], "files": x.csv, '
                                     '"labels": [a, b], "metrics": [acuracy]}']),
    ("labels its rows give", ["--data.init_args.task", '{"name": "mine", "text_columns": [a], "files": x.csv}']),
    ("an option that is no key of the config", ["--print_config"]),
])
def test_what_it_cannot_be_sure_of_the_parser_answers(why, argv, tmp_path, monkeypatch, capsys):
    base = ["--config", str(CONFIGS / "experiments/finetune/glue/rte.yaml")]
    assert light(base + argv) is None, why
    if why == "a class it does not know":  # the parser builds it, and its own sources are what is checked
        (glue,) = [row for row in full(base + argv)[1][0] if row[1] == "dataset"]
        assert glue[5] == ["rte/train-*", "rte/validation-*", "rte/test-*"]
        monkeypatch.chdir(tmp_path)
        assert main(["data", "check", *base, *argv]) == 2  # offline: the hub's names are not checked
        assert "| nyu-mll/glue@" in capsys.readouterr().out


@same_versions
def test_other_versions_a_plugin_or_a_recorded_config_go_to_the_parser(tmp_path, monkeypatch):
    argv = ["--config", str(CONFIGS / "demo.yaml")]
    assert light(argv) is not None
    monkeypatch.setattr(light_config, "plugins_installed", lambda: True)
    assert light(argv) is None
    monkeypatch.undo()
    monkeypatch.setenv("LIT_EMBED_PLUGINS", "0")
    monkeypatch.setattr(light_config, "versions", lambda: "lit-embed 0.0.0, pytorch-lightning 0.0, jsonargparse 0.0")
    assert light(argv) is None
    monkeypatch.undo()
    monkeypatch.setenv("LIT_EMBED_PLUGINS", "0")
    recorded = tmp_path / "config.yaml"
    recorded.write_text("# Written by `lit-embed compress`\n" + (CONFIGS / "demo.yaml").read_text())
    assert light(["--config", str(recorded)]) is None


@same_versions
def test_data_check_answers_without_importing_torch_or_lightning(tmp_path):
    """In a fresh process, as a user runs it: the names of the demo and of a GLUE task (the hub made unreachable)."""
    configs = [str(CONFIGS / "demo.yaml"), str(CONFIGS / "experiments/finetune/glue/rte.yaml")]
    code = ("import sys; from lit_embed.commands import main; "
            f"statuses = [main(['data', 'check', '--config', config]) for config in {configs!r}]; "
            "heavy = sorted(m for m in ('torch', 'pytorch_lightning', 'transformers', 'datasets') if m in sys.modules); "
            "print(statuses, heavy)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "LIT_EMBED_PLUGINS": "0", "HF_HUB_OFFLINE": "1",
                               "PYTHONPATH": str(REPO)})
    assert done.stdout.strip().splitlines()[-1] == "[0, 2] []", done.stderr[-2000:]
    assert "| sample-corpus | data.files | local (shipped) |" in done.stdout
    assert "task rte" in done.stdout and "HF_HUB_OFFLINE=1 is set" in done.stderr


def test_a_task_defined_on_the_command_line_of_a_papers_config_is_parsed_as_one_in_its_file(tmp_path, monkeypatch):
    """The paper's evaluation schedule asks the task table for a definition jsonargparse parsed from the command line
    (a Namespace, not the mapping a file gives): it is read as the file's would be."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.csv").write_text("text,label\nthe sea,sea\na city,city\n")
    own = '{"name": "cmdline", "text_columns": [text], "files": mine.csv, "labels": [city, sea]}'
    argv = ["--config", str(CONFIGS / "experiments/finetune/glue/rte.yaml"), "--data.init_args.task", own,
            "--model.init_args.task", own]
    composed, (names, _) = full(argv)
    assert ("mine.csv", "file", ["task cmdline (train)"]) in [row[:3] for row in names]
    assert light(argv) == full(argv)[1]
