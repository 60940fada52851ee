"""``lit-embed``: the commands of the entry-point group ``lit_embed.commands``, lit-embed's own (:data:`COMMANDS`: Lightning's
fit/validate/test/predict and the others) and the installed plugins' (:func:`table`).

This module imports nothing heavy: ``lit-embed --help``, ``--version`` and every command's ``--help`` answer without
loading torch or Lightning (the :data:`HEAVY` commands' from :mod:`~lit_embed.commands.helptext`'s cache); the
Lightning commands import :mod:`lit_embed.commands.lightning` when they run. Errors that are the user's to fix exit 2 with one line, a run that
diverged exits 3 (:class:`~lit_embed.errors.DivergedError`); a signal that stopped the command exits 128 + its number
(SIGTERM 143, SIGINT 130), and one that arrived as the command finished its last step changes nothing (0); anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextvars
import difflib
import importlib
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from lit_embed import __version__
from lit_embed.commands.early_data import check_data_files
from lit_embed.commands.helptext import LIBRARIES, cached, summary
from lit_embed.commands.parsing import check_names
from lit_embed.errors import ConfigError, PluginError, UserError
from lit_embed.notices import quiet
from lit_embed.plugins import OWN, SWITCH, builtin_commands, load_plugins, plugin_commands
from lit_embed.runs.signals import (
    Interrupted,
    install_signal_handlers,
    received_signal,
    restore_signal_handlers,
)

LIGHTNING = "lit_embed.commands.lightning"


@dataclass(frozen=True)
class Command:
    """A command: the function that runs it (``"module:function"``, called with the arguments after its name and
    returning the exit status), and who declares it (``lit-embed``, or a plugin's distribution)."""

    target: str
    by: str = OWN

    @property
    def summary(self) -> str:
        """Its line of help: the first paragraph of the function's docstring, read without importing it."""
        return summary(self.target)


def check_versions() -> None:
    """Refuse a pytorch-lightning or jsonargparse outside the versions lit-embed declares (its pyproject.toml, read
    from its installed metadata), loudly and at once: the commands' parsers, their errors and the help cache are built
    on what those versions do, and another may change it (HF's ``check_min_version`` does the same)."""
    from importlib.metadata import PackageNotFoundError, requires
    from importlib.metadata import version as installed

    from packaging.requirements import Requirement

    try:
        declared = [Requirement(line) for line in requires(OWN) or []]
    except PackageNotFoundError:
        return  # not installed at all: main() says how to install it (builtin_commands)
    for wanted in declared:
        if wanted.name not in LIBRARIES or wanted.marker is not None:
            continue
        try:
            found: str | None = installed(wanted.name)
        except PackageNotFoundError:
            found = None
        if found is None or not wanted.specifier.contains(found, prereleases=True):
            supported = ",".join(sorted(map(str, wanted.specifier), key=lambda part: part.startswith("<")))
            have = f"{wanted.name} {found} is installed" if found else f"{wanted.name} is not installed"
            raise ImportError(f"{have}, but lit-embed supports {wanted.name}{supported} only: "
                              f'pip install "{wanted.name}{supported}"')


check_versions()

#: lit-embed's own commands, name -> what runs it, as its pyproject.toml declares them in the entry-point group
#: ``lit_embed.commands`` (a plugin's are added by :func:`table`).
try:
    COMMANDS = {name: Command(target) for name, target in builtin_commands().items()}
except ConfigError as error:  # said by main(), as an error the user can fix
    COMMANDS, _NOT_INSTALLED = {}, error
else:
    _NOT_INSTALLED = None
#: Lightning's subcommands (:class:`~lit_embed.commands.lightning.LitEmbedCLI`).
LIGHTNING_COMMANDS = tuple(name for name, command in COMMANDS.items() if command.target.startswith(f"{LIGHTNING}:"))
#: The commands whose parser is built from the classes a config may name (so their module imports torch and
#: Lightning): their help is cached. Every other command's module imports neither until its arguments parse.
HEAVY = (*LIGHTNING_COMMANDS, "compress")


def table() -> dict[str, Command]:
    """Every command: lit-embed's, then the installed plugins' (a plugin's command named as another's refused). The
    one table the dispatcher and ``lit-embed --help`` read."""
    if _NOT_INSTALLED is not None:
        raise _NOT_INSTALLED
    builtin = {name: command.target for name, command in COMMANDS.items()}
    added = {plugin.name: Command(plugin.value, plugin.distribution) for plugin in plugin_commands(builtin)}
    return {**COMMANDS, **added}


def usage() -> str:
    """``lit-embed --help``: every command with one line."""
    commands = table()
    width = max(map(len, commands)) + 2
    lines = [f"  {name:<{width}}{command.summary}".rstrip() for name, command in commands.items()]
    return "\n".join([
        "usage: lit-embed COMMAND [options]",
        "",
        "lit-embed: PyTorch Lightning templates for research on compact token embeddings.",
        "",
        "commands:",
        *lines,
        "",
        "`lit-embed COMMAND --help` lists a command's options; `lit-embed --version` prints the versions.",
        "",
    ])


def version() -> str:
    """lit-embed's version and those of the libraries it runs on (read from their metadata: nothing is imported)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    libraries = []
    for name in ("torch", "pytorch-lightning", "transformers", "datasets"):
        try:
            libraries.append(f"{name} {installed(name)}")
        except PackageNotFoundError:
            libraries.append(f"{name} not installed")
    return f"lit-embed {__version__} ({', '.join(libraries)}; Python {sys.version.split()[0]})\n"


def main(argv: list[str] | None = None) -> int:
    """Run a command; the exit status: 0, 2 for an error the user can fix, 128 + N after signal N."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "--version"):
        try:
            text = version() if argv and argv[0] == "--version" else usage()
        except UserError as error:
            return _fail(str(error))
        print(text, end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    previous, hook = install_signal_handlers(), threading.excepthook
    threading.excepthook = _quiet_full_disk(hook)
    try:  # in a context of its own: what a command allows (lit_embed.hub, lit_embed.checkpoints.recorded) ends with it
        return contextvars.copy_context().run(_run, argv)
    finally:
        restore_signal_handlers(previous)
        threading.excepthook = hook


def _quiet_full_disk(hook):
    """A thread's exception hook that prints no traceback for a full disk: a writer's thread (TensorBoard's) meets it
    and its next write raises it again in the command, which says it in one line. Anything else goes to ``hook``."""
    def handle(args) -> None:
        from lit_embed.storage.files import disk_full

        if not disk_full(args.exc_value):
            hook(args)

    return handle


def _run(argv: list[str]) -> int:
    folders = sys.modules.get("lit_embed.runs.folders")  # where not imported yet, nothing was taken before
    if folders is not None:
        folders.new_command()
    cached_help = cached(argv)
    if cached_help is not None:  # before anything heavy is imported (helptext)
        print(cached_help, end="")
        return 0
    quiet(argv[0])
    try:
        check_names(argv)  # a typo answers before the command's (and the plugins') heavy imports
        if argv[0] != "plugins":  # it lists them, a broken one included
            load_plugins()  # before parsing: configs name the plugins' classes and tasks
        check_yaml_files(argv)
        check_data_files(argv)  # a wrong data path or column answers before the imports too
        status = command(argv[0])(argv[1:])
    except Exception as error:
        _discard_unstarted()
        found = user_error(error)
        if found is None:
            raise  # a bug: its traceback is what a report needs
        return _fail(*found)
    except (SystemExit, KeyboardInterrupt, Interrupted):
        _discard_unstarted()
        signum = received_signal()
        if signum is None:
            raise
        print(f"lit-embed: stopped by {_name(signum)}", file=sys.stderr)
        return 128 + signum
    if received_signal() is not None:  # it came as the last step ended: nothing was left undone (see signals)
        print(f"lit-embed: {_name(received_signal())} arrived as the command finished; it finished", file=sys.stderr)
    return status


def command(name: str):
    """The function that runs command ``name`` (imported now: the command's own imports come with it)."""
    commands = table()
    if name not in commands:
        close = difflib.get_close_matches(name, list(commands), n=1, cutoff=0.6)
        guess = f"did you mean {close[0]}? " if close else ""
        raise ConfigError(f"unknown command {name!r}: {guess}one of {', '.join(commands)} (lit-embed --help lists them)")
    found = commands[name]
    module, _, function = found.target.partition(":")
    try:
        return getattr(importlib.import_module(module), function)
    except Exception as error:
        if found.by == OWN:
            raise
        raise PluginError(f"command {name!r} ({found.target}) of {found.by} failed to import ({type(error).__name__}: "
                          f"{error}): fix or uninstall {found.by}, or set {SWITCH}=0") from error


def _name(signum: int) -> str:
    import signal

    return signal.Signals(signum).name


def _discard_unstarted() -> None:
    """A command that failed or was stopped leaves no run folder it claimed and never wrote to."""
    folders = sys.modules.get("lit_embed.runs.folders")  # imported by the commands that claim run folders
    if folders is not None:
        folders.discard_unstarted()


def check_yaml_files(argv: list[str]) -> None:
    """Refuse a YAML file named on the command line that does not parse, naming the file and the place
    (the parsers would say only "<unicode string>")."""
    import yaml

    for number, value in enumerate(argv):
        path = Path(value.partition("=")[2] if value.startswith("--") and "=" in value else value)
        if path.suffix not in (".yaml", ".yml") or not path.is_file():
            continue
        try:
            document = yaml.safe_load(path.read_text())
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            raise ConfigError(f"{path} is not valid YAML ({problem}{where}): fix the file") from None
        given_as_config = value.startswith("--config=") or (number > 0 and argv[number - 1] == "--config")
        if given_as_config and not isinstance(document, dict):
            found = "empty" if document is None else f"a {type(document).__name__}"
            raise ConfigError(f"--config {path} is {found}: a config is a mapping of keys (model:, data:, trainer:)")


def user_message(error: BaseException) -> str | None:
    """The one line to show for an error the user can fix (``None`` for a bug)."""
    found = user_error(error)
    return None if found is None else found[0]


def user_error(error: BaseException) -> tuple[str, int] | None:
    """The one line to show for an error the user can fix, and the exit status (``None`` for a bug).

    Looks through what ``error`` was raised from: jsonargparse re-raises a constructor's error as its own
    ``ValueError``, torch.save a full disk as a ``RuntimeError``.
    """
    from lit_embed.storage.files import disk_full, full_disk_message

    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, UserError):
            return _explain(error), error.exit_status
        if _is_misconfiguration(error):
            return _explain(error), 2
        if disk_full(error):  # a write outside lit-embed's writers (a library's own file)
            return full_disk_message(error), 2
        if isinstance(error, (PermissionError, IsADirectoryError, NotADirectoryError)) and error.filename:
            return f"{error.strerror}: {error.filename}", 2
        if isinstance(error, ModuleNotFoundError) and not (error.name or "").startswith("lit_embed"):
            needed = f"the package {error.name.split('.')[0]!r}" if error.name else "a package"
            return f"{error}: what the configuration asks for needs {needed}, which is not installed (install it, or " \
                   f"change the configuration)", 2
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def _is_misconfiguration(error: BaseException) -> bool:
    """Whether ``error`` is Lightning's ``MisconfigurationException`` (none can be where Lightning was never imported)."""
    module = sys.modules.get("lightning_fabric.utilities.exceptions")
    return module is not None and isinstance(error, module.MisconfigurationException)


def _explain(error: BaseException) -> str:
    """The message, with the fix where Lightning's own leaves it out."""
    message = str(error)
    if _is_misconfiguration(error) and ("gpu" in message.lower() or "cuda" in message.lower()):
        message += " (no GPU here: use --trainer.accelerator cpu, or auto to take a GPU where there is one)"
    return message


def _fail(message: str, status: int = 2) -> int:
    print(f"lit-embed: error: {message}", file=sys.stderr)
    return status
