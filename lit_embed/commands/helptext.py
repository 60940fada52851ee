"""Each command's ``--help``, answered from a copy shipped with lit-embed, so that it comes before torch and
Lightning are imported (6-7 s on an idle machine, a minute on a busy one, for text that never changes).

A copy is the command's own help, written by ``python -m lit_embed.commands.help_copies`` at a fixed width
(:data:`COLUMNS`) and headed by the versions it was written with: it is used only where lit-embed, Lightning and
jsonargparse are those versions and no plugin is installed (the live help lists the classes a plugin adds), and
the live help answers otherwise. ``tests/test_help.py`` holds every copy to
the live help, so a change of options that forgets to write them again fails there.
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import importlib.util
import re
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from lit_embed.errors import ConfigError
from lit_embed.plugins import enabled, installed

FOLDER = Path(__file__).with_name("help")
#: The width the copies are written at (argparse wraps help to the terminal's width).
COLUMNS = 100
#: What a command's help is made of, besides lit-embed itself.
LIBRARIES = ("pytorch-lightning", "jsonargparse")


def versions() -> str:
    found = []
    for name in ("lit-embed", *LIBRARIES):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} missing")
    return ", ".join(found)


def key(argv: list[str]) -> str | None:
    """The copy that answers ``lit-embed ARGV`` (``fit --help``, ``data check -h``, ``compress --method svd --help``),
    ``None`` for anything else."""
    if len(argv) < 2 or argv[-1] not in ("-h", "--help"):
        return None
    words = argv[:-1]
    if len(words) == 1 or words == ["data", "check"]:
        return "_".join(words)
    method = words[2:] if words[:2] == ["compress", "--method"] else [words[1].removeprefix("--method=")] \
        if words[0] == "compress" and len(words) == 2 and words[1].startswith("--method=") else []
    return f"compress_method_{method[0]}" if len(method) == 1 and method[0].isidentifier() else None


def copied_methods() -> list[str]:
    """The compression methods whose help is shipped: lit-embed's own."""
    return sorted(path.stem.removeprefix("compress_method_") for path in FOLDER.glob("compress_method_*.txt"))


def shipped(argv: list[str]) -> str | None:
    """The shipped help that answers ``argv``, where one exists for these versions."""
    name = key(argv)  # first: every command asks, and only a --help reads the installed packages' metadata
    return None if name is None else copy(name)


def copy(name: str, plugins_checked: bool = True) -> str | None:
    """The shipped help of ``name`` (``fit``, ``data_check``) where it holds for these versions and no plugin is
    installed. ``plugins_checked=False`` leaves out the plugins' check (reading every installed package's metadata):
    for a caller that checks :func:`plugins_installed` only where it needs the answer."""
    path = FOLDER / f"{name}.txt"
    if not path.is_file() or (plugins_checked and plugins_installed()):
        return None
    header, _, text = path.read_text().partition("\n")
    return text if header == f"# {versions()}" else None


def summary(target: str) -> str:
    """The line of help of a command's function (``"module:function"``): the first paragraph of its docstring, read
    from its source without importing it (a command's module imports torch; ``lit-embed --help`` must not); empty
    where the source cannot be read."""
    module, _, function = target.partition(":")
    path = _source(module.strip())
    if path is None:
        return ""
    return _docstrings(path).get(function.strip(), "").split("\n\n")[0].replace("\n", " ").strip()


def _source(module: str) -> Path | None:
    """The ``.py`` file of ``module``, found as the import system would find it, without running any of its packages."""
    parts = module.split(".")
    loaded = sys.modules.get(module)
    spec = getattr(loaded, "__spec__", None) if loaded is not None else None
    try:
        if spec is None:
            spec = importlib.util.find_spec(parts[0])  # a top-level name: found, nothing run
            for end in range(1, len(parts)):
                spec = spec and importlib.machinery.PathFinder.find_spec(".".join(parts[: end + 1]),
                                                                          spec.submodule_search_locations)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") else None


@functools.cache
def _docstrings(path: Path) -> dict[str, str]:
    """The docstrings of a source file's top-level functions, by name."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    return {node.name: ast.get_docstring(node) or "" for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def plugins_installed() -> bool:
    """Whether a plugin is installed and switched on (the live help lists the classes it adds). A switch value
    :func:`~lit_embed.plugins.enabled` does not know counts as on: the live path then says what is wrong with it."""
    try:
        switched_on = enabled()
    except ConfigError:
        return True
    return switched_on and bool(installed())


OPTION = re.compile(r"^  (-.*?)(?: {2,}|$)", re.MULTILINE)


def options(text: str) -> list[str]:
    """The long options a help text lists: those on each option's own line (``  -c CONFIG, --config CONFIG``), not
    those its descriptions mention."""
    words = (part.split()[0] for line in OPTION.findall(text) for part in line.split(", ") if part.strip())
    return [word for word in words if word.startswith("--")]
