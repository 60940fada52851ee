"""What a recorded option may do (lit_embed.checkpoints.recorded): a file grants no trust and imports nothing foreign; only the
user's own command line or config does. The commands' refusals of crafted files are rows of the fault matrix
(tests/test_faults.py); here the reader's rules, and what the user's own flag and config still allow."""

from __future__ import annotations

import json
import sys

import pytest
import torch
import yaml

from lit_embed.checkpoints import recorded
from lit_embed.checkpoints.recorded import TRUST_KEYS, checked_class, recorded_config, written_by_lit_embed
from lit_embed.commands import main
from lit_embed.errors import ConfigError
from tests.helpers.crafted import classifier_checkpoint, code_module, code_tokenizer, recording, trusting

WHERE = "checkpoint 'x.ckpt'"


@pytest.fixture
def user_classes():
    """Each test names the classes it allows afresh (a command does so in a context of its own)."""
    token = recorded._NAMED.set(frozenset())
    yield
    recorded._NAMED.reset(token)


@pytest.mark.parametrize("key", sorted(TRUST_KEYS))
def test_a_trust_granting_key_is_dropped_wherever_it_is_recorded(key, user_classes):
    config = {"data": {"class_path": "lit_embed.data.TaskDataModule", "init_args": {"task": "topics", key: True}},
              "model": {"class_path": "lit_embed.models.SequenceClassifier", "init_args": {
                  "task": {"name": "mine", key: True}, "encoder": {"class_path": "lit_embed.models.Encoder",
                                                                   "init_args": {key: True, "hidden_size": 8}}}},
              "extra": [{key: True, "kept": 1}], key: True}
    read = recorded_config(config, WHERE, "", recorded.run_config_hints())
    assert key not in json.dumps(read)
    assert read["extra"] == [{"kept": 1}] and read["model"]["init_args"]["encoder"]["init_args"] == {"hidden_size": 8}
    assert recorded.without_trust(config) == read


def test_a_foreign_class_is_refused_before_it_is_imported(tmp_path, monkeypatch, user_classes):
    code_module(tmp_path, "foreign_strategies", tmp_path / "ran")
    monkeypatch.syspath_prepend(str(tmp_path))
    for value in ("foreign_strategies.Evil", {"class_path": "foreign_strategies.Evil"}):
        config = {"class_path": "lit_embed.models.MaskedLM", "init_args": {"embedding": value}}
        with pytest.raises(ConfigError, match=r"x\.ckpt' records model\.init_args\.embedding(\.class_path)?='foreign_strategies"
                                              r"\.Evil', a class outside lit-embed, Lightning and the installed plugins"):
            recorded_config(config, WHERE, "model")
    assert "foreign_strategies" not in sys.modules and not (tmp_path / "ran").exists()


@pytest.mark.parametrize(("path", "message"), [
    ("lit_embed.storage.files.write_atomic", "not a class of lit-embed"),  # a function of an allowed package
    ("lit_embed.embeddings.base.torch", "not a class of lit-embed"),  # a module
    ("lit_embed.embeddings.files.Path", "does not import"),
    ("TaskDataModule", "not a full class path"),  # short names resolve among classes already imported: give them in full
    ("lit_embed.checkpoints.format.Path", "not a class of lit-embed"),  # a foreign class lit-embed happens to import
])
def test_only_classes_defined_where_allowed_are_taken(path, message, user_classes):
    with pytest.raises(ConfigError, match=message):
        checked_class(path, "model.class_path", WHERE)


def test_lit_embed_lightning_plugins_and_the_users_own_classes_are_allowed(tmp_path, monkeypatch, user_classes):
    from lit_embed import plugins
    from lit_embed.embeddings import DenseEmbedding

    assert checked_class("lit_embed.embeddings.DenseEmbedding", "k", WHERE) is DenseEmbedding
    assert checked_class("pytorch_lightning.callbacks.ModelCheckpoint", "k", WHERE).__name__ == "ModelCheckpoint"
    code_module(tmp_path, "installed_plugin", tmp_path / "plugin imported")
    code_module(tmp_path, "users_own", tmp_path / "own imported")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="outside lit-embed"):
        checked_class("installed_plugin.Evil", "k", WHERE)
    monkeypatch.setattr(plugins, "load_plugins", lambda: [plugins.Plugin("dist", "1", "mine", "installed_plugin:x")])
    assert checked_class("installed_plugin.Evil", "k", WHERE).__module__ == "installed_plugin"
    with pytest.raises(ConfigError, match="outside lit-embed"):
        checked_class("users_own.Evil", "k", WHERE)
    recorded.name_user_classes({"model": {"init_args": {"embedding": {"class_path": "users_own.Evil"}}}})
    assert checked_class("users_own.Evil", "k", WHERE).__name__ == "Evil"
    with pytest.raises(ConfigError, match="outside lit-embed"):  # the user named that class, not its module
        checked_class("users_own.make", "k", WHERE)


def test_strings_stay_strings_where_a_string_is_expected(user_classes):
    """Dotted names are checked only where jsonargparse would import them (a class or a function is expected):
    file and folder names elsewhere are not class paths."""
    config = {
        "ckpt_path": "last.ckpt",
        "trainer": {"default_root_dir": "runs.old"},
        "data": {"class_path": "lit_embed.data.TaskDataModule", "init_args": {"task": {"name": "mine", "files": "rows.csv",
                                                                                       "labels": ["a.b"]},
                                                                              "tokenizer": "my.tokenizer"}},
        "model": {"class_path": "lit_embed.models.MaskedLM", "init_args": {"embedding": {
            "class_path": "lit_embed.embeddings.SubspaceEmbedding", "init_args": {"assignment": {
                "class_path": "lit_embed.embeddings.ClusterAssignment", "init_args": {"source": "matrix.npy"}}}}}},
    }
    assert recorded_config(config, WHERE, "", recorded.run_config_hints()) == config
    with pytest.raises(ConfigError, match=r"records unknown='matrix\.npy'"):  # where the type is not known: checked
        recorded_config({"unknown": "matrix.npy"}, WHERE, "")


def test_the_files_lit_embed_wrote_are_read_as_recorded(tmp_path):
    config = "model: {}\n"
    for beside in recorded.RUN_FOLDER_FILES:  # a run's folder: any one of what a run holds
        folder = tmp_path / f"run_{beside.strip('.')}"
        folder.mkdir()
        (folder / beside).write_text("{}")
        (folder / "config.yaml").write_text(config)
        assert written_by_lit_embed(folder / "config.yaml"), beside
    output = tmp_path / "compressed"
    output.mkdir()
    (output / "config.yaml").write_text(config)
    assert not written_by_lit_embed(output / "config.yaml")  # a user's config in a folder of its own
    (output / "report.json").touch()
    assert not written_by_lit_embed(output / "config.yaml")
    (output / "model.ckpt").touch()
    assert written_by_lit_embed(output / "config.yaml")
    moved = tmp_path / "moved.yaml"  # a compress output's config moved away keeps its header
    moved.write_text(f"{recorded.WRITTEN_HEADER} compress`: ...\n{config}")
    assert written_by_lit_embed(moved)
    (tmp_path / "mine.yaml").write_text(f"# my experiment\n{config}")
    assert not written_by_lit_embed(tmp_path / "mine.yaml") and not written_by_lit_embed(tmp_path / "missing.yaml")


def test_only_the_users_own_flag_lets_a_recorded_tokenizer_run_its_code(tmp_path, monkeypatch):
    """compress --trust_remote_code runs it; the output records no trust, and its documented next command needs the
    flag again on the command line."""
    import transformers.dynamic_module_utils as dynamic

    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "hf_modules"))  # where transformers copies the code
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran"
    tokenizer = code_tokenizer(tmp_path / "trusted_tok", marker)
    ckpt = recording(classifier_checkpoint(tmp_path / "base.ckpt"), tmp_path / "model.ckpt", trusting(tokenizer))
    out = tmp_path / "compressed"
    args = ["compress", "--ckpt", str(ckpt), "--out", str(out), "--retention", "0.5", "--k", "1"]
    assert main(args) == 2 and not marker.exists() and not out.exists()
    assert main([*args, "--trust_remote_code"]) == 0 and marker.exists()
    written = (out / "config.yaml").read_text()
    assert "trust_remote_code" not in json.dumps(yaml.safe_load(written))
    assert "--ckpt_path DIR/model.ckpt --data.init_args.trust_remote_code true" in written.splitlines()[1]
    test = ["test", "--config", str(out / "config.yaml"), "--ckpt_path", str(out / "model.ckpt"),
            "--trainer.limit_test_batches", "1", "--trainer.enable_progress_bar", "false"]
    assert main(test) == 2
    assert main([*test, "--data.init_args.trust_remote_code", "true"]) == 0


def test_a_sweep_gives_the_trust_its_compress_stage_sets_to_the_test_too(monkeypatch):
    from lit_embed.sweeps.launch import Launch, commands
    from lit_embed.sweeps.plan import load_sweep
    from tests.helpers import CONFIGS, REPO

    monkeypatch.chdir(REPO)
    sweep = load_sweep(CONFIGS / "sweeps" / "sparse_coding_jglue.yaml")
    for stage in (s for s in sweep.stages if s.command == "compress"):
        compress, test = commands(stage.runs[0], Launch())
        assert "--trust_remote_code" in compress and test[-2:] == ["--data.init_args.trust_remote_code", "true"]
    glue = load_sweep(REPO / "configs" / "sweeps" / "sparse_coding_glue.yaml")
    _, test = commands(next(s for s in glue.stages if s.command == "compress").runs[0], Launch())
    assert "--data.init_args.trust_remote_code" not in test


def test_a_run_folder_of_the_users_own_strategy_tests_with_their_config(tmp_path, monkeypatch):
    """The checkpoint names a class outside lit-embed; the config the user gives names it too, so it is taken."""
    code_module(tmp_path, "my_strategies", tmp_path / "imported")
    (tmp_path / "my_strategies.py").write_text((tmp_path / "my_strategies.py").read_text() + (
        "from lit_embed.embeddings import DenseEmbedding\n\n\nclass MyDense(DenseEmbedding):\n    pass\n"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    mine = {"class_path": "my_strategies.MyDense", "init_args": {"init_std": 0.02}}
    ckpt = recording(classifier_checkpoint(tmp_path / "base.ckpt"), tmp_path / "mine.ckpt",
                     lambda raw, model: (model.update(embedding=mine), raw["hyper_parameters"].update(embedding=mine),
                                         raw["lit_embed"].update(strategy=mine["class_path"])))
    (tmp_path / "own.yaml").write_text(yaml.safe_dump({
        "model": {"class_path": "lit_embed.models.SequenceClassifier", "init_args": {"task": "topics"}},
        "data": {"class_path": "lit_embed.data.TaskDataModule", "init_args": {"task": "topics", "max_length": 64}},
        "trainer": {"limit_test_batches": 1, "enable_progress_bar": False, "enable_model_summary": False}}))
    args = ["test", "--config", "own.yaml", "--ckpt_path", str(ckpt)]
    assert main(args) == 2 and not (tmp_path / "imported").exists()
    assert main([*args, "--model.init_args.embedding", json.dumps(mine)]) == 0


def test_a_compact_embedding_builds_only_what_a_recorded_config_may_name(tmp_path, monkeypatch, user_classes):
    """compress's HuggingFace output records its strategy in the safetensors header: load_compact reads it as recorded."""
    from safetensors.torch import save_file

    from lit_embed.compress import load_compact
    from lit_embed.embeddings import UnkEmbedding

    strategy = UnkEmbedding(20, 4, 5)
    header = {"vocab_size": "20", "hidden_size": "4"}
    path = tmp_path / "compressed_embedding.safetensors"
    save_file(strategy.state_dict(), str(path), metadata={**header, "lit_embed_strategy": json.dumps(strategy.config())})
    assert torch.equal(load_compact(tmp_path).full_weight(), strategy.full_weight())
    code_module(tmp_path, "compact_code", tmp_path / "ran")
    monkeypatch.syspath_prepend(str(tmp_path))
    foreign = {"class_path": "compact_code.Evil", "init_args": {}}
    save_file(strategy.state_dict(), str(path), metadata={**header, "lit_embed_strategy": json.dumps(foreign)})
    with pytest.raises(ConfigError, match=r"records embedding\.class_path='compact_code\.Evil'"):
        load_compact(path)
    assert not (tmp_path / "ran").exists()
