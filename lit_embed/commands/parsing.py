"""How every command reports a mistake in its arguments: the error, a close match where one exists, and where
help is, without argparse's usage block above it (fifty lines of options buried the one line that mattered).

Both kinds of parser the commands use get it: :class:`ArgumentParser` for the argparse commands, and
:class:`ConciseErrors` mixed into jsonargparse's (LightningCLI's, compress's).
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn

UNKNOWN_OPTION = re.compile(r"unrecognized arguments?:\s*(--?[\w.\-]+)", re.IGNORECASE)
MISSING_FILE = re.compile(r"(?:File does not exist|does not exist|can't open)[^']*'([^']+)'", re.IGNORECASE)


def close_match(message: str, options: Iterable[str]) -> str | None:
    """``did you mean X?`` for a mistyped option (among ``options``) or a mistyped file name (among the files
    beside it), ``None`` where nothing is close."""
    unknown = UNKNOWN_OPTION.search(message)
    if unknown:
        found = difflib.get_close_matches(unknown.group(1).split("=")[0], sorted(set(options)), n=1, cutoff=0.75)
        return f"did you mean {found[0]}?" if found else None
    missing = MISSING_FILE.search(message)
    if missing:
        path = Path(missing.group(1))
        if path.parent.is_dir():
            names = sorted(p.name for p in path.parent.iterdir())
            found = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
            return f"did you mean {path.with_name(found[0])}?" if found else None
    return None


def report_error(prog: str, message: str, options: Iterable[str]) -> NoReturn:
    """Print the error (and a close match) with one line saying where help is; exit 2 as argparse does."""
    prog = prog.replace(" [options]", "")
    lines = [f"{prog}: error: {message.strip()}"]
    hint = close_match(message, options)
    if hint:
        lines.append(f"  {hint}")
    lines.append(f"(`{prog} --help` lists the options)")
    sys.stderr.write("\n".join(lines) + "\n")
    sys.exit(2)


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")]


class ConciseErrors:
    """Mixed into a jsonargparse parser: its errors as :func:`report_error` prints them. Errors jsonargparse raises
    to itself (``exit_on_error`` off, as while it tries the types of a union) pass through untouched."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or callable(getattr(self, "_error_handler", None)):
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        report_error(parser.prog, message, option_strings(parser))


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with :func:`report_error`'s errors."""

    def error(self, message: str) -> NoReturn:
        report_error(self.prog, message, option_strings(self))
