"""Writes the help copies :mod:`lit_embed.commands.helptext` answers from: ``python -m lit_embed.commands.help_copies``
after changing a command's options (``tests/test_help.py`` fails until then)."""

from __future__ import annotations

import io
import os
import sys
from contextlib import redirect_stdout
from pathlib import Path

from lit_embed.commands import COMMANDS, command
from lit_embed.commands.helptext import COLUMNS, FOLDER, key, versions
from lit_embed.compress.methods import CompressionMethod


def live(argv: list[str]) -> str:
    """What the command itself prints for ``argv`` (imports it, and all it imports), at :data:`COLUMNS`."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(COLUMNS)
    out = io.StringIO()
    try:
        with redirect_stdout(out):
            try:
                command(argv[0])(argv[1:])
            except SystemExit:
                pass
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return out.getvalue()


def helped() -> list[list[str]]:
    """Every ``--help`` a copy is shipped for: each command's (and ``data check``'s), and ``compress``'s for each of
    lit-embed's own compression methods (each takes options of its own)."""
    own = sorted(name for name, cls in CompressionMethod.registry.items() if cls.__module__.startswith("lit_embed."))
    methods = [["compress", "--method", name, "--help"] for name in own]
    return [[name, "--help"] for name in COMMANDS if name != "data"] + [["data", "check", "--help"]] + methods


def write(folder: Path = FOLDER) -> None:
    """Write every copy again (run after changing a command's options), in a process that imported nothing else:
    the live help lists every imported subclass of what an option takes (a test's callbacks, say)."""
    folder.mkdir(exist_ok=True)
    for argv in helped():
        (folder / f"{key(argv)}.txt").write_text(f"# {versions()}\n{live(argv)}")



if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else FOLDER)
    print(f"wrote {len(helped())} help texts to {sys.argv[1] if len(sys.argv) > 1 else FOLDER}", file=sys.stderr)
