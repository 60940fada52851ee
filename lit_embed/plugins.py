"""Plugins: installed packages whose strategies, callbacks, data modules, models and tasks configs name.

A package declares an entry point in the group ``lit_embed.plugins`` (``[project.entry-points."lit_embed.plugins"]``
in its ``pyproject.toml``), naming a module (or an object in one). :func:`load_plugins` imports every one
of them, once per process, before ``lit-embed`` parses anything (:func:`lit_embed.commands.main` calls it; a DDP
rank runs the same command, so it loads them too). Importing is what registers: jsonargparse resolves a
short ``class_path`` (``class_path: MyStrategy``) among the imported subclasses of the type a config key
expects, and a plugin module's :func:`~lit_embed.data.tasks.register_task` calls add its tasks.

Importing a package runs its code: installing one that declares the entry point is the opt-in, and
``LIT_EMBED_PLUGINS=0`` in the environment is the opt-out (nothing is imported). A plugin that fails to
import is an error naming it, never skipped. ``lit-embed plugins`` lists what is installed and
what each plugin adds.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import re
import sys
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from lit_embed.data import tasks
from lit_embed.errors import ConfigError, PluginError

GROUP = "lit_embed.plugins"
IMPORTLIB = Path(importlib.__file__).parent
#: ``0`` (or ``false``, ``no``, ``off``) starts without plugins.
SWITCH = "LIT_EMBED_PLUGINS"
_OFF = ("0", "false", "no", "off")
_ON = ("", "1", "true", "yes", "on")
#: What configs name by class, as the listing groups a plugin's classes: (heading, module, base class).
KINDS = (
    ("embedding strategies", "lit_embed.embeddings", "EmbeddingStrategy"),
    ("models", "pytorch_lightning", "LightningModule"),
    ("data modules", "pytorch_lightning", "LightningDataModule"),
    ("callbacks", "pytorch_lightning", "Callback"),
    ("compression methods (--method)", "lit_embed.compress.methods", "CompressionMethod"),
)


@dataclass(frozen=True)
class Plugin:
    """One loaded entry point: its distribution, its name and value, and the tasks its import registered."""

    distribution: str
    version: str
    name: str
    value: str
    tasks: tuple[str, ...] = ()

    @property
    def package(self) -> str:
        """The top-level package of the entry point's module: the classes it adds live under it."""
        return self.value.partition(":")[0].split(".")[0].strip()

    def __str__(self) -> str:
        return f"{self.name} = {self.value} ({self.distribution} {self.version})"


_loaded: list[Plugin] | None = None


def enabled() -> bool:
    """Whether plugins load: unless ``LIT_EMBED_PLUGINS`` says ``0``."""
    value = os.environ.get(SWITCH, "")
    word = value.strip().lower()
    if word in _OFF or word in _ON:
        return word in _ON
    raise ConfigError(f"{SWITCH}={value!r} is not known: set it to 0 to start without plugins, or 1 (the default)")


def installed() -> list[importlib.metadata.EntryPoint]:
    """The ``lit_embed.plugins`` entry points of the installed distributions, by distribution then name."""
    points = importlib.metadata.entry_points(group=GROUP)
    return sorted(points, key=lambda point: (_normalised(_distribution(point)[0]), point.name))


def load_plugins() -> list[Plugin]:
    """Import every installed plugin (once per process; nothing where ``LIT_EMBED_PLUGINS=0``); what loaded.

    Raises:
        PluginError: a plugin failed to import; it names the distribution, the entry point and the cause.
    """
    global _loaded
    if _loaded is not None:
        return list(_loaded)
    if not enabled():
        _loaded = []
        return []
    loaded = []
    for point in installed():
        distribution, version = _distribution(point)
        before = set(tasks.TASKS)
        try:
            point.load()
        except Exception as error:
            raise PluginError(
                f"plugin {point.name!r} ({point.value}) of {distribution} {version} failed to import "
                f"({type(error).__name__}: {error}{_where(error)}): fix or uninstall {distribution} "
                f"(pip uninstall {distribution}), or set {SWITCH}=0 to run without plugins"
            ) from error
        added = tuple(name for name in tasks.TASKS if name not in before)
        loaded.append(Plugin(distribution, version, point.name, point.value, added))
    _loaded = loaded
    return list(loaded)


def list_plugins() -> list[Plugin]:
    """The plugins this process loaded (loading them first if it has not yet)."""
    return load_plugins()


def provided(plugin: Plugin) -> dict[str, list[str]]:
    """What ``plugin`` adds, by kind (``"embedding strategies"``, ..., ``"tasks"``): the names configs give.

    A class is named short where jsonargparse resolves it so (no module or class name starting with ``_``,
    and no other imported class of that kind with the same name), else by its full path. Abstract classes
    are left out: configs cannot build them.
    """
    found: dict[str, list[str]] = {}
    for heading, module, base in KINDS:
        classes = [cls for cls in _subclasses(getattr(importlib.import_module(module), base))
                   if not inspect.isabstract(cls) and "<locals>" not in cls.__qualname__]
        public = Counter(cls.__name__ for cls in classes if "._" not in _import_path(cls))
        names = []
        for cls in classes:
            if cls.__module__.split(".")[0] == plugin.package:
                path = _import_path(cls)
                if base == "CompressionMethod":  # found by the name it registers, not its class
                    names.append(cls.name)
                    continue
                names.append(cls.__name__ if "._" not in path and public[cls.__name__] == 1 else path)
        if names:
            found[heading] = sorted(set(names))
    if plugin.tasks:
        found["tasks"] = list(plugin.tasks)
    return found


def _subclasses(cls: type) -> list[type]:
    seen, stack = [], list(cls.__subclasses__())
    while stack:
        sub = stack.pop()
        if sub not in seen:
            seen.append(sub)
            stack.extend(sub.__subclasses__())
    return seen


def _import_path(cls: type) -> str:
    """The shortest dotted path that imports ``cls`` (a package that re-exports it names it)."""
    parts = cls.__module__.split(".")
    for end in range(1, len(parts) + 1):
        module = ".".join(parts[:end])
        if getattr(sys.modules.get(module), cls.__qualname__, None) is cls:
            return f"{module}.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def unloaded(point: importlib.metadata.EntryPoint) -> Plugin:
    """The plugin an entry point declares, as it is listed without loading it."""
    return Plugin(*_distribution(point), point.name, point.value)


def _distribution(point: importlib.metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(point, "dist", None)
    if dist is None:
        return "an unknown distribution", "?"
    return dist.metadata["Name"] or "an unnamed distribution", dist.version or "?"


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _where(error: BaseException) -> str:
    """``, at FILE:LINE`` of the failing line (a syntax error's own place), or nothing where the import
    machinery itself failed (no such module)."""
    if isinstance(error, SyntaxError) and error.filename:
        return f", at {error.filename}:{error.lineno}"
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if frame.filename != __file__
              and not frame.filename.startswith("<") and not Path(frame.filename).is_relative_to(IMPORTLIB)]
    return f", at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""

