"""Plugins: installed packages that add strategies, compression methods, tasks, commands, and the callbacks, data
modules and models configs name.

A package declares entry points in its ``pyproject.toml``, one group per kind of thing, each entry naming the one
object it adds under the name configs and the command line give it:

- ``lit_embed.strategies``: ``FoldedEmbedding = my_plugin.strategies:FoldedEmbedding``, an
  :class:`~lit_embed.embeddings.EmbeddingStrategy` subclass named by its class name (``class_path: FoldedEmbedding``);
- ``lit_embed.compression_methods``: ``halve = my_plugin.methods:Halve``, a
  :class:`~lit_embed.compress.methods.CompressionMethod` subclass named by its ``name`` (``--method halve``);
- ``lit_embed.tasks``: ``my_topics = my_plugin.tasks:MY_TOPICS``, a :class:`~lit_embed.data.tasks.Task` of that name;
- ``lit_embed.commands``: ``hello = my_plugin.hello:main``, a function taking the arguments after the command's name
  and returning the exit status; its docstring's first paragraph is its line in ``lit-embed --help``, read without
  importing it. lit-embed declares its own commands in this group (its ``pyproject.toml``), so the dispatcher's
  table (:data:`lit_embed.commands.COMMANDS`) is built the same way for both.
- ``lit_embed.plugins``: a module (or an object in one) imported for what it defines: callbacks, data modules and
  models, which jsonargparse finds by their short class name among the imported subclasses of what a config key
  takes, and tasks its :func:`~lit_embed.data.tasks.register_task` calls add. The first group lit-embed read, kept as
  the one for these kinds, which need no table of names.

:func:`load_plugins` imports every entry point but the commands (a command is imported when it runs), once per
process, before ``lit-embed`` parses anything (:func:`lit_embed.commands.main` calls it; a DDP rank runs the same
command, so it loads them too), and registers each typed one after checking it is what its group says. A name is
given once: two distributions declaring one name in a group, or a plugin's command named as one of lit-embed's, is
an error naming both, never one silently taking the other's place.

Importing a package runs its code: installing one that declares the entry points is the opt-in, and
``LIT_EMBED_PLUGINS=0`` in the environment is the opt-out (nothing is imported, and only lit-embed's own commands
exist). A plugin that fails to import or register is an error naming it, never skipped. ``lit-embed plugins``
lists what is installed and what each plugin adds.
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

#: lit-embed's own distribution: its entry points are built-ins, not plugins.
OWN = "lit-embed"
GROUP = "lit_embed.plugins"
STRATEGIES = "lit_embed.strategies"
COMPRESSION_METHODS = "lit_embed.compression_methods"
TASKS = "lit_embed.tasks"
COMMANDS = "lit_embed.commands"
#: Every group, with what one of its entry points adds (as errors and the listing say it).
KIND = {GROUP: "plugin", STRATEGIES: "strategy", COMPRESSION_METHODS: "compression method", TASKS: "task",
        COMMANDS: "command"}
#: What a typed group's object must be: (module, class) of its base, or of its type for a task.
BASES = {STRATEGIES: ("lit_embed.embeddings.base", "EmbeddingStrategy"),
         COMPRESSION_METHODS: ("lit_embed.compress.methods", "CompressionMethod"),
         TASKS: ("lit_embed.data.tasks", "Task")}
IMPORTLIB = Path(importlib.__file__).parent
#: ``0`` (or ``false``, ``no``, ``off``) starts without plugins.
SWITCH = "LIT_EMBED_PLUGINS"
_OFF = ("0", "false", "no", "off")
_ON = ("", "1", "true", "yes", "on")
#: What configs name by class, as the listing groups a ``lit_embed.plugins`` plugin's classes: (heading, module, base).
KINDS = (
    ("embedding strategies", "lit_embed.embeddings", "EmbeddingStrategy"),
    ("models", "pytorch_lightning", "LightningModule"),
    ("data modules", "pytorch_lightning", "LightningDataModule"),
    ("callbacks", "pytorch_lightning", "Callback"),
    ("compression methods (--method)", "lit_embed.compress.methods", "CompressionMethod"),
)


@dataclass(frozen=True)
class Plugin:
    """One entry point: its distribution, its group, its name and value, and the tasks its import registered."""

    distribution: str
    version: str
    name: str
    value: str
    tasks: tuple[str, ...] = ()
    group: str = GROUP

    @property
    def package(self) -> str:
        """The top-level package of the entry point's module: the classes it adds live under it."""
        return self.value.partition(":")[0].split(".")[0].strip()

    def __str__(self) -> str:
        kind = "" if self.group == GROUP else f"{KIND[self.group]} "
        return f"{kind}{self.name} = {self.value} ({self.distribution} {self.version})"


_loaded: list[Plugin] | None = None


def enabled() -> bool:
    """Whether plugins load: unless ``LIT_EMBED_PLUGINS`` says ``0``."""
    value = os.environ.get(SWITCH, "")
    word = value.strip().lower()
    if word in _OFF or word in _ON:
        return word in _ON
    raise ConfigError(f"{SWITCH}={value!r} is not known: set it to 0 to start without plugins, or 1 (the default)")


def installed(group: str | None = None) -> list[importlib.metadata.EntryPoint]:
    """The installed plugins' entry points of ``group`` (of every group where ``None``; lit-embed's own left out),
    by group (in :data:`KIND`'s order), distribution, then name."""
    groups = list(KIND) if group is None else [group]
    declared, own = importlib.metadata.entry_points(), _own()  # read once for every group
    points = [point for name in groups for point in declared.select(group=name) if point not in own]
    return sorted(points, key=lambda point: (groups.index(point.group), _normalised(_distribution(point)[0]), point.name))


def _own() -> tuple[importlib.metadata.EntryPoint, ...]:
    """lit-embed's own entry points (read from its entry_points.txt alone, not its metadata: ``--help`` asks)."""
    try:
        return tuple(importlib.metadata.distribution(OWN).entry_points)
    except importlib.metadata.PackageNotFoundError:
        return ()


def builtin_commands() -> dict[str, str]:
    """lit-embed's own commands, name -> ``module:function``, as its installed metadata declares them.

    Raises:
        ConfigError: lit-embed's metadata declares none (it was installed before its commands were declared there).
    """
    points = [point for point in _own() if point.group == COMMANDS]
    if not points:
        raise ConfigError(f"lit-embed's installed metadata declares no {COMMANDS!r} entry points (it was installed "
                          f"from an older copy, or not at all): install it again (pip install -e . in its folder)")
    return {point.name: point.value for point in points}


def plugin_commands(builtin: dict[str, str]) -> list[Plugin]:
    """The installed plugins' commands (none where plugins are off); a name taken twice refused.

    Raises:
        PluginError: a plugin names a command as one of ``builtin`` (lit-embed's) or as another plugin does.
    """
    if not enabled():
        return []
    commands = [unloaded(point) for point in _unique(installed(COMMANDS))]
    for plugin in commands:
        if plugin.name in builtin:
            raise PluginError(
                f"{plugin.distribution} {plugin.version} declares the command {plugin.name!r} ({plugin.value}), which is "
                f"lit-embed's own ({builtin[plugin.name]}): "
                f"a plugin cannot replace a built-in command; rename it in {plugin.distribution}'s entry points, "
                f"uninstall {plugin.distribution}, or set {SWITCH}=0")
    return commands


def load_plugins() -> list[Plugin]:
    """Import every installed plugin but its commands, and register what the typed groups declare (once per process;
    nothing where ``LIT_EMBED_PLUGINS=0``); what loaded.

    Raises:
        PluginError: a plugin failed to import or is not what its group says, or two give one name; it names the
            distribution, the entry point and the cause.
    """
    global _loaded
    if _loaded is not None:
        return list(_loaded)
    if not enabled():
        _loaded = []
        return []
    loaded = []
    points = installed()
    for group in (STRATEGIES, COMPRESSION_METHODS, TASKS):
        _unique(point for point in points if point.group == group)
    for point in points:
        if point.group == COMMANDS:
            continue
        plugin, before = unloaded(point), set(tasks.TASKS)
        try:
            found = point.load()
        except Exception as error:
            raise PluginError(f"{_by(plugin)} failed to import ({type(error).__name__}: {error}{_where(error)}): "
                              f"{_fix(plugin)}") from error
        if point.group != GROUP:
            _register(plugin, found)
        added = tuple(name for name in tasks.TASKS if name not in before)
        loaded.append(Plugin(plugin.distribution, plugin.version, point.name, point.value, added, point.group))
    _loaded = loaded
    return list(loaded)


def list_plugins() -> list[Plugin]:
    """The plugins this process loaded (loading them first if it has not yet), then their commands (not imported)."""
    from_commands = plugin_commands(builtin_commands())
    return load_plugins() + from_commands


def _register(plugin: Plugin, found: object) -> None:
    """Check ``found`` is what ``plugin``'s group takes, under the entry point's name, and register it."""
    base = getattr(importlib.import_module(BASES[plugin.group][0]), BASES[plugin.group][1])  # imported by the plugin
    kind = KIND[plugin.group]
    if plugin.group == TASKS:
        if not isinstance(found, base):
            _refuse(plugin, f"is a {type(found).__name__}, not a lit_embed.data.tasks.Task")
        if found.name != plugin.name:
            _refuse(plugin, f"is the task {found.name!r}: name the entry point {found.name!r}")
        try:
            tasks.register_task(found)
        except ConfigError as error:
            _refuse(plugin, f"cannot be registered ({error})")
        return
    if not (isinstance(found, type) and issubclass(found, base)) or inspect.isabstract(found):
        _refuse(plugin, f"is {found!r}, not a (concrete) subclass of {base.__module__}.{base.__name__}")
    name = found.__name__ if plugin.group == STRATEGIES else found.name
    if name != plugin.name:
        _refuse(plugin, f"is the {kind} {name!r}: name the entry point {name!r}, the name configs give it")
    if plugin.group == STRATEGIES:
        same = [_import_path(cls) for cls in _subclasses(base) if cls.__name__ == name and cls is not found
                and "<locals>" not in cls.__qualname__]
        if same:
            _refuse(plugin, f"has the class name of {same[0]}, so configs could not name it short: rename the class")


def _refuse(plugin: Plugin, why: str) -> None:
    raise PluginError(f"{_by(plugin)} {why}: {_fix(plugin)}")


def _by(plugin: Plugin) -> str:
    return f"{KIND[plugin.group]} {plugin.name!r} ({plugin.value}) of {plugin.distribution} {plugin.version}"


def _fix(plugin: Plugin) -> str:
    return (f"fix or uninstall {plugin.distribution} (pip uninstall {plugin.distribution}), or set {SWITCH}=0 to run "
            f"without plugins")


def _unique(points) -> list[importlib.metadata.EntryPoint]:
    """``points`` (of one group), refused where two distributions declare one name."""
    seen: dict[str, importlib.metadata.EntryPoint] = {}
    for point in points:
        other = seen.setdefault(point.name, point)
        if other is not point:
            first, second = unloaded(other), unloaded(point)
            raise PluginError(
                f"{first.distribution} {first.version} ({first.value}) and {second.distribution} {second.version} "
                f"({second.value}) both declare the {KIND[point.group]} {point.name!r}: uninstall one of them, or set "
                f"{SWITCH}=0 to run without plugins")
    return list(seen.values())


def provided(plugin: Plugin) -> dict[str, list[str]]:
    """What ``plugin`` adds, by kind (``"embedding strategies"``, ..., ``"tasks"``): the names configs give.

    A class is named short where jsonargparse resolves it so (no module or class name starting with ``_``,
    and no other imported class of that kind with the same name), else by its full path. Abstract classes
    are left out: configs cannot build them.
    """
    found: dict[str, list[str]] = {}
    if plugin.group != GROUP:  # the one thing its entry point names
        return found
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
    return Plugin(*_distribution(point), point.name, point.value, group=point.group)


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

