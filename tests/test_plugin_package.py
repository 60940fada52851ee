"""The test plugin package (tests/plugin_pkg): one strategy, one compression method, one task and one command, each
added through its entry-point group, found, listed, used from the CLI and held to lit-embed's contract tests.

The package is put on the path beside the dist-info an install would write from its own pyproject.toml, so
importlib.metadata finds its entry points as it finds an installed plugin's, on any machine and with nothing
installed; what its import registers in this process is taken out again after the module's tests.
"""

from __future__ import annotations

import gc
import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from lit_embed import plugins
from lit_embed.commands import main
from lit_embed.compress.methods import CompressionMethod
from lit_embed.compress.model_io import load_compact
from lit_embed.data import tasks
from lit_embed.testing import check_command, check_compression_method, check_strategy, check_task
from tests.helpers import CONFIGS, REPO

tomllib = pytest.importorskip("tomllib")

PACKAGE = REPO / "tests" / "plugin_pkg"
SAMPLE_CORPUS = str(REPO / "lit_embed" / "data" / "sample" / "corpus.txt")
#: The fine-tuning demo on the plugin's task, with the plugin's strategy named short.
FINETUNE = """
model:
  init_args:
    checkpoint: null
    embedding:
      class_path: FoldedEmbedding
      init_args:
        rows: 500
data:
  init_args:
    task: sample_topics
    tokenizer: all-MiniLM-L6-v2
    batch_size: 8
    max_length: 32
trainer:
  max_steps: 2
  limit_val_batches: 1
  limit_test_batches: 1
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
"""


def site_of(root: Path) -> Path:
    """The package as an install leaves it: its folder, and a dist-info whose entry_points.txt its pyproject.toml
    declares."""
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
    shutil.copytree(PACKAGE / "litembed_testplugin", root / "litembed_testplugin")
    info = root / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    sections = [f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items())
                for group, points in project["entry-points"].items()]
    (info / "entry_points.txt").write_text("\n".join(sections))
    return root


@pytest.fixture(scope="module")
def testplugin(tmp_path_factory):
    """The plugin on the path for this module's tests; its task, method and modules gone after them."""
    site = site_of(tmp_path_factory.mktemp("site"))
    known_tasks, known_methods = set(tasks.TASKS), set(CompressionMethod.registry)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(site))
        patch.delenv(plugins.SWITCH, raising=False)
        patch.setattr(plugins, "_loaded", None)
        importlib.invalidate_caches()
        yield site
    for name in set(tasks.TASKS) - known_tasks:
        del tasks.TASKS[name]
    for name in set(CompressionMethod.registry) - known_methods:
        del CompressionMethod.registry[name]
    for name in [name for name in sys.modules if name.startswith("litembed_testplugin")]:
        del sys.modules[name]
    gc.collect()  # its strategy class, in the subclasses jsonargparse resolves short names among (no other has its name)


@pytest.fixture
def plugin(testplugin, monkeypatch):
    """The plugin loaded afresh (the test session gives every test the task table it started with)."""
    monkeypatch.setattr(plugins, "_loaded", None)
    return testplugin


def test_each_kind_is_found_and_listed(plugin, capsys):
    assert main(["plugins"]) == 0
    version = "(litembed-testplugin 0.1.0)"
    assert capsys.readouterr().out.splitlines() == [
        f"strategy FoldedEmbedding = litembed_testplugin.strategies:FoldedEmbedding {version}",
        f"compression method fold = litembed_testplugin.methods:Fold {version}",
        f"task sample_topics = litembed_testplugin.tasks:SAMPLE_TOPICS {version}",
        f"command vocab = litembed_testplugin.commands:vocab {version}: Print the tokens and ids a tokenizer gives each "
        f"text (a plugin's command).",
    ]
    assert main(["--help"]) == 0
    assert "  vocab     Print the tokens and ids a tokenizer gives each text (a plugin's command)." in \
        capsys.readouterr().out.splitlines()
    assert "litembed_testplugin.commands" not in sys.modules  # listed and helped without importing it


def test_its_pieces_pass_the_contract_tests(plugin):
    plugins.load_plugins()
    from litembed_testplugin.strategies import FoldedEmbedding

    check_strategy(FoldedEmbedding, vocab_size=30522)  # export included: the folder carries the plugin's code
    assert check_task("sample_topics").source == "litembed-testplugin"
    check_command("vocab")
    fitted = check_compression_method("fold")  # found by its entry point's name
    assert type(fitted[None]) is FoldedEmbedding


def test_fit_with_its_strategy_and_task(plugin, tmp_path, monkeypatch):
    (tmp_path / "plugin.yaml").write_text(FINETUNE)
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--config", str(CONFIGS / "demo_finetune.yaml"), "--config", "plugin.yaml",
                 "--trainer.default_root_dir", "runs"]) == 0
    recorded = (tmp_path / "runs/config.yaml").read_text()  # the run records the full class path
    assert "class_path: litembed_testplugin.strategies.FoldedEmbedding" in recorded and "task: sample_topics" in recorded
    results = json.loads(next((tmp_path / "runs").rglob("results.json")).read_text())
    assert results["task"] == "sample_topics"


def test_compress_with_its_method(plugin, minilm_matrix, tmp_path):
    out = tmp_path / "out"
    assert main(["compress", "--ckpt", "all-MiniLM-L6-v2", "--data", SAMPLE_CORPUS, "--method", "fold",
                 "--retention", "0.8", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    strategy = load_compact(out / "hf")
    assert report["method"] == "fold" and type(strategy).__name__ == "FoldedEmbedding"
    rows = strategy.rows
    assert rows == report["vocabulary"]["common"]
    for row in (0, 101, rows - 1):  # each row is the mean of the MiniLM rows folded onto it
        expected = minilm_matrix[row::rows].double().mean(0).float()
        assert torch.allclose(strategy.table.weight[row].detach(), expected, atol=1e-6)


def test_its_command_runs(plugin, capsys):
    assert main(["vocab", "hello world"]) == 0
    assert capsys.readouterr().out == "hello:7592 world:2088\n"
    with pytest.raises(SystemExit) as stop:  # as every command's argument error, through main
        main(["vocab"])
    assert stop.value.code == 2
    assert "lit-embed vocab: error: the following arguments are required: TEXT" in capsys.readouterr().err
