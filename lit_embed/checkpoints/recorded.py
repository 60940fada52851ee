"""What a recorded option may do: the one reader of the configs that files record.

A checkpoint records the configs that rebuild its model and data (its hyper-parameters and lit-embed's facts),
a run folder its ``config.yaml``, a ``lit-embed compress`` output its ``config.yaml``. Those are files you may
have been given, not your own command line or config, so every command reads what they record through
:func:`recorded_config` (:func:`lit_embed.checkpoints.format.read_checkpoint` for checkpoints, the CLI's parser for such a
file given as ``--config``: :func:`written_by_lit_embed`), and a recorded config can do two things less than
your own:

* **It grants no trust.** Keys that opt in to foreign code (:data:`TRUST_KEYS`: ``trust_remote_code``) are
  dropped wherever they appear. Trust comes only from your own command line or config; a command that then
  needs it stops with exit 2 naming the flag to give (:func:`lit_embed.hub.load_tokenizer`).
* **It imports nothing foreign.** Importing a module runs its code, so every class a recorded config names
  (``class_path``, or a dotted name given where a class or a function is expected) must be a class defined in
  lit-embed, in Lightning (the callbacks and loggers a run's config records) or in an installed plugin (the
  package of an entry point of :mod:`lit_embed.plugins`' groups), or one your own config names in this command
  (:func:`name_user_classes`). Anything else is refused before it is imported, naming the key and the value.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import types
import typing
from collections.abc import Iterable
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from lit_embed import plugins
from lit_embed.errors import ConfigError
from lit_embed.runs.folders import CHECKPOINTS, LOCK_FILE
from lit_embed.runs.results import RESULTS_FILE

#: Keys that let a config run foreign code: never taken from a recorded config.
TRUST_KEYS = frozenset({"trust_remote_code"})
#: Packages whose classes a recorded config may name (with the installed plugins').
PACKAGES = ("lit_embed", "pytorch_lightning", "lightning")
#: What jsonargparse would import: ``package.module.Name``.
IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
#: The first line of a config file a lit-embed command wrote (``compress``'s ``config.yaml``).
WRITTEN_HEADER = "# Written by `lit-embed"
#: What a run folder holds beside its ``config.yaml`` (one is enough: :mod:`lit_embed.runs.folders`).
RUN_FOLDER_FILES = (LOCK_FILE, "hparams.yaml", RESULTS_FILE, CHECKPOINTS)
#: What a ``compress`` output holds beside its ``config.yaml``.
COMPRESS_FILES = ("report.json", "model.ckpt")

_UNKNOWN = object()  # the type a value was recorded for is not known: strings that look like imports are checked
_NAMED: ContextVar[frozenset[str]] = ContextVar("lit_embed_named_classes", default=frozenset())


def name_user_classes(config: Any) -> None:
    """Let recorded configs read later in this command name the classes ``config`` (the user's own) names
    (:func:`lit_embed.commands.main` runs each command in a context of its own, where this ends)."""
    _NAMED.set(_NAMED.get() | class_paths(config))


def class_paths(config: Any) -> frozenset[str]:
    """Every ``class_path`` a (plain-data) config names."""
    if isinstance(config, dict):
        found = {config["class_path"]} if isinstance(config.get("class_path"), str) else set()
        return frozenset(found.union(*(class_paths(v) for v in config.values())))
    if isinstance(config, (list, tuple)):
        return frozenset().union(*(class_paths(v) for v in config))
    return frozenset()


def recorded_config(config: Any, where: str, key: str, hint: Any = _UNKNOWN) -> Any:
    """``config`` as a command may use what ``where`` (``"checkpoint 'x.ckpt'"``) recorded under ``key``: a copy
    without the keys of :data:`TRUST_KEYS`, every class it names checked (:func:`checked_class`). ``hint`` is the type
    the value was recorded for, where known (a dict of types for the keys of a mapping)."""
    if isinstance(config, dict):
        if "class_path" in config:
            hints = _init_hints(checked_class(config["class_path"], f"{key}.class_path", where))
            out = {}
            for name, value in config.items():
                if name in ("init_args", "dict_kwargs") and isinstance(value, dict):
                    value = {k: recorded_config(v, where, f"{key}.{name}.{k}", hints.get(k, _UNKNOWN))
                             for k, v in value.items() if k not in TRUST_KEYS}
                elif name != "class_path":
                    value = recorded_config(value, where, f"{key}.{name}")
                out[name] = value
            return out
        fields = _field_hints(hint)
        return {k: recorded_config(v, where, f"{key}.{k}" if key else str(k), fields(k))
                for k, v in config.items() if k not in TRUST_KEYS}
    if isinstance(config, (list, tuple)):
        item = _item_hint(hint)
        return type(config)(recorded_config(v, where, f"{key}[{i}]", item) for i, v in enumerate(config))
    if isinstance(config, str) and IMPORT_PATH.fullmatch(config) and not _takes_text(hint):
        checked_class(config, key, where)
    return config


def checked_class(path: Any, key: str, where: str) -> type:
    """The class ``path`` names, imported only where a recorded config may name it (see the module); a
    :class:`~lit_embed.errors.ConfigError` naming ``key``, the value and ``where`` otherwise."""
    named = path in _NAMED.get()
    if not isinstance(path, str) or not IMPORT_PATH.fullmatch(path):
        raise ConfigError(f"{where} records {key}={path!r}, which is not a full class path (package.module.Class): "
                          f"lit-embed writes full paths; use a file lit-embed wrote, or your own config")
    if not named and not _allowed(path):
        raise ConfigError(
            f"{where} records {key}={path!r}, a class outside lit-embed, Lightning and the installed plugins: "
            f"lit-embed does not import what a file it reads names (importing runs the module's code). If you trust "
            f"it, name the class in your own config or on the command line, or install its module as a plugin "
            f"(an entry point of lit_embed.strategies, or lit_embed.plugins)")
    module, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"{where} records {key}={path!r}, which does not import ({error}): use a checkpoint or "
                          f"config of the lit-embed and plugins installed here") from None
    if not isinstance(found, type) or not (named or _allowed(found.__module__)):
        raise ConfigError(f"{where} records {key}={path!r}, which is not a class of lit-embed, Lightning or a plugin "
                          f"(it is {type(found).__name__} {getattr(found, '__module__', '?')}.{name}): refused")
    return found


def without_trust(config: Any) -> Any:
    """``config`` without the keys of :data:`TRUST_KEYS`: what lit-embed writes into the configs it records."""
    if isinstance(config, dict):
        return {k: without_trust(v) for k, v in config.items() if k not in TRUST_KEYS}
    if isinstance(config, (list, tuple)):
        return type(config)(without_trust(v) for v in config)
    return config


def written_by_lit_embed(path: str | os.PathLike) -> bool:
    """Whether the config file ``path`` is one lit-embed wrote, to be read as recorded: a run's ``config.yaml`` (in
    a folder holding a run's files), or a ``compress`` output's (beside its report and model, or under its header)."""
    path = Path(path)
    folder = path.parent
    if path.name == "config.yaml" and (any((folder / name).exists() for name in RUN_FOLDER_FILES)
                                       or all((folder / name).is_file() for name in COMPRESS_FILES)):
        return True
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            return handle.readline().startswith(WRITTEN_HEADER)
    except OSError:
        return False


def run_config_hints() -> dict[str, Any]:
    """The types of a full config's top-level keys (a run's or a compress output's ``config.yaml``)."""
    import pytorch_lightning as pl  # here: data check asks written_by_lit_embed before (and without) Lightning

    return {"trainer": pl.Trainer, "model": pl.LightningModule, "data": pl.LightningDataModule, "ckpt_path": str,
            "ckpt_model": str, "seed_everything": Any, "config": Any}


# -- where a class may come from ----------------------------------------------------------------------------


def _allowed(module_or_path: str) -> bool:
    top = module_or_path.split(".")[0]
    return top in PACKAGES or top in {plugin.package for plugin in plugins.load_plugins()}


# -- the types values were recorded for (what jsonargparse would make of a string) -------------------------


def _init_hints(cls: type) -> dict[str, Any]:
    """The types of ``cls``'s constructor arguments (``{}`` where they do not resolve: every value is then checked)."""
    try:
        return typing.get_type_hints(cls if dataclasses.is_dataclass(cls) else cls.__init__)
    except Exception:  # annotations that name what is not importable here
        return {}


def _members(hint: Any) -> tuple:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _takes_text(hint: Any) -> bool:
    """Whether a string given for ``hint`` stays a string (jsonargparse imports one given for a class or a function)."""
    if hint is Any or hint is str:
        return True
    if hint is _UNKNOWN:
        return False
    if typing.get_origin(hint) is Literal:
        return any(isinstance(arg, str) for arg in typing.get_args(hint))
    if isinstance(hint, type) and issubclass(hint, (str, os.PathLike)):
        return True
    members = _members(hint)
    return len(members) > 1 and any(_takes_text(member) for member in members)


def _field_hints(hint: Any):
    """``key -> type`` of the values of a mapping recorded for ``hint``."""
    if isinstance(hint, dict):
        return lambda key: hint.get(key, _UNKNOWN)
    for member in _members(hint):
        if member is Any:
            return lambda key: Any
        if typing.get_origin(member) is dict and len(typing.get_args(member)) == 2:
            value = typing.get_args(member)[1]
            return lambda key: value
        if isinstance(member, type) and member not in (dict, list, tuple, str, int, float, bool, type(None)):
            hints = _init_hints(member)  # a dataclass's fields, or a class's arguments given without its class_path
            if hints:
                return lambda key: hints.get(key, _UNKNOWN)
    return lambda key: _UNKNOWN


def _item_hint(hint: Any) -> Any:
    """The type of the items of a list recorded for ``hint``."""
    for member in _members(hint):
        if member is Any:
            return Any
        origin = typing.get_origin(member)
        if isinstance(origin, type) and issubclass(origin, Iterable) and origin not in (dict, str):
            args = [a for a in typing.get_args(member) if a is not Ellipsis]
            return args[0] if len(args) == 1 else _UNKNOWN
    return _UNKNOWN


#: An ``auto_map`` entry that names the folder's own code: ``module.Class``, ``module.py`` beside it (transformers also
#: reads ``other/repo--module.Class``, a hub repository's code, and a module path that leaves the folder).
OWN_CODE = re.compile(r"(?P<module>[A-Za-z_]\w*)\.[A-Za-z_]\w*")


def check_auto_map(folder: str | os.PathLike, files: Iterable[str] = ("config.json", "tokenizer_config.json")) -> None:
    """Refuse a model folder (a ``lit-embed export``) whose ``auto_map`` names code outside it: an entry that is not
    ``module.Class`` with ``module.py`` a file of the folder itself (not a link), such as a hub repository's
    (``repo--module.Class``) or another folder's. ``trust_remote_code=True`` runs what ``auto_map`` names; lit-embed's
    loaders of exports check it first, so that trusting an export trusts only the code it holds."""
    import json

    folder = Path(folder)
    for name in files:
        try:
            recorded = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # none, or unreadable: transformers says so when it reads it
        auto_map = recorded.get("auto_map") if isinstance(recorded, dict) else None
        for key, value in (auto_map.items() if isinstance(auto_map, dict) else []):
            for reference in value if isinstance(value, list) else [value]:
                own = OWN_CODE.fullmatch(reference) if isinstance(reference, str) else None
                module = folder / f"{own['module']}.py" if own else None
                if reference is not None and (module is None or module.is_symlink() or not module.is_file()):
                    raise ConfigError(
                        f"{folder / name} has auto_map {key}={reference!r}, which names code outside {folder} (or a "
                        f"file it lacks): trust_remote_code=True would run it; an export's own auto_map names its "
                        f"module.Class, module.py beside config.json. Export the checkpoint again"
                    )


__all__ = ["TRUST_KEYS", "check_auto_map", "checked_class", "name_user_classes", "recorded_config", "without_trust", "written_by_lit_embed"]
