"""A sweep file and its plan: every run of every stage, named from its axis values.

A stage's runs are every combination of its ``axes`` (the table's rows, and its tasks: the axis named
``task``), its ``search`` grid (searched: the best on validation wins per model x task) and its ``seeds``
(averaged). A run is the command line of one ``lit-embed fit`` (or ``compress``, then ``test`` unless the stage
says ``test: false``) in a folder
of its own, ``SWEEP/<stage>/<axis=value,...>``. A value may refer to an earlier stage's result,
``${stage.checkpoint}`` or ``${stage.folder}``: which of its runs is known from the axes the two stages
share (and the seed), and the earlier stage's best grid point, once those runs have finished.

A sweep file names config files as configs do (jsonargparse's rule): relative to its own folder (``config:``; and a
value naming a ``.yaml`` file there), so it runs from any folder; its ``folder:`` and other paths (a checkpoint, data
files) are read from the folder lit-embed runs in, as ``default_root_dir`` and a data module's files are.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lit_embed.errors import ConfigError, MissingFileError

#: ``${stage.checkpoint}``: the best checkpoint of the matching run of an earlier stage; ``${stage.folder}``: its folder.
REFERENCE = re.compile(r"\$\{([A-Za-z0-9_-]+)\.(checkpoint|folder)\}")
NAME = re.compile(r"[A-Za-z0-9._+-]+")
#: Folders of the sweep folder that are not stages.
RESERVED = ("logs", "slurm")
COMMANDS = ("fit", "compress")
TOP_KEYS = ("folder", "gpus_per_run", "slurm", "stages")
STAGE_KEYS = ("command", "config", "set", "axes", "search", "seeds", "select", "label", "gpus_per_run", "slurm", "test")
TASK_AXIS = "task"
SEED_AXIS = "seed"
MAX_NAME = 200


@dataclass(frozen=True)
class Value:
    """One value of an axis: its name in run folders and labels, the config files it adds, the keys it sets."""

    axis: str
    short: str  # the axis as run names show it (``lr`` for ``model.init_args.optim.lr``)
    name: str
    configs: tuple[str, ...] = ()
    keys: tuple[tuple[str, object], ...] = ()
    named: bool = False  # a named value (``model: {3se: {...}}``), shown by its name alone in labels

    @property
    def part(self) -> str:
        return f"{self.short}={self.name}"


@dataclass(frozen=True)
class Select:
    """How a stage's best grid point is chosen: the mean of ``metric`` over its seeds, highest (``max``) or lowest."""

    metric: str = "val/score"
    mode: str = "max"

    def best(self, scores: dict) -> object:
        """The key of the best score (``None`` and non-finite values left out: an undefined score chooses nothing;
        ties: the first)."""
        scored = [(key, value) for key, value in scores.items() if value is not None and math.isfinite(value)]
        if not scored:
            return None
        pick = max if self.mode == "max" else min
        return pick(scored, key=lambda item: item[1])[0]

    def describe(self) -> str:
        return f"{'highest' if self.mode == 'max' else 'lowest'} {self.metric}"


@dataclass
class Stage:
    name: str
    command: str
    configs: list[str]
    fixed: dict
    axes: list[list[Value]]      # rows and tasks
    search: list[list[Value]]    # the grid searched per model x task
    seeds: list[int] | None
    select: Select
    label: str | None
    gpus_per_run: int
    slurm: dict
    test: bool = True  # a compress stage tests its model (false: a fit from a pretrained encoder has no task head yet)
    runs: list[Run] = field(default_factory=list)

    @property
    def references(self) -> list[str]:
        """The earlier stages this stage's values refer to."""
        texts = [json.dumps(self.fixed)] + [json.dumps(v.keys) for axis in self.axes + self.search for v in axis]
        return list(dict.fromkeys(m.group(1) for text in texts for m in REFERENCE.finditer(text)))

    @property
    def axis_names(self) -> list[str]:
        return [axis[0].axis for axis in self.axes]


@dataclass
class Run:
    """One run: its stage, its values (axes, then search, then seed) and its folder."""

    stage: Stage
    values: tuple[Value, ...]
    seed: int | None
    folder: Path
    dependencies: list[Run] = field(default_factory=list)  # earlier runs its references choose among
    unmet: str | None = None  # why the run is left out: its strategy cannot meet its budget (or its start's cannot)

    @property
    def name(self) -> str:
        return ",".join(v.part for v in self.values) or "run"

    @property
    def id(self) -> str:
        return f"{self.stage.name}/{self.name}"

    def value(self, axis: str) -> str | None:
        return next((v.name for v in self.values if v.axis == axis), None)

    @property
    def row(self) -> tuple[tuple[str, str], ...]:
        """The values that make the table's row and column (the axes): runs of one row differ only in
        search point and seed."""
        return tuple((v.axis, v.name) for v in self.values[:len(self.stage.axes)])

    @property
    def point(self) -> str:
        """The grid point (search values), as run names show it."""
        search = self.values[len(self.stage.axes):len(self.stage.axes) + len(self.stage.search)]
        return ",".join(v.part for v in search)

    @property
    def label(self) -> str:
        """The report's row name: the stage's ``label`` template, else the row axes' values, else the stage."""
        rows = [v for v in self.values[:len(self.stage.axes)] if v.axis != TASK_AXIS]
        if self.stage.label is not None:
            names = {key: v.name for v in rows for key in (v.axis, v.short)}
            return re.sub(r"\{([^{}]+)\}", lambda m: names[m.group(1)], self.stage.label)
        return ",".join(v.name if v.named else v.part for v in rows) or self.stage.name

    @property
    def variant(self) -> str:
        """The words of the stage's label besides its axes' values (``post-hoc`` in ``{strategy} {budget} post-hoc``):
        a figure draws these runs as a line of their own beside the same strategy's other runs."""
        if self.stage.label is None or not re.search(r"\{[^{}]+\}", self.stage.label):
            return ""
        return " ".join(re.sub(r"\{[^{}]+\}", " ", self.stage.label).split())

    def overrides(self) -> list[tuple[str, object]]:
        """The stage's fixed keys, then the values' keys: what goes on the command line after the config files."""
        return [*self.stage.fixed.items(), *(item for v in self.values for item in v.keys)]

    def configs(self) -> list[str]:
        """The axis values' config files, then the stage's (composed after them, as a protocol file is)."""
        return [c for v in self.values for c in v.configs] + self.stage.configs


@dataclass
class Sweep:
    path: Path
    folder: Path
    stages: list[Stage]

    @property
    def runs(self) -> list[Run]:
        return [run for stage in self.stages for run in stage.runs]

    def run(self, run_id: str) -> Run:
        found = next((r for r in self.runs if r.id == run_id), None)
        if found is None:
            raise ConfigError(f"{run_id!r} is not a run of {self.path} (its runs: {', '.join(r.id for r in self.runs[:4])}, "
                              f"...); was the sweep file changed? Run `lit-embed sweep --config {self.path} --dry-run`")
        return found

    @property
    def name(self) -> str:
        return self.folder.name

    def leave_out(self, unmet: Callable[[Run], str | None]) -> None:
        """Mark the runs that cannot be: those ``unmet`` gives a reason for (a strategy whose structure cannot meet
        the run's budget), and those that start only from such runs. They are not launched; the plan, the summary and
        the report say why."""
        for run in self.runs:
            starts = [r for r in run.dependencies if r.unmet is None]
            if run.dependencies and not starts:
                run.unmet = f"starts from {run.dependencies[0].id}, which is left out"
            elif not run.stage.references:
                run.unmet = unmet(run)


def load_sweep(path: str | Path, folder: str | Path | None = None) -> Sweep:
    """The plan of the sweep file ``path``; its runs go under ``folder`` (default the file's ``folder``, else
    ``runs/sweeps/<file name>``). The config files it names are read from its folder (see the module's docstring)."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"sweep file {str(path)!r} does not exist")
    document = yaml.safe_load(path.read_text()) or {}
    where = f"sweep file {path}"
    if not isinstance(document, dict) or not isinstance(document.get("stages"), dict) or not document["stages"]:
        raise ConfigError(f"{where} needs `stages:`, a mapping of stage names to stages (config, axes, search, seeds)")
    _known_keys(document, TOP_KEYS, where)
    folder = Path(folder or document.get("folder") or Path("runs") / "sweeps" / path.stem)
    default_gpus = _count(document.get("gpus_per_run", 1), f"{where}: gpus_per_run")
    slurm = _mapping(document.get("slurm"), f"{where}: slurm")
    stages: list[Stage] = []
    for name, spec in document["stages"].items():
        stage = _stage(str(name), spec, f"{where}, stage {name!r}", default_gpus, slurm, path.parent)
        defined = [s.name for s in stages]
        for reference in stage.references:
            if reference not in defined:
                raise ConfigError(f"{where}, stage {name!r} refers to ${{{reference}...}}, which is not an earlier stage "
                                  f"({', '.join(defined) or 'there is none'}): stages run in the order the file gives")
        stages.append(stage)
    sweep = Sweep(path, folder, stages)
    for stage in stages:
        stage.runs = _runs(stage, folder, where)
        _check_names(stage, where)
    by_name = {s.name: s for s in stages}
    for stage in stages:
        for run in stage.runs:
            run.dependencies = [r for ref in stage.references for r in candidates(run, by_name[ref])]
    return sweep


def candidates(run: Run, earlier: Stage) -> list[Run]:
    """The runs of ``earlier`` that ``run``'s reference to it chooses among: those with the values of the axes
    the two stages share; of those, the best grid point (and ``run``'s seed, else the best seed) when they finish."""
    unmatched = [axis for axis in earlier.axis_names if run.value(axis) is None]
    if unmatched:
        raise ConfigError(
            f"stage {run.stage.name!r} refers to stage {earlier.name!r}, whose runs differ in {', '.join(unmatched)}: give "
            f"{run.stage.name!r} the same axis (each of its runs then uses the run with its value)"
        )
    return [r for r in earlier.runs if all(r.value(axis) == run.value(axis) for axis in earlier.axis_names)]


# -- the file ----------------------------------------------------------------------------------------------


def _stage(name: str, spec, where: str, default_gpus: int, slurm: dict, base: Path) -> Stage:
    if not NAME.fullmatch(name) or name in RESERVED:
        raise ConfigError(f"{where}: a stage name is letters, digits, '.', '_', '+' or '-', and not {' or '.join(RESERVED)}")
    spec = _mapping(spec, where)
    _known_keys(spec, STAGE_KEYS, where)
    command = spec.get("command", "fit")
    if command not in COMMANDS:
        raise ConfigError(f"{where}: command {command!r} is not one of {', '.join(COMMANDS)}")
    configs = _files(spec.get("config"), f"{where}: config", base)
    if command == "fit" and not configs and not spec.get("axes"):
        raise ConfigError(f"{where} names no config: give `config:` (the experiment config its runs start from)")
    fixed = {key: _config_path(value, base) for key, value in _mapping(spec.get("set"), f"{where}: set").items()}
    axes = [_axis(axis, values, f"{where}: axes.{axis}", base)
            for axis, values in _mapping(spec.get("axes"), f"{where}: axes").items()]
    search = [_axis(axis, values, f"{where}: search.{axis}", base, named=False)
              for axis, values in _mapping(spec.get("search"), f"{where}: search").items()]
    axes, search = _short_names_unique(axes, search, where)
    seeds = spec.get("seeds")
    if seeds is not None and (not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds)
                              or len(set(seeds)) != len(seeds)):
        raise ConfigError(f"{where}: seeds must be a list of distinct integers, e.g. [1, 2, 3] (got {seeds!r})")
    select = _mapping(spec.get("select"), f"{where}: select")
    _known_keys(select, ("metric", "mode"), f"{where}: select")
    chosen = Select(**select)
    if chosen.mode not in ("max", "min"):
        raise ConfigError(f"{where}: select.mode {chosen.mode!r} is not max or min")
    label = spec.get("label")
    if label is not None:
        allowed = {key for axis in axes if axis[0].axis != TASK_AXIS for key in (axis[0].axis, axis[0].short)}
        used = set(re.findall(r"\{([^{}]+)\}", str(label)))
        if used - allowed:
            raise ConfigError(f"{where}: label {label!r} names {', '.join(sorted(used - allowed))}, which is not one of its "
                              f"axes ({', '.join(sorted(allowed)) or 'none'}): a row's name may not vary by task, grid point or seed")
        label = str(label)
    gpus = _count(spec.get("gpus_per_run", default_gpus), f"{where}: gpus_per_run")
    test = spec.get("test", True)
    if not isinstance(test, bool):
        raise ConfigError(f"{where}: test must be true or false (got {test!r})")
    if command != "compress" and "test" in spec:
        raise ConfigError(f"{where}: test is a key of compress stages (whether `lit-embed test` runs after compress); a "
                          f"{command} stage's config decides its own testing: remove the key")
    return Stage(name, command, configs, fixed, axes, search, seeds, chosen, label, gpus,
                 {**slurm, **_mapping(spec.get("slurm"), f"{where}: slurm")}, test)


def _axis(axis: str, values, where: str, base: Path, named: bool = True) -> list[Value]:
    """A list of a key's values, or (in ``axes``) a mapping of value names to the keys and config files they set."""
    if isinstance(values, dict) and named:
        if not values:
            raise ConfigError(f"{where} has no values")
        result = []
        for name, spec in values.items():
            name = str(name)
            if not NAME.fullmatch(name):
                raise ConfigError(f"{where}: value name {name!r} may hold only letters, digits, '.', '_', '+' and '-' "
                                  f"(it names run folders)")
            spec = dict(_mapping(spec, f"{where}.{name}"))
            configs = _files(spec.pop("config", None), f"{where}.{name}: config", base)
            keys = tuple((key, _config_path(value, base)) for key, value in spec.items())
            result.append(Value(axis, axis, name, tuple(configs), keys, named=True))
        return result
    if not isinstance(values, list) or not values:
        kind = "a list of values" + (", or a mapping of names to the keys each sets" if named else "")
        raise ConfigError(f"{where} must be {kind} (got {values!r})")
    short = axis.rsplit(".", 1)[-1]
    result = [Value(axis, short, _format(v), (), ((axis, _config_path(v, base)),)) for v in values]  # named as written
    names = [v.name for v in result]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        fix = "give each value a name (a mapping of names to the keys each sets)" if named else "give each value once"
        raise ConfigError(f"{where}: two of its values {values!r} would share the run folder name {short}={twice}: {fix}")
    return result


def _short_names_unique(axes: list[list[Value]], search: list[list[Value]], where: str):
    """Run names show a key axis by its last part (``lr``): axes that would look alike keep their full keys."""
    every = axes + search
    shorts = [axis[0].short for axis in every]

    def full(axis: list[Value]) -> list[Value]:
        if shorts.count(axis[0].short) > 1 and not axis[0].named:
            return [Value(v.axis, v.axis, v.name, v.configs, v.keys) for v in axis]
        return axis

    axes, search = [full(a) for a in axes], [full(a) for a in search]
    names = [axis[0].short for axis in axes + search]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: two axes have the same name")
    if SEED_AXIS in names:
        raise ConfigError(f"{where}: an axis is named {SEED_AXIS!r}; give seeds as `seeds: [...]`")
    return axes, search


def _combinations(stage: Stage) -> list[tuple[Value, ...]]:
    seeds = [[Value(SEED_AXIS, SEED_AXIS, str(s))] for s in stage.seeds] if stage.seeds else [[]]
    grid = itertools.product(*stage.axes, *stage.search)
    return [(*values, *seed) for values in grid for seed in seeds]


def _runs(stage: Stage, folder: Path, where: str) -> list[Run]:
    """The stage's runs, each in a folder of its own inside the sweep folder ``folder``: its stage, axis and value
    names are plain folder names, and no symlink leads a run folder out of ``folder`` (where another sweep would
    find it and count it as its own)."""
    _check_component(stage.name, "stage name", where)
    for axis in stage.axes + stage.search:
        _check_component(axis[0].short, "axis name", f"{where}, stage {stage.name!r}")
        for value in axis:
            _check_component(value.name, f"value of axis {axis[0].axis!r}", f"{where}, stage {stage.name!r}")
    runs = [Run(stage, values, _seed(values), folder / stage.name / _name(values)) for values in _combinations(stage)]
    root = folder.resolve()
    for run in runs:
        found = run.folder.resolve()
        if root not in found.parents:
            raise ConfigError(f"{where}, stage {stage.name!r}: run folder {run.folder} resolves to {found}, outside the "
                              f"sweep folder {root} (a symlink leads out of it): remove the link, or give the sweep "
                              f"another folder")
    return runs


def _check_component(name: str, what: str, where: str) -> None:
    """Refuse a name that would not be one folder of its own: empty, ``.`` or ``..``, a path (a separator, which an
    absolute path starts with), hidden (a leading ``.``) or holding a control character."""
    if not name:
        rule = "is empty"
    elif name in (".", ".."):
        rule = "is the name of a folder itself or of its parent"
    elif "/" in name or "\\" in name:
        rule = "holds a path separator"
    elif name.startswith("."):
        rule = "starts with '.', which hides a folder"
    elif any(unicodedata.category(c) == "Cc" for c in name):
        rule = "holds a control character"
    else:
        return
    raise ConfigError(f"{where}: {what} {name!r} {rule}: it becomes a folder inside the sweep folder, so give it a plain "
                      f"name (letters, digits, '_', '+', '-', and '.' after the first character)")


def _seed(values: tuple[Value, ...]) -> int | None:
    return next((int(v.name) for v in values if v.axis == SEED_AXIS), None)


def _name(values: tuple[Value, ...]) -> str:
    return ",".join(v.part for v in values) or "run"


def _check_names(stage: Stage, where: str) -> None:
    long = [r.name for r in stage.runs if len(r.name) > MAX_NAME]
    if long:
        raise ConfigError(f"{where}, stage {stage.name!r}: run name {long[0]!r} is longer than {MAX_NAME} characters: "
                          f"give long values short names (a mapping of names to values)")
    names = [r.name for r in stage.runs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{where}, stage {stage.name!r}: two runs would share the folder {twice[0]!r}: give the values "
                          f"names that differ (a mapping of names to values)")


def _format(value) -> str:
    """A value as run folders show it: ``0.003``, ``2e-05``, ``true``; other characters than letters, digits
    and ``._+-`` become ``_``."""
    if isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, float):
        text = format(value, "g")
    elif isinstance(value, (int, str)):
        text = str(value)
    else:
        text = json.dumps(value, separators=(",", ":"), sort_keys=True)
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text) or "_"


def _files(value, where: str, base: Path) -> list[str]:
    files = [value] if isinstance(value, str) else list(value or [])
    for name in files:
        if not isinstance(name, str):
            raise ConfigError(f"{where}: {name!r} is not a file name")
        if not Path(_from(base, name)).is_file():
            raise MissingFileError(f"{where}: {name!r} does not exist in {base} (a sweep file names config files relative "
                                   f"to its own folder, as configs do; or give an absolute path)")
    return [_from(base, name) for name in files]


def _config_path(value, base: Path):
    """A value naming a config file in the sweep file's folder ``base`` (``.yaml``, ``.yml``; or a list of them) as a
    path from the folder lit-embed runs in; any other value as it is (read as on a command line)."""
    if isinstance(value, list):
        return [_config_path(item, base) for item in value]
    if isinstance(value, str) and value.endswith((".yaml", ".yml")) and Path(_from(base, value)).is_file():
        return _from(base, value)
    return value


def _from(base: Path, name: str) -> str:
    """``name``, relative to the sweep file's folder ``base``, as a path from the folder lit-embed runs in (absolute
    where ``base`` is; ``..`` taken out where no symlink makes that another place); an absolute ``name`` as it is."""
    if Path(name).is_absolute():
        return name
    joined = base / name
    short = os.path.normpath(joined)
    return short if Path(short).resolve() == joined.resolve() else str(joined)


def _mapping(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping (got {value!r})")
    return value


def _known_keys(spec: dict, known: tuple[str, ...], where: str) -> None:
    unknown = [str(k) for k in spec if k not in known]
    if unknown:
        raise ConfigError(f"{where}: unknown key {', '.join(unknown)} (known: {', '.join(known)})")


def _count(value, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{where} must be a whole number, 0 or more (got {value!r})")
    return value


# -- the plan as the sweep folder records it (for `lit-embed report SWEEP_FOLDER`) -------------------------

MANIFEST = "sweep.json"
MANIFEST_FORMAT = 1


def manifest(sweep: Sweep) -> dict:
    """What ``lit-embed report`` needs of the plan: each stage's axes, grid, seeds, selection rule and label."""
    def axes(groups: list[list[Value]]) -> list[list[dict]]:
        return [[{"axis": v.axis, "short": v.short, "name": v.name, "named": v.named} for v in group] for group in groups]

    return {
        "format": MANIFEST_FORMAT,
        "sweep_file": str(sweep.path),
        "unmet": {run.id: run.unmet for run in sweep.runs if run.unmet},
        "stages": [{"name": s.name, "command": s.command, "axes": axes(s.axes), "search": axes(s.search), "seeds": s.seeds,
                    "select": {"metric": s.select.metric, "mode": s.select.mode}, "label": s.label, "test": s.test}
                   for s in sweep.stages],
    }


def read_manifest(folder: str | Path) -> Sweep:
    """The plan recorded in ``folder/sweep.json`` (its runs under ``folder``, wherever it has moved)."""
    folder = Path(folder)
    path = folder / MANIFEST
    try:
        document = json.loads(path.read_text())
        if document.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"format {document.get('format')!r}")
        stages = []
        for spec in document["stages"]:
            def axes(groups) -> list[list[Value]]:
                return [[Value(v["axis"], v["short"], v["name"], named=v["named"]) for v in group] for group in groups]

            stage = Stage(spec["name"], spec["command"], [], {}, axes(spec["axes"]), axes(spec["search"]), spec["seeds"],
                          Select(**spec["select"]), spec["label"], 0, {}, spec.get("test", True))
            stage.runs = _runs(stage, folder, str(path))
            for run in stage.runs:
                run.unmet = document.get("unmet", {}).get(run.id)
            stages.append(stage)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"{path} is not a sweep plan lit-embed can read ({error}): run `lit-embed sweep` again to rewrite it") from None
    return Sweep(Path(document["sweep_file"]), folder, stages)


def is_sweep_folder(folder: str | Path) -> bool:
    return (Path(folder) / MANIFEST).is_file()
