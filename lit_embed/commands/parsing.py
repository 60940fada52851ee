"""How every command reports a mistake in its arguments: the error, a close match where one exists, and where
help is, without argparse's usage block above it (fifty lines of options buried the one line that mattered).

Both kinds of parser the commands use get it: :class:`ArgumentParser` for the argparse commands, and
:class:`ConciseErrors` mixed into jsonargparse's (LightningCLI's, compress's). :func:`check_names` says the same
before a command imports torch and Lightning, for an option it does not take or a ``--config`` file that is not there,
from the command's cached help.
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
from lit_embed.errors import nearest_path, not_known

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
    """Print the error (and a close match) with one line saying where help is; exit 2 as argparse does. An unknown
    option is said in argparse's words whichever parser found it (jsonargparse 4.45, for one, capitalises them)."""
    prog = prog.replace(" [options]", "")
    message = UNKNOWN_OPTION.sub(lambda found: f"unrecognized arguments: {found.group(1)}", message.strip(), count=1)
    lines = [f"{prog}: error: {message}"]
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
    """argparse's parser with :func:`report_error`'s errors; an option it does not take is said before a missing one
    (``--ckp x.ckpt``: a close match to the option, not "--ckpt is required")."""

    def error(self, message: str) -> NoReturn:
        report_error(self.prog, message, option_strings(self))

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        words = sys.argv[1:] if args is None else list(args)
        problem = _unknown_option(words, option_strings(self))
        if problem is not None:
            self.error(problem)
        return super().parse_args(words, namespace)


def check_names(argv: list[str], found: helptext.Help | None = None) -> None:
    """Refuse ``lit-embed ARGV`` where its command does not take one of the options it names, or its ``--config``
    file does not exist, with the line its parser would print, before a command that builds its parser from the
    model's classes (:data:`~lit_embed.commands.HEAVY`) imports torch and Lightning (seconds, a minute on a busy
    machine, to say a typo). Names only, read from the commands' help ``found``, by default the cached help
    (:mod:`~lit_embed.commands.helptext`; ``data check`` parses a config as ``fit`` does): the values and the configs'
    contents are the parser's, after the import. Where no help is cached yet the parser says it: building the cache
    here would make the first run pay seconds more than its own parser takes (a ``--help`` builds it). A process that
    has imported Lightning already (a Python session, the tests) has nothing to gain: its parser answers as soon."""
    from lit_embed.commands import HEAVY

    name, words = argv[0], argv[1:]
    if name == "data" and argv[1:2] == ["check"]:
        name, words = "fit", argv[2:]  # its parser is fit's
    if name not in HEAVY or "-h" in words or "--help" in words or not any(w.startswith("-") for w in words):
        return  # the command's parser says it; the help says it
    if found is None and "pytorch_lightning" not in sys.modules:
        found = helptext.cached_help(build=False)
    if found is None:
        return
    method = named_method(words) if name == "compress" else None
    text = found.texts.get(name) if method is None else found.method(method)
    if text is None and method is not None:  # compress takes the options of the method it runs: its help lists them
        methods_here = sys.modules.get("lit_embed.compress.methods")  # code of this process may have added methods
        if methods_here is None or method not in methods_here.CompressionMethod.registry:
            raise not_known("method", method, found.methods)
    if text is None:
        return  # the parser knows it
    flags = helptext.options(text)
    problem = _unknown_option(words, flags)
    if problem is not None and method is not None:
        problem += _method_options(problem, method, found)
    problem = problem or (_missing_config(words) if "--config" in flags else None)
    if problem is not None:
        report_error(f"lit-embed {' '.join(argv[:2]) if argv[0] == 'data' else argv[0]}", problem, flags)


def _method_options(problem: str, method: str, found: helptext.Help) -> str:
    """What compress's parser adds to an unknown option: the options ``method`` takes, and the methods whose option
    it is (the options all of lit-embed's own methods take are the command's own)."""
    flags = {name: set(helptext.options(found.method(name) or "")) for name in found.methods}
    common = set.intersection(*(flags[name] for name in found.own_methods))
    option = problem.removeprefix("unrecognized arguments: ").split()[0].partition("=")[0]
    own = [flag for flag in helptext.options(found.method(method) or "") if flag not in common]
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
