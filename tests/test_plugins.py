"""Plugins by entry point: an installed package's strategy, callback and task, named short in configs.

Each plugin is a tiny distribution written into a temporary folder (its package beside a ``.dist-info``
whose ``entry_points.txt`` declares ``[lit_embed.plugins]``) and put on the path: importlib.metadata finds
it there as it finds an installed one, and the shared environment stays as it was. The runs that import
the demo plugin are real ``lit-embed`` commands, all in one other process (its classes and task would
otherwise stay registered in this process); the loader's rules (order, once, errors, the switch) are checked here on
probe plugins that register nothing lasting.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import re
import sys
from pathlib import Path

import pytest

from lit_embed import plugins
from lit_embed.commands import main
from lit_embed.data import tasks
from lit_embed.embeddings import EmbeddingStrategy
from lit_embed.errors import ConfigError, PluginError
from tests.helpers import CONFIGS, REPO
from tests.helpers.cli import drive

DEMO = '''
"""A lit-embed plugin: a strategy, a callback and a task, registered by importing this module."""
import dataclasses
from pathlib import Path

import pytorch_lightning as pl
from torch import nn

from lit_embed.data.tasks import TASKS, register_task
from lit_embed.embeddings import EmbeddingStrategy


class FoldedEmbedding(EmbeddingStrategy):
    """Vocabulary ids folded onto ``rows`` shared vectors (the id modulo ``rows``)."""

    def __init__(self, vocab_size: int, hidden_size: int, rows: int = 1000) -> None:
        super().__init__(hidden_size=hidden_size, vocab_size=vocab_size)
        self.rows = rows
        self.table = nn.Embedding(rows, hidden_size)

    def forward(self, codes):
        return self.table(codes % self.rows)


class StepMarker(pl.Callback):
    """Writes the steps taken and the data module's task to ``out`` when training ends."""

    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_end(self, trainer, pl_module) -> None:
        task = getattr(trainer.datamodule, "task", None)
        Path(self.out).write_text(f"{trainer.global_step} {getattr(task, 'name', None)}")


register_task(dataclasses.replace(TASKS["topics"], name="demo_topics", source="litembed_demo_plugin"))
'''

#: The fine-tuning demo with the plugin's pieces, every class named by its short name.
FINETUNE = """
model:
  init_args:
    task: demo_topics
    checkpoint: null
    embedding:
      class_path: FoldedEmbedding
      init_args:
        rows: 500
data:
  class_path: TaskDataModule
  init_args:
    task: demo_topics
    tokenizer: all-MiniLM-L6-v2
    batch_size: 8
trainer:
  max_steps: 2
  limit_val_batches: 1
  limit_test_batches: 1
  enable_progress_bar: false
  enable_model_summary: false
  callbacks:
    - class_path: StepMarker
      init_args:
        out: marker.txt
"""


def write_distribution(root: Path, name: str, version: str, points: dict[str, str], modules: dict[str, str],
                       group: str = plugins.GROUP) -> Path:
    """An installed distribution under ``root``: its modules and a dist-info declaring ``points`` in ``group``."""
    root.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        (root / f"{module}.py").write_text(source)
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = [f"{point} = {value}" for point, value in points.items()]
    (info / "entry_points.txt").write_text("\n".join([f"[{group}]", *lines, ""]))
    return root


@pytest.fixture(scope="module")
def demo_site(tmp_path_factory) -> Path:
    return write_distribution(tmp_path_factory.mktemp("site"), "litembed-demo-plugin", "0.1", {"demo": "litembed_demo_plugin"},
                              {"litembed_demo_plugin": DEMO})


@pytest.fixture(scope="module")
def demo_commands(demo_site, tmp_path_factory) -> tuple[dict[str, dict], Path]:
    """``lit-embed params``, ``fit`` and ``plugins`` with the demo plugin installed, one after another in one fresh
    process (``cwd``, returned with them), as the console script runs each: by command, its status and output."""
    cwd = tmp_path_factory.mktemp("plugin_commands")
    (cwd / "plugin.yaml").write_text(FINETUNE)
    embedding = json.dumps({"class_path": "FoldedEmbedding", "init_args": {"rows": 500}})
    path = os.pathsep.join([str(REPO), str(demo_site), os.environ.get("PYTHONPATH", "")])
    return drive([
        ("params", ["params", "--config", str(CONFIGS / "demo.yaml"), "--json", "--model.init_args.embedding", embedding]),
        ("fit", ["fit", "--config", str(CONFIGS / "demo_finetune.yaml"), "--config", "plugin.yaml",
                 "--trainer.default_root_dir", "runs"]),
        ("plugins", ["plugins"]),
    ], cwd, {**os.environ, "PYTHONPATH": path}, cwd / "cases.json"), cwd


# -- the demo plugin, through the real CLI --------------------------------------------------------------


def test_params_counts_a_plugin_strategy_named_short(demo_commands):
    done = demo_commands[0]["params"]
    assert done["status"] == 0, done["stderr"][-3000:]
    report = json.loads(done["stdout"])
    assert report["strategy"] == "FoldedEmbedding" and report["embedding_params"] == 500 * 64  # the tiny backbone's d


def test_fit_uses_a_plugin_callback_data_module_and_task_named_short(demo_commands):
    done, cwd = demo_commands[0]["fit"], demo_commands[1]
    assert done["status"] == 0, done["stderr"][-3000:]
    assert (cwd / "marker.txt").read_text() == "2 demo_topics"
    recorded = (cwd / "runs/version_0/config.yaml").read_text()  # the run records the full class paths
    assert "class_path: litembed_demo_plugin.FoldedEmbedding" in recorded
    assert "class_path: litembed_demo_plugin.StepMarker" in recorded


def test_listing_names_each_plugin_and_what_it_adds(demo_commands):
    done = demo_commands[0]["plugins"]
    assert done["status"] == 0, done["stderr"][-3000:]
    assert done["stdout"].splitlines() == [
        "demo = litembed_demo_plugin (litembed-demo-plugin 0.1)",
        "  embedding strategies: FoldedEmbedding",
        "  callbacks: StepMarker",
        "  tasks: demo_topics",
    ]


# -- the loader's rules, in this process ------------------------------------------------------------------

PROBE = "import probe_log\nprobe_log.IMPORTED.append(__name__)\n"


@pytest.fixture
def fresh(monkeypatch):
    """A process that has loaded no plugin yet, with a task table of its own; probe modules forgotten after."""
    monkeypatch.setattr(plugins, "_loaded", None)
    monkeypatch.setattr(tasks, "TASKS", dict(tasks.TASKS))
    monkeypatch.delenv(plugins.SWITCH, raising=False)
    yield monkeypatch
    for name in [name for name in sys.modules if name.startswith(("probe_", "litembed_"))]:
        del sys.modules[name]
    if any(cls.__module__.startswith("probe_") for cls in plugins._subclasses(EmbeddingStrategy)):
        gc.collect()  # a probe's strategy leaves the subclasses jsonargparse resolves short names among
    assert not [cls for cls in plugins._subclasses(EmbeddingStrategy) if cls.__module__.startswith("probe_")]


def test_plugins_load_once_by_distribution_then_name(fresh, tmp_path):
    site = tmp_path / "site"
    write_distribution(site, "zeta-probe", "1.0", {"a": "probe_zeta"}, {"probe_zeta": PROBE})
    write_distribution(site, "Alpha_Probe", "2.0", {"b": "probe_alpha_b:NAME", "a": "probe_alpha_a"}, {
        "probe_alpha_a": PROBE + "from lit_embed.data.tasks import TASKS, register_task\n"
                                 "import dataclasses\n"
                                 "register_task(dataclasses.replace(TASKS['topics'], name='probe_task'))\n",
        "probe_alpha_b": PROBE + "NAME = 'an object: loading it imports its module'\n",
        "probe_log": "IMPORTED = []\n",
    })
    fresh.syspath_prepend(str(site))
    loaded = plugins.load_plugins()
    import probe_log

    assert probe_log.IMPORTED == ["probe_alpha_a", "probe_alpha_b", "probe_zeta"]
    assert [str(p) for p in loaded] == ["a = probe_alpha_a (Alpha_Probe 2.0)", "b = probe_alpha_b:NAME (Alpha_Probe 2.0)",
                                        "a = probe_zeta (zeta-probe 1.0)"]
    assert loaded[0].tasks == ("probe_task",) and tasks.get_task("probe_task").name == "probe_task"
    assert plugins.provided(loaded[0]) == {"tasks": ["probe_task"]}
    del sys.modules["probe_zeta"]
    assert plugins.list_plugins() == loaded and "probe_zeta" not in sys.modules  # once per process


def test_a_plugin_that_fails_to_import_exits_2_naming_it(fresh, tmp_path, capsys):
    site = write_distribution(tmp_path / "site", "litembed-broken-plugin", "0.2", {"broken": "litembed_broken"},
                              {"litembed_broken": "raise RuntimeError('the plugin is broken')\n"})
    fresh.syspath_prepend(str(site))
    assert main(["params", "--config", str(CONFIGS / "demo.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lit-embed: error: plugin 'broken' (litembed_broken) of litembed-broken-plugin 0.2 failed to "
                          "import (RuntimeError: the plugin is broken, at ")
    assert f"{site / 'litembed_broken.py'}:1)" in err and "LIT_EMBED_PLUGINS=0" in err
    assert main(["plugins"]) == 2 and "litembed-broken-plugin" in capsys.readouterr().err


@pytest.mark.parametrize(("modules", "cause"), [
    ({}, "ModuleNotFoundError: No module named 'litembed_gone'"),  # no place: the module is not there
    ({"litembed_gone": "def broken(:\n"}, "SyntaxError: .*, at .*litembed_gone.py:1"),
], ids=["no module", "syntax error"])
def test_a_module_that_is_missing_or_does_not_parse_is_named(fresh, tmp_path, modules, cause):
    fresh.syspath_prepend(str(write_distribution(tmp_path / "site", "litembed-gone", "1.0", {"gone": "litembed_gone"}, modules)))
    with pytest.raises(PluginError, match=rf"^plugin 'gone' \(litembed_gone\) of litembed-gone 1.0 failed to import "
                                          rf"\({cause}\): fix or uninstall litembed-gone"):
        plugins.load_plugins()


def test_LIT_EMBED_PLUGINS_0_imports_no_plugin(fresh, demo_site, capsys):
    fresh.syspath_prepend(str(demo_site))
    fresh.setenv(plugins.SWITCH, "0")
    assert plugins.load_plugins() == [] and "litembed_demo_plugin" not in sys.modules
    assert main(["plugins"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "plugins are off (LIT_EMBED_PLUGINS=0): 1 installed, none loaded",
        "  demo = litembed_demo_plugin (litembed-demo-plugin 0.1)",
    ]
    with pytest.raises(SystemExit) as exit_info:  # the short name is nobody's now
        main(["params", "--config", str(CONFIGS / "demo.yaml"), "--model.init_args.embedding", "FoldedEmbedding"])
    assert exit_info.value.code == 2 and "FoldedEmbedding" in capsys.readouterr().err
    assert "litembed_demo_plugin" not in sys.modules
    fresh.setattr(plugins, "_loaded", None)
    fresh.setenv(plugins.SWITCH, "maybe")
    with pytest.raises(ConfigError, match="LIT_EMBED_PLUGINS='maybe' is not known: set it to 0"):
        plugins.load_plugins()


# -- the typed groups: one name, one object, one owner ------------------------------------------------------

TASK = "import dataclasses\nfrom lit_embed.data.tasks import TASKS\nTASK = dataclasses.replace(TASKS['topics'], name='{name}')\n"
COMMAND = 'def run(argv):\n    """Say hello."""\n    print("hello", *argv)\n    return 0\n'


def test_two_plugins_giving_one_name_are_refused_naming_both(fresh, tmp_path, capsys):
    site = tmp_path / "site"
    for dist, module in (("probe-one", "probe_one"), ("probe-two", "probe_two")):
        write_distribution(site, dist, "1.0", {"probe_task": f"{module}:TASK"}, {module: TASK.format(name="probe_task")},
                           group=plugins.TASKS)
    fresh.syspath_prepend(str(site))
    with pytest.raises(PluginError, match=r"^probe-one 1.0 \(probe_one:TASK\) and probe-two 1.0 \(probe_two:TASK\) both "
                                          r"declare the task 'probe_task': uninstall one of them"):
        plugins.load_plugins()
    assert "probe_one" not in sys.modules and "probe_task" not in tasks.TASKS  # refused before anything was imported
    assert main(["params", "--config", str(CONFIGS / "demo.yaml")]) == 2
    assert "both declare the task 'probe_task'" in capsys.readouterr().err


def test_a_plugin_command_never_takes_a_built_in_or_another_plugins_name(fresh, tmp_path, capsys):
    site = tmp_path / "site"
    write_distribution(site, "probe-fit", "1.0", {"fit": "probe_fit:run"}, {"probe_fit": COMMAND}, group=plugins.COMMANDS)
    fresh.syspath_prepend(str(site))
    assert main(["--help"]) == 2 and main(["report", "--help"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == err[1] == ("lit-embed: error: probe-fit 1.0 declares the command 'fit' (probe_fit:run), which is "
                                "lit-embed's own (lit_embed.commands.lightning:fit): a plugin cannot "
                                "replace a built-in command; rename it in probe-fit's entry points, uninstall probe-fit, "
                                "or set LIT_EMBED_PLUGINS=0")
    fresh.setenv(plugins.SWITCH, "0")  # the way out it names
    assert main(["--help"]) == 0 and "probe_fit" not in sys.modules


def test_two_plugins_giving_one_command_name_are_refused_naming_both(fresh, tmp_path, capsys):
    site = tmp_path / "site"
    for dist, module in (("probe-a", "probe_a"), ("probe-b", "probe_b")):
        write_distribution(site, dist, "1.0", {"hello": f"{module}:run"}, {module: COMMAND}, group=plugins.COMMANDS)
    fresh.syspath_prepend(str(site))
    assert main(["hello"]) == 2
    assert "probe-a 1.0 (probe_a:run) and probe-b 1.0 (probe_b:run) both declare the command 'hello'" in \
        capsys.readouterr().err


def test_a_plugin_command_runs_and_a_broken_one_is_named(fresh, tmp_path, capsys):
    site = tmp_path / "site"
    write_distribution(site, "probe-hello", "1.0", {"hello": "probe_hello:run", "broken": "probe_broken:run"},
                       {"probe_hello": COMMAND, "probe_broken": "raise RuntimeError('not today')\n"}, group=plugins.COMMANDS)
    fresh.syspath_prepend(str(site))
    assert main(["--help"]) == 0
    assert "  hello     Say hello." in capsys.readouterr().out.splitlines()  # its docstring, without importing it
    assert "probe_hello" not in sys.modules
    assert main(["hello", "world"]) == 0 and capsys.readouterr().out == "hello world\n"
    assert main(["broken"]) == 2
    assert capsys.readouterr().err == ("lit-embed: error: command 'broken' (probe_broken:run) of probe-hello failed to "
                                       "import (RuntimeError: not today): fix or uninstall probe-hello, or set "
                                       "LIT_EMBED_PLUGINS=0\n")
    fresh.setenv(plugins.SWITCH, "0")
    assert main(["hello"]) == 2 and "unknown command 'hello'" in capsys.readouterr().err


@pytest.mark.parametrize(("group", "name", "source", "why"), [
    (plugins.TASKS, "probe_task", "TASK = len\n", "is a builtin_function_or_method, not a lit_embed.data.tasks.Task"),
    (plugins.TASKS, "other_name", TASK.format(name="probe_task"), "is the task 'probe_task': name the entry point 'probe_task'"),
    (plugins.TASKS, "topics", TASK.format(name="topics"), "cannot be registered (a task named 'topics' exists already"),
    (plugins.STRATEGIES, "Probe", "class Probe:\n    pass\nTASK = Probe\n",
     "is <class 'probe_kind.Probe'>, not a (concrete) subclass of lit_embed.embeddings.base.EmbeddingStrategy"),
    (plugins.STRATEGIES, "DenseEmbedding", "from lit_embed.embeddings import DenseEmbedding\n"
                                           "class DenseEmbedding(DenseEmbedding):\n    pass\nTASK = DenseEmbedding\n",
     "has the class name of lit_embed.embeddings.DenseEmbedding, so configs could not name it short"),
    (plugins.COMPRESSION_METHODS, "halve", "from lit_embed.compress.partial import UnkBackoff\n"
                                           "class Halve(UnkBackoff):\n    name = 'half'\nTASK = Halve\n",
     "is the compression method 'half': name the entry point 'half'"),
], ids=["not a task", "task under another name", "a taken task", "not a strategy", "a built-in strategy's name",
        "method under another name"])
def test_an_entry_point_that_is_not_what_its_group_takes_is_refused(fresh, tmp_path, group, name, source, why):
    from lit_embed.compress.methods import CompressionMethod

    fresh.setattr(CompressionMethod, "registry", dict(CompressionMethod.registry))
    site = write_distribution(tmp_path / "site", "probe-kind", "1.0", {name: "probe_kind:TASK"}, {"probe_kind": source},
                              group=group)
    fresh.syspath_prepend(str(site))
    kind = plugins.KIND[group]
    with pytest.raises(PluginError, match=rf"^{kind} '{name}' \(probe_kind:TASK\) of probe-kind 1.0 {re.escape(why)}"):
        plugins.load_plugins()


def test_register_task_refuses_a_taken_or_unreachable_name(fresh):
    topics = tasks.TASKS["topics"]
    with pytest.raises(ConfigError, match="a task named 'topics' exists already"):
        tasks.register_task(topics)
    with pytest.raises(ConfigError, match="task name 'My-Topics' is not the form configs find: name it 'my_topics'"):
        tasks.register_task(dataclasses.replace(topics, name="My-Topics"))
    assert tasks.register_task(dataclasses.replace(topics, name="my_topics")) is tasks.get_task("My-Topics")


@pytest.mark.parametrize("name", ["..", "../runs", ".hidden", "a/b", "/tmp/x", "a\\b", "topics\n", "_x", "x y"])
def test_a_task_name_is_never_a_path(fresh, name):
    """Task names name rows, sweep folders and cached files: a plugin's (register_task) and a config's own
    (TaskDefinition) are lower case letters, digits and _, so never '..', a path, a hidden or a control character."""
    topics = tasks.TASKS["topics"]
    with pytest.raises(ConfigError, match=f"task name {re.escape(repr(name))} is not the form configs find"):
        tasks.register_task(dataclasses.replace(topics, name=name))
    with pytest.raises(ConfigError, match=f"task name {re.escape(repr(name))} is not the form configs find"):
        tasks.define_task({"name": name, "files": "f.csv", "text_columns": ["text"], "label_column": "label"})
    assert name not in tasks.TASKS and tasks._key(name) not in tasks.TASKS


def test_docs_stanza_declares_the_group_that_is_loaded():
    from tests.helpers.cli import code_blocks, page

    tomllib = pytest.importorskip("tomllib")
    stanza = code_blocks("toml", page("extending"))
    assert tomllib.loads(stanza[0])["project"]["entry-points"][plugins.GROUP] == {"my_plugin": "my_plugin"}
