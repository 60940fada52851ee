"""Every command's --help answers before torch or Lightning is imported: the light commands' by construction, the
heavy ones' (fit, validate, test, predict, compress and its methods) from a cache built on first use, which holds what
the commands themselves print on whatever versions are installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lit_embed.commands import helptext, main

#: Prints what ``lit-embed fit --help`` and then every cached help print, the heavy modules imported meanwhile, and
#: then, with the cache out of the way, what each command's own parser prints (in the same fresh process: what the
#: cache was built in, lit-embed and the installed plugins, and nothing else).
CACHED_THEN_LIVE = """
import contextlib, io, json, sys
import lit_embed.commands
from lit_embed.commands import main, helptext
def said(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        assert main(argv) == 0
    return out.getvalue()
first = said(["fit", "--help"])  # builds the cache where there is none
names = list(helptext.cached_help().texts)
cached = {name: said([*name.split(), "--help"]) for name in names}
heavy = sorted(m for m in ("torch", "pytorch_lightning", "transformers") if m in sys.modules)
lit_embed.commands.cached = lambda argv: None
from lit_embed.plugins import load_plugins
load_plugins()
live = {" ".join(argv[:-1]): said(argv) for argv in helptext.helped()}
print(json.dumps({"first": first, "cached": cached, "heavy": heavy, "live": live}))
"""


def run(code: str, **env: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": str(helptext.COLUMNS), **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()[-1]


def test_the_cached_help_is_the_live_help_and_answers_without_torch():
    """On the versions installed here: the first --help builds the cache where this session has not yet (the test
    session's private cache, shared with the early checks' tests: one build), then every heavy command's help answers
    from it without importing torch, Lightning or transformers, and says what the command's own parser says."""
    found = json.loads(run(CACHED_THEN_LIVE))
    cached, live = found["cached"], found["live"]
    assert found["heavy"] == []
    assert cached.keys() == live.keys()
    assert {"fit", "validate", "test", "predict", "compress", "compress --method svd"} <= set(live)
    for name, text in live.items():
        assert cached[name] == text, name
    assert found["first"] == live["fit"] and "usage: lit-embed" in live["fit"]


def stand_in(**texts: str) -> helptext.Help:
    return helptext.Help({"fit": "usage: lit-embed fit\n  --config CONFIG\n", **texts}, ["svd"])


@pytest.mark.parametrize("damage", ["truncated", "edited", "another key's", "not json", "a folder"])
def test_a_damaged_or_partial_cache_is_never_trusted_and_is_built_again(damage, tmp_path, monkeypatch):
    monkeypatch.setenv("LIT_EMBED_CACHE", str(tmp_path))
    found = helptext.key()
    path = helptext.store(found, stand_in())
    assert helptext.read(path, found) == stand_in()
    text = path.read_text()
    if damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "edited":
        path.write_text(text.replace("--config CONFIG", "--config CONFIG --evil"))
    elif damage == "another key's":
        path.write_text(text.replace(json.dumps(sys.version), json.dumps("2.7.18")))
    elif damage == "not json":
        path.write_bytes(b"\x00\xff" * 10)
    else:
        path.unlink()
        path.mkdir()
    assert helptext.read(path, found) is None
    if path.is_dir():
        path.rmdir()
    built = []

    def build(*args, **kwargs):  # what helptext.write does in a fresh process, without its imports
        built.append(args[0])
        helptext.store(helptext.key(), stand_in(validate="usage: lit-embed validate\n"))
        return subprocess.CompletedProcess(args[0], 0)

    monkeypatch.setattr(helptext.subprocess, "run", build)
    assert helptext.cached_help() == stand_in(validate="usage: lit-embed validate\n")
    assert built == [[sys.executable, "-c", helptext.BUILD]]
    assert helptext.cached(["validate", "--help"]) == "usage: lit-embed validate\n" and len(built) == 1


def test_a_cache_that_cannot_be_built_leaves_the_answer_to_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LIT_EMBED_CACHE", str(tmp_path))
    monkeypatch.setattr(helptext.subprocess, "run", lambda *args, **kwargs: subprocess.CompletedProcess(args[0], 1))
    assert helptext.cached_help() is None and helptext.cached(["fit", "--help"]) is None
    monkeypatch.setenv("LIT_EMBED_PLUGINS", "maybe")  # the command says what is wrong with it
    assert helptext.cached_help() is None


def test_the_key_holds_every_version_the_help_depends_on_and_the_plugins(tmp_path, monkeypatch):
    monkeypatch.setenv("LIT_EMBED_CACHE", str(tmp_path))
    found = helptext.key()
    assert {"python", "lit-embed", "pytorch-lightning", "jsonargparse", "source", "plugins"} == set(found)
    here = helptext.cache_file(found)
    monkeypatch.setattr(helptext, "version", lambda name: "9.9" if name == "jsonargparse" else "1.0")
    assert helptext.cache_file(helptext.key()) != here
    monkeypatch.undo()
    monkeypatch.setenv("LIT_EMBED_CACHE", str(tmp_path))
    monkeypatch.setattr(helptext, "installed", lambda: [])
    monkeypatch.setattr(helptext, "enabled", lambda: True)
    none = helptext.cache_file(helptext.key())
    from importlib.metadata import EntryPoint

    point = EntryPoint("hello", "my_plugin.hello:main", "lit_embed.commands")
    monkeypatch.setattr(helptext, "installed", lambda: [point])
    assert helptext.cache_file(helptext.key()) != none


@pytest.mark.parametrize("argv, name", [
    (["fit", "--help"], "fit"), (["compress", "-h"], "compress"), (["compress", "--method", "svd", "--help"],
                                                                     "compress --method svd"),
    (["compress", "--method=fit", "-h"], "compress --method fit"), (["fit", "--config", "x.yaml", "--help"], None),
    (["fit", "--config", "x.yaml"], None), (["fit"], None),
])
def test_a_help_with_a_config_is_the_live_one(argv, name):
    assert helptext.name(argv) == name


def test_help_of_a_light_command_is_its_own(capsys, monkeypatch):
    monkeypatch.setattr(helptext, "cached_help", lambda: pytest.fail("a light command's help is not cached"))
    with pytest.raises(SystemExit):
        main(["export", "--help"])
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


@pytest.mark.parametrize("library, installed, supported", [
    ("pytorch_lightning", "2.7.0", "pytorch-lightning>=2.6,<2.7"), ("pytorch_lightning", "2.5.5", "pytorch-lightning>=2.6,<2.7"),
    ("jsonargparse", "4.20.0", "jsonargparse>=4.35"),
])
def test_a_version_lit_embed_does_not_support_fails_at_import_naming_it_and_the_fix(library, installed, supported,
                                                                                    tmp_path):
    """The library's metadata says another version (a dist-info found first on the path, as pip leaves one): importing
    the commands fails with one line naming the installed version, the range and the fix; nothing is skipped."""
    info = tmp_path / f"{library}-{installed}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {library.replace('_', '-')}\nVersion: {installed}\n")
    done = subprocess.run([sys.executable, "-c", "import lit_embed.commands"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    name = library.replace("_", "-")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (f"ImportError: {name} {installed} is installed, but lit-embed supports "
                                            f'{supported} only: pip install "{supported}"')

