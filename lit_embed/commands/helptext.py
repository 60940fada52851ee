"""The help of the commands whose parser is built from the model's classes (fit, validate, test, predict, compress and
each compression method: :data:`~lit_embed.commands.HEAVY`), kept in lit-embed's cache folder once a command first
asks for it, so that ``--help`` and a mistyped option answer before torch and Lightning are imported (6-7 s on an idle
machine, a minute on a busy one, for text that changes only with what is installed).

What is cached is what the commands themselves print, written by a fresh process (:func:`write`: it loads the
installed plugins and nothing else, since the live help lists every imported subclass of what an option takes) at a
fixed width (:data:`COLUMNS`). Its key is everything that can change it: lit-embed's version and source files,
Python's, pytorch-lightning's and jsonargparse's versions, and the installed plugins' entry points; another key is
another file. The file is written atomically and read back only when it is
exactly what was written for this key: a damaged, partial or edited one is built again, never trusted.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from lit_embed.errors import ConfigError
from lit_embed.plugins import enabled, installed, unloaded

#: The width the help is written at (argparse wraps help to the terminal's width).
COLUMNS = 100
#: What the header of a cached file says it is (changed if the layout does).
FORMAT = "lit-embed help 1"
#: What a command's help is made of, besides lit-embed itself.
LIBRARIES = ("pytorch-lightning", "jsonargparse")
METHOD = "compress --method "
#: What the fresh process that builds the cache runs.
BUILD = "from lit_embed.commands.helptext import write; write()"
SOURCE = Path(__file__).parents[1]


def key() -> dict[str, object]:
    """Everything the cached help depends on (read from metadata and file sizes and times: nothing is imported)."""
    found: dict[str, object] = {"python": sys.version}
    for name in ("lit-embed", *LIBRARIES):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    source = hashlib.sha256()
    for path in sorted(SOURCE.rglob("*.py")):  # an edited checkout changes the options, not the version
        stat = path.stat()
        source.update(f"{path.relative_to(SOURCE)} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    found["source"] = source.hexdigest()
    found["plugins"] = [str(unloaded(point)) for point in installed()] if enabled() else []
    return found


def cache_file(found: dict[str, object]) -> Path:
    """Where the help cached for ``found`` (a :func:`key`) is."""
    from lit_embed.storage.cache import cache_folder

    return cache_folder() / "help" / f"{_digest(found)[:20]}.json"


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Help:
    """What the cache holds: each help text by :func:`name`, and the compression methods that are lit-embed's own (the
    options all of them take are the command's own, as compress's parser says)."""

    texts: dict[str, str]
    own_methods: list[str]

    @property
    def methods(self) -> list[str]:
        """Every compression method whose help is cached, the plugins' included."""
        return sorted(text.removeprefix(METHOD) for text in self.texts if text.startswith(METHOD))

    def method(self, method: str) -> str | None:
        return self.texts.get(f"{METHOD}{method}")


def read(path: Path, found: dict[str, object]) -> Help | None:
    """The help cached at ``path`` for ``found``; ``None`` for anything else (missing, damaged, another key's)."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        cached = Help(document["texts"], document["own_methods"])
        exact = document["format"] == FORMAT and document["key"] == found and document["sha256"] == _digest(asdict(cached))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    plain = isinstance(cached.texts, dict) and all(isinstance(text, str) for text in cached.texts.values())
    return cached if exact and plain else None


def cached_help(build: bool = True) -> Help | None:
    """The cached help, built on first use (by a fresh process: seconds) unless ``build`` is false; ``None`` where it is
    not there to read or cannot be built (a plugin that fails to import: the command itself then says why)."""
    try:
        found = key()
    except ConfigError:  # LIT_EMBED_PLUGINS set to what it does not know: the command says so
        return None
    path = cache_file(found)
    cached = read(path, found)
    if cached is None and build:
        path_here = os.pathsep.join(folder or os.curdir for folder in sys.path)  # the plugins this process finds
        built = subprocess.run([sys.executable, "-c", BUILD], capture_output=True, check=False,
                               env={**os.environ, "COLUMNS": str(COLUMNS), "PYTHONPATH": path_here})
        cached = read(path, found) if built.returncode == 0 else None
    return cached


def name(argv: list[str]) -> str | None:
    """The cached help that answers ``lit-embed ARGV`` (``fit --help``, ``compress --method svd -h``, ``compress
    --method=svd --help``: ``fit``, ``compress --method svd``), ``None`` for anything else."""
    if len(argv) < 2 or argv[-1] not in ("-h", "--help"):
        return None
    words = argv[:-1]
    if words[:1] == ["compress"] and len(words) == 2 and words[1].startswith("--method="):
        words = ["compress", "--method", words[1].removeprefix("--method=")]
    if len(words) == 1 or (words[:2] == ["compress", "--method"] and len(words) == 3 and words[2].isidentifier()):
        return " ".join(words)
    return None


def cached(argv: list[str]) -> str | None:
    """The cached help that answers ``argv``, where ``argv`` asks for one that is cached (``None``: the live help)."""
    from lit_embed.commands import HEAVY

    wanted = name(argv)  # first: every command asks, and only a --help of a heavy command reads the cache
    if wanted is None or argv[0] not in HEAVY:
        return None
    found = cached_help()
    return None if found is None else found.texts.get(wanted)


def live(argv: list[str]) -> str:
    """What the command itself prints for ``argv`` (imports it, and all it imports)."""
    import io
    from contextlib import redirect_stdout

    from lit_embed.commands import command

    out = io.StringIO()
    with redirect_stdout(out):
        try:
            command(argv[0])(argv[1:])
        except SystemExit:
            pass
    return out.getvalue()


def helped() -> list[list[str]]:
    """Every ``--help`` the cache holds: each heavy command's, and compress's for each compression method (each takes
    options of its own), the plugins' included (imports them: call after :func:`~lit_embed.plugins.load_plugins`)."""
    from lit_embed.commands import HEAVY
    from lit_embed.compress.methods import CompressionMethod

    return [[command, "--help"] for command in HEAVY] + \
        [["compress", "--method", method, "--help"] for method in sorted(CompressionMethod.registry)]


def write() -> Path:
    """Cache the live help of :func:`helped` under this process's :func:`key`, atomically."""
    from lit_embed.compress.methods import CompressionMethod
    from lit_embed.plugins import load_plugins

    found = key()
    load_plugins()
    own = sorted(name for name, cls in CompressionMethod.registry.items() if cls.__module__.startswith("lit_embed."))
    return store(found, Help({" ".join(argv[:-1]): live(argv) for argv in helped()}, own))


def store(found: dict[str, object], cached: Help) -> Path:
    """Cache ``cached`` as the help of :func:`key` ``found``, atomically (a reader sees the whole file or none)."""
    from lit_embed.storage.files import write_json_atomic

    document = {"format": FORMAT, "key": found, "sha256": _digest(asdict(cached)), **asdict(cached)}
    return write_json_atomic(cache_file(found), document)


def summary(target: str) -> str:
    """The line of help of a command's function (``"module:function"``): the first paragraph of its docstring, read
    from its source without importing it (a command's module may import torch; ``lit-embed --help`` must not); empty
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


OPTION = re.compile(r"^  (-.*?)(?: {2,}|$)", re.MULTILINE)


def options(text: str) -> list[str]:
    """The long options a help text lists: those on each option's own line (``  -c CONFIG, --config CONFIG``), not
    those its descriptions mention."""
    words = (part.split()[0] for line in OPTION.findall(text) for part in line.split(", ") if part.strip())
    return [word for word in words if word.startswith("--")]
