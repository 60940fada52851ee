"""Errors that are the user's to fix: ``lit-embed`` prints their message and exits 2 (3 for a run that diverged),
without a traceback.

Each also derives from the built-in error it used to be (``ValueError``, ``FileNotFoundError``, ...), so
code that catches those keeps working. Anything else that escapes a command is a bug and keeps its
traceback. A message names the value or file at fault and says how to fix it.
"""

from __future__ import annotations

import difflib
import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path


def causes(error: BaseException | None, limit: int = 10) -> Iterator[BaseException]:
    """``error`` and what it was raised from or during, nearest first (at most ``limit``: a chain can loop)."""
    seen = 0
    while error is not None and seen < limit:
        yield error
        error, seen = error.__cause__ or error.__context__, seen + 1


class UserError(Exception):
    """Bad input, a missing file, an unreachable hub: fixable by the user, reported without a traceback."""

    #: What ``lit-embed`` exits with.
    exit_status = 2


class ConfigError(UserError, ValueError):
    """A value in a config, on the command line or in a data file that cannot be used."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user named does not exist."""


class OutputExistsError(UserError, FileExistsError):
    """An output that already exists and is not ours to replace."""


class HubError(UserError, OSError):
    """A hub name that could not be loaded (offline, or no such repository)."""


class BudgetError(ConfigError):
    """A strategy whose structure cannot meet a budget: not a mistake in the config but a cell of a comparison that
    does not exist (a sweep leaves it out and says so, whether its plan or its run finds it out)."""


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be read safely, or belongs to another model."""


class DiskFullError(UserError, OSError):
    """No space left on the device a file was being written to, or (``code`` EFBIG) the file grew past a size limit:
    the file is left as it was."""

    def __init__(self, path: str, device: str, code: int = errno.ENOSPC) -> None:
        if code == errno.EFBIG:
            message = (f"file too large writing {path} on {device}: it met a file-size limit (the shell's ulimit -f, or "
                       f"the filesystem's largest file): raise the limit or write elsewhere")
        else:
            message = f"no space left on {device} writing {path}: free space or write elsewhere"
        super().__init__(code, message, path)

    def __str__(self) -> str:
        return str(self.strerror)


class RedirectedWriteError(UserError, OSError):
    """A file lit-embed would write in place (a lock, a log) that is a symbolic link or no regular file: writing it
    would write wherever it points."""


class RunBusyError(UserError, RuntimeError):
    """A run folder or checkpoint folder that a live run holds."""


class DivergedError(UserError, ArithmeticError):
    """Training diverged (a non-finite loss or non-finite weights): the run stops, marked ``diverged``. Its own exit
    status, 3, tells it from bad input (2) and from a signal (128 + N) in scripts and sweeps. ``what``: what was not
    finite, and at which step (results.json's ``detail``)."""

    exit_status = 3

    def __init__(self, message: str, what: str) -> None:
        super().__init__(message)
        self.what = what


class PluginError(UserError, ImportError):
    """An installed plugin (an entry point of a group :mod:`lit_embed.plugins` reads) that fails to import or is not
    what its group takes, or two that give one name."""


__all__ = ["CheckpointError", "ConfigError", "DiskFullError", "DivergedError", "HubError", "MissingFileError", "OutputExistsError", "PluginError", "RedirectedWriteError", "RunBusyError", "UserError"]


def not_known(label: str, name: str, known) -> ConfigError:
    """``label=name`` is none of ``known``: the error, with a close match where one exists."""
    near = difflib.get_close_matches(name, list(known), n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    return ConfigError(f"{label}={name!r} is not known: {hint}use one of {sorted(known)}")


def nearest_path(path: str | os.PathLike) -> Path | None:
    """The existing path closest to ``path``, each missing part replaced by the closest name in the folder that
    holds it (a mistyped run folder, ``runs/dmeo`` for ``runs/demo``); ``None`` where a part has nothing close."""
    path = Path(path).expanduser()
    current = Path(path.anchor or ".")
    for part in path.parts[1 if path.anchor else 0:]:
        if not (current / part).exists():
            names = sorted(p.name for p in current.iterdir()) if current.is_dir() else []
            close = difflib.get_close_matches(part, names, n=1, cutoff=0.6)
            if not close:
                return None
            part = close[0]
        current = current / part
    return None if current == path else current


def did_you_mean(path: str | os.PathLike) -> str:
    """`` (did you mean NEAREST?)`` for a path that does not exist, or nothing."""
    near = nearest_path(path)
    return f" (did you mean {near}?)" if near is not None else ""


def pickled_type(error: BaseException) -> str | None:
    """The type a ``weights_only`` unpickling refused (``posix.system``), as its error names it; ``None`` if it names none."""
    found = re.search(r"GLOBAL ([\w.]+)", str(error))
    return found.group(1) if found else None
