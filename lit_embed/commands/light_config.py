"""The config ``lit-embed data check`` reads, composed as ``fit`` composes it but without importing torch or Lightning
(6-7 s on an idle machine, a minute on a busy one, to learn a few names).

:func:`compose` reads the ``--config`` files in order (a later one wins, ``class_path``/``init_args`` nodes merged
as jsonargparse merges them), the dotted overrides (``--data.init_args.files '[a, b]'``), the nested config files a
class-typed value names (``encoder: ../backbone/tiny.yaml``, relative to the file that names it; an override's to the
folder lit-embed runs in), and fills in each class's defaults from a shipped copy of the signatures of lit-embed's
classes (:data:`COPY`, written by ``python -m lit_embed.commands.light_config`` from the real signatures and held
to them by ``tests/test_data_check_light.py``). It answers only where it is sure to compose what the full parse
would: an unknown or plugin's class, another version of lit-embed or jsonargparse than the copy's, an installed
plugin, a syntax it does not read, a task definition the task table refuses or whose labels its rows give, a config
lit-embed wrote (read as recorded) or a value of another type than the names need all give ``None``, and the full
parse answers. Values the names do not
depend on are not checked here: ``fit`` checks them before it trains.
"""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
import json
import sys
import types
import typing
from pathlib import Path

import yaml

from lit_embed.commands.helptext import plugins_installed, versions
from lit_embed.data.hub_names import TaskReads
from lit_embed.data.tasks import TaskSources, get_task, task_sources, xnli_languages, xnli_sources
from lit_embed.errors import ConfigError

COPY = Path(__file__).with_name("signatures.json")
#: Top-level keys of a config that name nothing data check looks up (``trainer`` is read only for its file).
IGNORED = ("seed_everything", "ckpt_path", "ckpt_model")
#: Keys whose string values the names come from, wherever they are in the model's config.
MODEL_NAMES = ("pretrained", "source")
#: The data module's arguments the names come from, and the types a value of each must have (else: the full parse).
DATA_TYPES = {"datasets": (list, type(None)), "files": (list, type(None)), "tokenizer": (str, type(None)),
              "trust_remote_code": (bool,), "task": (str, dict), "data_dir": (str, type(None)), "protocol": (str,),
              "mode": (str,), "train_languages": (list, type(None)), "val_languages": (list, type(None)),
              "test_languages": (list, type(None))}
#: What each section of a config takes: the kinds of class (:func:`signatures_of_classes`).
ROLES = {"model": ("model",), "data": ("data", "task", "xnli", "own")}
#: The packages whose classes the copy holds.
PACKAGES = ("lit_embed.models", "lit_embed.embeddings", "lit_embed.data")


class Unsure(Exception):
    """The light composer cannot be sure it composes what the full parse would: the full parse answers."""


def compose(argv: list[str]) -> tuple[dict, TaskReads | None] | None:
    """The config of ``data check``'s arguments ``argv`` (``model`` and ``data``, each class's defaults filled in) and
    what its task's data module reads (``None`` for other data); ``None`` where only the full parse can say."""
    signatures = _signatures()
    if signatures is None:
        return None
    try:
        config = _compose(argv, signatures)
        return config, _task_reads(config["data"], signatures)
    except Unsure:
        return None


def piece(data: dict) -> tuple[bool, TaskReads | None] | None:
    """Whether a config piece's node (``class_path`` and ``init_args``) is a data module's, and what it reads where it
    is a task's; ``None`` where only the full parse can say."""
    signatures = _signatures()
    if signatures is None:
        return None
    try:
        if _spec(data["class_path"], signatures)["kind"] not in ROLES["data"]:
            return False, None
        node = _merge_node(None, data, Path.cwd(), signatures, ROLES["data"])
        if node is None:
            raise Unsure("no data")
        _complete(node, signatures)
        _check_types({"data": node, "model": None}, signatures)
        return True, _task_reads(node, signatures)
    except Unsure:
        return None


def _signatures() -> dict | None:
    """The shipped copy of the signatures, where it was written with the versions installed and no plugin is (its
    classes are not in the copy, and it may add tasks)."""
    try:
        document = json.loads(COPY.read_text())
    except (OSError, ValueError):
        return None
    if document.get("versions") != versions() or plugins_installed():
        return None
    return document["classes"]


# -- the command line and the files ---------------------------------------------------------------------------


def _compose(argv: list[str], signatures: dict) -> dict:
    config: dict = {}
    words = list(argv)
    while words:
        word = words.pop(0)
        key, equals, value = word.partition("=")
        if not key.startswith("--") or key == "--":
            raise Unsure(word)
        if not equals:
            if not words:
                raise Unsure(word)
            value = words.pop(0)
        if key == "--config":
            _merge_config(config, _config_file(Path(value)), Path(value).parent, signatures)
        else:
            parts = key[2:].split(".")
            if not all(parts):
                raise Unsure(word)
            nested = {parts[-1]: _value(value)}
            for part in reversed(parts[:-1]):
                nested = {part: nested}
            _merge_config(config, nested, Path.cwd(), signatures)
    if config.get("data") is None or config.get("model") is None:
        raise Unsure("a config without a model or data")  # the parser says what is missing
    for section in ("model", "data"):
        _complete(config[section], signatures)
    _check_types(config, signatures)
    return {"model": config["model"], "data": config["data"]}


def _config_file(path: Path) -> dict:
    """A ``--config`` file's mapping; one lit-embed wrote is read as a recorded config, by the full parse."""
    from lit_embed.recorded import written_by_lit_embed  # light: it imports Lightning only where it reads one

    if not path.is_file() or written_by_lit_embed(path):
        raise Unsure(str(path))
    return _mapping(path)


def _mapping(path: Path) -> dict:
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise Unsure(str(path)) from error
    if not isinstance(document, dict):
        raise Unsure(str(path))
    return document


def _value(text: str) -> object:
    """A command-line value as the parser reads it first: YAML, else the text itself."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _file(base: Path, name: str) -> Path:
    """A nested config file named by ``name`` (relative to ``base``, the folder of the file that names it)."""
    path = Path(name).expanduser()
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise Unsure(name)  # a class name, or no such file: the parser says which
    return path


def _merge_config(config: dict, document: dict, base: Path, signatures: dict) -> None:
    for key, value in document.items():
        if key in ROLES:
            config[key] = _merge_node(config.get(key), value, base, signatures, ROLES[key])
        elif key == "trainer":
            if isinstance(value, str):
                _file(base, value)
            elif not isinstance(value, (dict, type(None))):
                raise Unsure(key)
        elif key not in IGNORED:
            raise Unsure(key)


def _merge_node(node: dict | None, given: object, base: Path, signatures: dict,
                takes: collections.abc.Collection[str]) -> dict | None:
    """``node`` (``class_path`` and ``init_args``) with ``given`` merged in: the same class's arguments are merged, a
    class changed keeps those the new class takes too (jsonargparse's rule), a string is a config file. ``takes``: the
    classes the place takes (their paths, or the kinds of data module or model it takes)."""
    if given is None:
        return None
    if isinstance(given, str):
        path = _file(base, given)
        given, base = _mapping(path), path.parent
    if not isinstance(given, dict) or set(given) - {"class_path", "init_args"}:
        raise Unsure(str(given))
    if "class_path" in given:
        spec = _spec(given["class_path"], signatures)
    elif node is not None:
        spec = signatures[node["class_path"]]
    else:
        raise Unsure("init_args without a class_path")
    if spec["path"] not in takes and spec["kind"] not in takes:
        raise Unsure(f"{spec['path']} where it is not taken")  # the parser refuses it, saying what is
    init_args = dict(node["init_args"]) if node is not None else {}
    if node is not None and node["class_path"] != spec["path"]:
        init_args = {key: value for key, value in init_args.items() if key in spec["parameters"]}
        if set(init_args) & {*spec["classes"], *MODEL_NAMES, *DATA_TYPES}:
            raise Unsure("a class changed, keeping an argument the names may depend on")
    given_args = given.get("init_args") or {}
    if not isinstance(given_args, dict):
        raise Unsure("init_args")
    for key, value in given_args.items():
        if key not in spec["parameters"]:
            raise Unsure(f"{spec['path']} takes no {key}")
        taken = spec["classes"].get(key)
        init_args[key] = value if taken is None else _merge_node(init_args.get(key), value, base, signatures,
                                                                 taken["takes"])
    return {"class_path": spec["path"], "init_args": init_args}


def _spec(class_path: object, signatures: dict) -> dict:
    """The copy's signature of the class ``class_path`` names (its module's path or an alias lit-embed exports)."""
    for spec in signatures.values():
        if class_path == spec["path"] or class_path in spec["aliases"]:
            return spec
    raise Unsure(f"class {class_path}")  # a plugin's, a user's, a short name: the parser resolves it


def _complete(node: dict | None, signatures: dict, given: int = 0) -> None:
    """Fill in the defaults of every argument a class node leaves unset, as the parser's config holds them; the first
    ``given`` arguments are its taker's to give (a factory's), not the config's."""
    if node is None:
        return
    spec = signatures[node["class_path"]]
    passed = spec["parameters"][:given]
    missing = [name for name in spec["required"] if name not in node["init_args"] and name not in passed]
    if missing or set(passed) & set(node["init_args"]):
        raise Unsure(f"{spec['path']}: {missing or passed}")
    for name, default in spec["defaults"].items():
        if name not in node["init_args"] and name not in passed:
            if name in spec["classes"] and default is not None:
                raise Unsure(f"{spec['path']}.{name}: a class given by default")
            node["init_args"][name] = copy.deepcopy(default)
    for name, taken in spec["classes"].items():
        child = node["init_args"].get(name)
        if isinstance(child, dict):
            _complete(child, signatures, taken["given"])
        elif child is not None:
            raise Unsure(f"{spec['path']}.{name}")


def _check_types(config: dict, signatures: dict) -> None:
    """Every value the names come from has the type they need (the parser would convert or refuse another)."""
    args = config["data"]["init_args"]
    for key, allowed in DATA_TYPES.items():
        if key in args and not isinstance(args[key], allowed):
            raise Unsure(f"data.init_args.{key}")
    for key in ("datasets", "files", "train_languages", "val_languages", "test_languages"):
        if not all(isinstance(item, str) for item in args.get(key) or []):
            raise Unsure(f"data.init_args.{key}")
    _check_model(config["model"], signatures)


def _check_model(node: dict | None, signatures: dict) -> None:
    if node is None:
        return
    spec = signatures[node["class_path"]]
    for key, value in node["init_args"].items():
        if key in spec["classes"]:
            _check_model(value, signatures)
        elif key in MODEL_NAMES:
            if not isinstance(value, (str, type(None))):
                raise Unsure(f"{spec['path']}.{key}")
        elif _names_inside(value):
            raise Unsure(f"{spec['path']}.{key}")  # a name inside plain values: how the parser merges those is not copied


def _names_inside(value: object) -> bool:
    if isinstance(value, list):
        return any(_names_inside(item) for item in value)
    if isinstance(value, dict):
        return any(key in MODEL_NAMES or _names_inside(item) for key, item in value.items())
    return False


# -- what a task's data module reads --------------------------------------------------------------------------


def _task_reads(data: dict, signatures: dict) -> TaskReads | None:
    """What a task's data module built from ``data`` reads; ``None`` for other data."""
    spec = signatures[data["class_path"]]
    if spec["kind"] not in ("task", "xnli"):
        if spec["kind"] != "data":
            raise Unsure(f"{spec['path']} reads what its own methods say")
        return None
    args = data["init_args"]
    if spec["kind"] == "xnli":
        args = {**args, "task": "xnli"}
    data_dir = Path(args["data_dir"]).expanduser() if args["data_dir"] else None
    if args["protocol"] not in ("standard", "split_train") or (data_dir is not None and not data_dir.is_dir()):
        raise Unsure("the data module refuses its arguments")  # it says why
    own = args["task"] if isinstance(args["task"], dict) else {}
    if own and own.get("labels") is None and not own.get("regression"):  # before it is registered: the parse defines it
        raise Unsure(f"task {own.get('name')}: labels read from its rows")  # the module reads them (and checks with them)
    try:
        task = get_task(args["task"])
        if spec["kind"] == "xnli":
            sources: TaskSources = xnli_sources(args["protocol"], *xnli_languages(
                args["mode"], args["train_languages"], args["val_languages"], args["test_languages"]))
        else:
            sources = task_sources(task, args["protocol"])
    except ConfigError as error:  # an unknown task, language or mode: the full parse names it as fit does
        raise Unsure(str(error)) from error
    return TaskReads(task, data_dir, sources)


# -- the copy -------------------------------------------------------------------------------------------------


def signatures_of_classes() -> dict:
    """The signatures of every class of :data:`PACKAGES` a config may name (imports them all: torch, Lightning): the
    models and data modules, and each class an argument of theirs takes (and so on). For each: its path, the paths
    lit-embed exports it under, its arguments' defaults, those it requires, those that take a class (a string there
    is a config file), and what kind of data module it is."""
    import importlib
    import inspect
    import pkgutil

    import pytorch_lightning as pl

    from lit_embed.data.finetune import TaskDataModule, XNLIDataModule

    packages = [importlib.import_module(package) for package in PACKAGES]
    modules = packages + [importlib.import_module(f"{package.__name__}.{info.name}") for package in packages
                          for info in pkgutil.iter_modules(package.__path__)]
    found = {value for module in modules for value in vars(module).values()
             if isinstance(value, type) and value.__module__.startswith("lit_embed.") and "<" not in value.__qualname__}
    wanted = [cls for cls in found if issubclass(cls, (pl.LightningModule, pl.LightningDataModule))]
    seen: set[type] = set()
    classes = {}
    while wanted:
        cls = wanted.pop()
        if cls in seen:
            continue
        seen.add(cls)
        try:
            parameters = list(inspect.signature(cls).parameters.values())
            defaults = json.loads(json.dumps(  # as the copy holds them (a tuple is a list)
                {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}))
        except (TypeError, ValueError):
            continue  # no signature, or a default no config can hold: not one the copy answers for
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
            continue
        kind = "model" if issubclass(cls, pl.LightningModule) else "other"
        if issubclass(cls, pl.LightningDataModule):
            kind = "data"
            if issubclass(cls, TaskDataModule):
                methods = {name: getattr(cls, name) for name in ("train_sources", "validation_sources", "test_sources")}
                kind = next((name for name, base in (("xnli", XNLIDataModule), ("task", TaskDataModule))
                             if all(m is getattr(base, n) for n, m in methods.items())), "own")
        taken = {p.name: found_ for p in parameters if (found_ := _class_argument(cls, p.name)) is not None}
        path = _path(cls)
        classes[path] = {
            "path": path, "kind": kind, "defaults": defaults,
            "aliases": sorted({f"{package.__name__}.{cls.__name__}" for package in packages  # as lit-embed exports it
                               if getattr(package, cls.__name__, None) is cls}),
            "required": [p.name for p in parameters if p.default is inspect.Parameter.empty],
            "parameters": [p.name for p in parameters],
            "classes": {name: {"given": given, "takes": sorted(_path(c) for c in found if issubclass(c, tuple(bases)))}
                        for name, (given, bases) in taken.items()},
        }
        wanted += [other for _, bases in taken.values() for other in found if issubclass(other, tuple(bases))]
    return dict(sorted(classes.items()))


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _class_argument(cls: typing.Any, name: str) -> tuple[int, list[type]] | None:
    """Where argument ``name`` of ``cls`` takes a class (its config: ``class_path`` and ``init_args``, or a file of
    them, where the parser is given a string): how many of that class's first arguments the taker gives it (a
    factory, ``Callable[[int], Hasher]``: 1), and the classes it takes; ``None`` where it takes plain values."""
    try:
        hint = typing.get_type_hints(cls.__init__).get(name)
    except Exception:  # a hint naming what its module does not import: the copy cannot tell, so strings are files
        return 0, []
    top = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return None if str in top else _taken(hint)


def _taken(hint: object) -> tuple[int, list[type]] | None:
    if isinstance(hint, type) and typing.get_origin(hint) is None:  # a dataclass is a group of plain values
        plain = (str, int, float, bool, type(None), dict, list, tuple, set, Path, object)
        return None if hint in plain or dataclasses.is_dataclass(hint) else (0, [hint])
    arguments = typing.get_args(hint)
    if typing.get_origin(hint) is collections.abc.Callable and len(arguments) == 2 and isinstance(arguments[0], list):
        made = _taken(arguments[1])
        return None if made is None else (len(arguments[0]), made[1])
    found = [taken for argument in arguments if (taken := _taken(argument)) is not None]
    return (max(given for given, _ in found), [cls for _, classes in found for cls in classes]) if found else None


def write(path: Path = COPY) -> None:
    """Write the copy again (after changing a class's arguments; ``tests/test_data_check_light.py`` fails until
    then), headed by the versions it holds for."""
    document = {"versions": versions(), "classes": signatures_of_classes()}
    path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else COPY)
    print(f"wrote the signatures to {sys.argv[1] if len(sys.argv) > 1 else COPY}", file=sys.stderr)
