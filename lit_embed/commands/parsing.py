"""How every command reports a mistake in its arguments: the error, a close match where one exists, and where
help is, without argparse's usage block above it (fifty lines of options buried the one line that mattered).

Both kinds of parser the commands use get it: :class:`ArgumentParser` for the argparse commands, and
:class:`ConciseErrors` mixed into jsonargparse's (LightningCLI's, compress's). :func:`check_names` says the same
before a command imports torch and Lightning, for an option it does not take or a ``--config`` file that is not there.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn

from lit_embed.commands import helptext
from lit_embed.errors import ConfigError, nearest_path, not_known

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
    near = nearest_path(missing.group(1)) if missing else None
    return f"did you mean {near}?" if near is not None else None


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


#: The commands :func:`check_names` checks: those that import torch or Lightning before parsing and whose shipped help
#: is their parser's own (``params``' is written by hand: its ``--model.*`` stands for every option ``fit`` takes).
CHECKED = ("fit", "validate", "test", "predict", "analyze", "compress", "export", "data")


def check_names(argv: list[str]) -> None:
    """Refuse ``lit-embed ARGV`` where its command does not take one of the options it names, or its ``--config``
    file does not exist, with the line its parser would print, before the command imports torch and Lightning
    (seconds, a minute on a busy machine, to say a typo). Names only, read from the command's shipped help
    (:mod:`~lit_embed.commands.helptext`; ``data check`` parses a config as ``fit`` does): the values and the configs'
    contents are the parser's, after the import. Where no copy holds (other versions, a plugin installed) the parser
    says it all."""
    name, words = argv[0], argv[1:]
    if name not in CHECKED or "-h" in words or "--help" in words:
        return  # the command's parser says it; the help says it
    prog = f"lit-embed {name}"
    if name == "data":
        prog, words = "lit-embed data check", argv[2:]
        if argv[1:2] != ["check"] or not any(w == "--config" or w.startswith("--config=") for w in words):
            usage = helptext.copy("data_check", plugins_checked=False)
            if usage is not None:
                raise ConfigError(usage.partition("\n")[0])
            return
    copy_name = "fit" if name == "data" else name
    method = named_method(words) if name == "compress" else None
    if method is not None:  # compress takes the options of the method it runs: that method's copy lists them
        copy_name = f"compress_method_{method}"
        registered_here = "lit_embed.compress.methods" in sys.modules  # code of this process may have added methods
        if helptext.copy(copy_name, plugins_checked=False) is None and helptext.copy("compress", plugins_checked=False) \
                is not None and not registered_here and not helptext.plugins_installed():
            raise not_known("method", method, helptext.copied_methods())  # no copy of these versions: none built in
    text = helptext.copy(copy_name, plugins_checked=False)
    if text is None or not any(w.startswith("-") for w in words):
        return
    flags = helptext.options(text)
    problem = _unknown_option(words, flags)
    if problem is not None and method is not None:
        problem += _method_options(problem, method)
    problem = problem or (_missing_config(words) if "--config" in flags else None)
    if problem is not None and not helptext.plugins_installed():  # a plugin's classes may take more: its parser says
        report_error(prog, problem, flags)


def _method_options(problem: str, method: str) -> str:
    """What compress's parser adds to an unknown option: the options ``method`` takes, and the methods whose option
    it is (read from the methods' copies: the options all of them list are the command's own)."""
    flags = {name: set(helptext.options(helptext.copy(f"compress_method_{name}", plugins_checked=False) or ""))
             for name in helptext.copied_methods()}
    common = set.intersection(*flags.values())
    option = problem.removeprefix("unrecognized arguments: ").split()[0].partition("=")[0]
    own = [flag for flag in helptext.options(helptext.copy(f"compress_method_{method}", plugins_checked=False) or "")
           if flag not in common]
    owners = [name for name, taken in sorted(flags.items()) if option in taken - common]
    where = f"; {option} is an option of --method {', '.join(owners)}" if owners else ""
    return f" (method {method!r} takes {', '.join(own) if own else 'no options'}{where})"


def named_method(words: list[str]) -> str | None:
    """The compression method ``lit-embed compress WORDS`` names (``--method NAME``, or a ``--config`` file's
    ``method:``; the last one given wins), read before parsing: the method's options are arguments only once it is
    known."""
    found: str | None = None
    for number, word in enumerate(words):
        flag, _, value = word.partition("=")
        if flag not in ("--method", "--config"):
            continue
        value = value or (words[number + 1] if number + 1 < len(words) else "")
        found = (value if flag == "--method" else _config_method(value)) or found
    return found


def _config_method(path: str) -> str | None:
    """The ``method:`` a compress config names (``None`` where it names none or cannot be read: the parser says why)."""
    import yaml

    try:
        document = yaml.safe_load(Path(path).expanduser().read_text())
    except (OSError, yaml.YAMLError):
        return None
    method = document.get("method") if isinstance(document, dict) else None
    return method if isinstance(method, str) else None


def _unknown_option(words: list[str], flags: list[str]) -> str | None:
    """argparse's line for the first option in ``words`` that is none of ``flags``. An option that takes a class or
    a mapping (``--model``, ``--trainer.callbacks``) takes any key below it (``--model.init_args.NAME``): those are
    the parser's to judge."""
    known = set(flags)
    open_ = [flag for flag in known if not any(other.startswith(f"{flag}.") and other != f"{flag}.help" for other in known)]
    for number, word in enumerate(words):
        if word == "--":
            return None
        option = word.partition("=")[0].rstrip("+")
        if not word.startswith("--") or option in known or any(option.startswith(f"{flag}.") for flag in open_):
            continue
        values = [w for w in words[number + 1:number + 2] if "=" not in word and not w.startswith("-")]
        return f"unrecognized arguments: {' '.join([word, *values])}"
    return None


def _missing_config(words: list[str]) -> str | None:
    """jsonargparse's line for a ``--config`` (``-c``) file that does not exist (a value that is YAML of a mapping is
    a config given inline)."""
    import yaml

    for number, word in enumerate(words):
        if word.startswith("--config="):
            value = word.partition("=")[2]
        elif word in ("--config", "-c") and number + 1 < len(words):
            value = words[number + 1]
        else:
            continue
        if not Path(value).expanduser().exists() and isinstance(_yaml(yaml, value), str):
            return f"Parser key \"config\": File does not exist: '{Path(value).absolute()}'"
    return None


def _yaml(yaml, value: str):
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return None
