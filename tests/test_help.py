"""Every command's --help answers from its shipped copy, before torch or Lightning is imported, and says what the
command itself says."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lit_embed.commands import help_copies, helptext, main

WRITTEN_FOR = (helptext.FOLDER / "fit.txt").read_text().partition("\n")[0].removeprefix("# ")
same_versions = pytest.mark.skipif(WRITTEN_FOR != helptext.versions(), reason=(
    f"the help copies are written for {WRITTEN_FOR}; this machine has {helptext.versions()} (the live help answers)"))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The copies as a fresh process writes them (this one has imported the tests' own callbacks, which the live
    help would list)."""
    folder = tmp_path_factory.mktemp("help")
    subprocess.run([sys.executable, "-m", "lit_embed.commands.help_copies", str(folder)], check=True, timeout=300,
                   capture_output=True, env={**os.environ, "LIT_EMBED_PLUGINS": "0"})
    return folder


@same_versions
@pytest.mark.parametrize("argv", help_copies.helped(), ids=lambda argv: " ".join(argv[:-1]))
def test_each_shipped_help_is_what_the_command_says(argv, written, monkeypatch):
    """Fails when a command's options change and the copies were not written again: run
    ``python -m lit_embed.commands.help_copies``."""
    monkeypatch.setenv("LIT_EMBED_PLUGINS", "0")  # a test plugin may be installed here
    name = helptext.key(argv)
    assert helptext.shipped(argv) == (written / f"{name}.txt").read_text().partition("\n")[2]


@same_versions
@pytest.mark.parametrize("argv", [["fit", "--help"], ["compress", "-h"], ["data", "check", "--help"],
                                  ["compress", "--method", "svd", "--help"], ["compress", "--method=fit", "-h"]])
def test_help_answers_without_importing_torch_or_lightning(argv):
    code = (f"import sys; from lit_embed.commands import main; status = main({argv!r}); "
            "heavy = sorted(m for m in ('torch', 'pytorch_lightning', 'transformers') if m in sys.modules); "
            "print(status, heavy)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LIT_EMBED_PLUGINS": "0"})  # none installed, as on a fresh machine
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stderr[-2000:]
    assert "usage: lit-embed" in done.stdout


def test_help_of_other_versions_is_not_taken_from_the_copy(monkeypatch, capsys):
    monkeypatch.setattr(helptext, "versions", lambda: "lit-embed 0.0.0, pytorch-lightning 0.0, jsonargparse 0.0")
    assert helptext.shipped(["export", "--help"]) is None
    assert helptext.key(["fit", "--config", "x.yaml", "--help"]) is None  # a config's help: the live one
    with pytest.raises(SystemExit):
        main(["export", "--help"])  # the command's own, live
    assert "usage: lit-embed export" in capsys.readouterr().out


def test_every_other_command_module_imports_no_torch():
    """Each command but those that build their parser from the model's classes (``HEAVY``: their help is cached)
    imports torch, Lightning and transformers only once its arguments parse, so its ``--help`` and its typos are fast."""
    from lit_embed.commands import COMMANDS, HEAVY

    light = sorted({command.target.partition(":")[0] for name, command in COMMANDS.items() if name not in HEAVY})
    assert {"lit_embed.commands.params", "lit_embed.commands.analyze", "lit_embed.commands.report"} <= set(light)
    code = ("import importlib, sys\n"
            f"for module in {light!r}:\n"
            "    importlib.import_module(module)\n"
            "    print(module, sorted(m for m in ('torch', 'pytorch_lightning', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LIT_EMBED_PLUGINS": "0"})
    assert done.stdout.splitlines() == [f"{module} []" for module in light], done.stderr[-2000:]
