"""Run results: one ``results.json`` per run folder, written atomically, read back by ``lit-embed report``.

The file holds what a table row needs without the checkpoint: the config, seed, task and label, the
library versions, the final metrics, the parameter figures and the timings (see
:class:`lit_embed.callbacks.ResultsWriter`, which writes it).
"""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from lit_embed.errors import ConfigError, MissingFileError

RESULTS_FILE = "results.json"
#: Bumped when the layout of ``results.json`` changes incompatibly.
RESULTS_FORMAT = 1
#: A run's ``status``, the one list of them: ``complete`` (every step the command asked for finished: fit, then the
#: test it runs on task data), ``interrupted`` (a signal stopped it; ``--ckpt_path last`` resumes it), ``untested`` (its
#: fit finished and the test it asked for has not: a kill in between leaves this), ``diverged`` (stopped on a
#: non-finite loss or non-finite weights: its checkpoints are no model). Only ``complete`` runs are reported.
#: A results.json without ``status`` (written before it was added) is ``complete``.
STATUSES = ("complete", "interrupted", "untested", "diverged")
COMPLETE = "complete"
DIVERGED = "diverged"
#: The last component of a metric name that is a score (higher is better): PRR is defined for these, and tables show
#: them x 100. ``score`` is what selects a task's checkpoints (``val/score``: its first metric, or its paper's).
SCORE_METRICS = ("accuracy", "f1", "matthews", "pearson", "spearman", "exact_match", "score")
#: Stages whose metrics are evaluations (PRR is computed for these, not for training metrics).
EVAL_STAGES = ("val", "test")
#: How far apart (1-minute load average per core) two timings' loads may be before a comparison of them is flagged:
#: half the machine's cores busy with other work in one and not the other slows it by up to about that much.
LOAD_MARGIN = 0.5


def versions() -> dict[str, str]:
    """The versions a result depends on."""
    import pytorch_lightning
    import torch
    import transformers

    import lit_embed

    return {
        "lit_embed": lit_embed.__version__,
        "torch": str(torch.__version__),  # a TorchVersion object otherwise: not plain data
        "pytorch_lightning": pytorch_lightning.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def load_average() -> float | None:
    """The machine's 1-minute load average now (``uptime``'s first figure); ``None`` where the system gives none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):  # Windows has none
        return None


def load_over(start: float | None) -> dict:
    """What a timing records of the machine it ran on, beside its figures: the 1-minute load average at its start
    (``start``, a :func:`load_average` read then) and now, at its end, and the machine's cores. A time measured while
    other work ran is longer by it; ``lit-embed report`` flags a comparison of two measured at unlike loads."""
    return {"load_1min": [start, load_average()], "cores": os.cpu_count()}


def load_per_core(record: dict | None) -> float | None:
    """The mean load a :func:`load_over` record read, per core; ``None`` where it holds none (results written before)."""
    readings = [x for x in (record or {}).get("load_1min") or () if x is not None]
    cores = (record or {}).get("cores")
    return sum(readings) / len(readings) / cores if readings and cores else None


def loads_differ(mine: float | None, theirs: float | None) -> bool | None:
    """Whether two timings' loads per core (:func:`load_per_core`) lie more than :data:`LOAD_MARGIN` apart, so that a
    ratio of the two measures the machine's other work as well as what was timed; ``None`` where one is not known."""
    return None if mine is None or theirs is None else abs(mine - theirs) > LOAD_MARGIN


def is_score(name: str, scores: Collection[str] = ()) -> bool:
    """Whether metric ``name`` (``{stage}/...{metric}``) is an evaluation score that PRR applies to: one of
    :data:`SCORE_METRICS`, or of ``scores``, the higher-is-better metrics a run's task names (results.json's
    ``scores``: a config's own task may name any torchmetrics function)."""
    parts = name.split("/")
    return len(parts) >= 2 and parts[0] in EVAL_STAGES and (parts[-1] in SCORE_METRICS or parts[-1] in scores)


def load_results(run_dir: str | os.PathLike) -> dict:
    """The results of one run folder, with ``run_dir`` set; a clear error when there are none, or when the file is not
    a ``results.json`` of the shape :data:`SHAPE` gives (the one place its keys' types are checked: report and the
    sweeps read them as given here)."""
    path = Path(run_dir) / RESULTS_FILE
    if not path.is_file():
        raise MissingFileError(
            f"{run_dir}: no {RESULTS_FILE}. The run did not finish, or ran without the "
            f"lit_embed.callbacks.ResultsWriter callback (the shipped trainer configs enable it): "
            f"rerun it, or leave the folder out"
        )
    fix = "it was not written by this lit-embed's ResultsWriter (or was edited): rerun the run, or leave the folder out"
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path} is not UTF-8 text (byte {error.start}): {fix}") from None
    except RecursionError:
        raise ConfigError(f"{path} nests its values too deep to read: {fix}") from None
    except ValueError as error:  # not JSON, or a number too long to read
        raise ConfigError(f"{path} is not valid JSON ({error}): {fix}") from None
    if not isinstance(data, dict) or data.get("format") != RESULTS_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ConfigError(f"{path} has format {found!r}, expected {RESULTS_FORMAT}: it was not written by this lit-embed")
    problem = SHAPE.problem(data, "")
    if problem is not None:
        raise ConfigError(f"{path}: {problem}: {fix}")
    data["run_dir"] = str(run_dir)
    return data


# -- the shape of results.json: every key report and the sweeps read, with its type --------------------------------

#: The largest whole number read (a count, a seed): beyond it a count is no count, and floats cannot hold it.
LARGEST = 2**63


@dataclass(frozen=True)
class Shape:
    """What a value must be; :meth:`problem` says where and how a value is not (``None``: it is)."""

    kind: type | tuple[type, ...] = object  # the JSON type: str, int, (int, float), dict, list
    shown: str = "anything"                  # its name in messages
    nullable: bool = False
    finite: bool = True                      # a number: NaN and infinities refused
    keys: dict[str, Shape] | None = None     # a mapping's keys (others are kept unread)
    required: tuple[str, ...] = ()
    values: Shape | None = None              # every value of a mapping, every item of a list
    choices: tuple[str, ...] = ()

    def problem(self, value, key: str) -> str | None:
        where = f"key {key!r}" if key else "the file"
        if value is None:
            return None if self.nullable else f"{where} is null, not {self.shown}"
        if isinstance(value, bool) or not isinstance(value, self.kind):
            return f"{where} is {_described(value)}, not {self.shown}{' (or null)' if self.nullable else ''}"
        if isinstance(value, int) and not -LARGEST < value < LARGEST:
            return f"{where} is {_described(value)}, out of range (at most 2**63 in size)"
        if isinstance(value, float) and self.finite and not math.isfinite(value):
            return f"{where} is {value}, not {self.shown}"
        if self.choices and value not in self.choices:
            return f"{where} is {value!r}, not one of {', '.join(map(repr, self.choices))}"
        if isinstance(value, dict):
            missing = [name for name in self.required if name not in value]
            if missing:
                return f"{where} lacks {', '.join(repr(f'{key}.{m}' if key else m) for m in missing)}"
            for name, item in value.items():
                shape = (self.keys or {}).get(name, self.values)
                found = None if shape is None else shape.problem(item, f"{key}.{name}" if key else name)
                if found is not None:
                    return found
        if isinstance(value, list) and self.values is not None:
            for index, item in enumerate(value):
                found = self.values.problem(item, f"{key}[{index}]")
                if found is not None:
                    return found
        return None


def _described(value) -> str:
    """A JSON value as a message shows it."""
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    if isinstance(value, int) and abs(value) >= 10**20:
        return f"a number of {len(str(abs(value)))} digits"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    return {dict: "a mapping", list: "a list"}.get(type(value), type(value).__name__)


TEXT = Shape(str, "text")
WHOLE = Shape(int, "a whole number")
NUMBER = Shape((int, float), "a finite number")
#: A metric may be undefined (NaN: a correlation of constant predictions) or have diverged (a loss of inf).
METRIC = Shape((int, float), "a number", finite=False)
TIMING = Shape(dict, "a mapping", nullable=True, keys={"ms_per_sample": Shape((int, float), "a finite number", nullable=True)})
LOAD = Shape(dict, "a mapping", nullable=True, keys={"load_1min": Shape(list, "a list of numbers", values=Shape(
    (int, float), "a finite number", nullable=True)), "cores": Shape(int, "a whole number", nullable=True)})
SHAPE = Shape(dict, "a mapping", required=("label",), keys={
    "label": TEXT,
    "status": Shape(str, "text", choices=STATUSES),
    "command": Shape(str, "text", nullable=True),
    "task": Shape(str, "text", nullable=True),
    "seed": Shape(int, "a whole number", nullable=True),
    "paper": Shape(str, "text", nullable=True),
    "backbone": Shape(dict, "a mapping", nullable=True, required=("arch", "layers", "hidden", "heads", "ffn"), keys={
        "arch": TEXT, "layers": WHOLE, "hidden": WHOLE, "heads": WHOLE, "ffn": WHOLE}),
    "parameters": Shape(dict, "a mapping", nullable=True,
                        required=("total_params", "embedding_params", "pcr_all", "pcr_emb", "poep"), keys={
        "total_params": WHOLE, "embedding_params": WHOLE, "pcr_all": NUMBER, "pcr_emb": NUMBER, "poep": NUMBER,
        "embedding_bytes": WHOLE, "baseline_embedding_bytes": WHOLE}),
    "efficiency": Shape(dict, "a mapping", nullable=True, keys={
        "train": TIMING, "infer": TIMING, "peak_memory_mb": Shape((int, float), "a finite number", nullable=True),
        "device": TEXT, "load": LOAD}),
    "metrics": Shape(dict, "a mapping of metric names to numbers", values=METRIC),
    "scores": Shape(list, "a list of metric names", nullable=True, values=TEXT),
    "checkpoint": Shape(dict, "a mapping", nullable=True, keys={
        "monitor": Shape(str, "text", nullable=True), "best": Shape(str, "text", nullable=True),
        "best_score": Shape((int, float), "a number", nullable=True, finite=False)}),
})


def find_run_dirs(paths: list[str]) -> list[Path]:
    """Run folders among ``paths``: each path is a run folder, or a folder holding run folders at any depth."""
    found: list[Path] = []
    for name in paths:
        path = Path(name)
        if not path.is_dir():
            raise MissingFileError(f"{name}: no such run folder")
        if (path / RESULTS_FILE).is_file():
            found.append(path)
            continue
        nested = sorted(p.parent for p in path.rglob(RESULTS_FILE))
        if not nested:
            load_results(path)  # raises the "no results.json" explanation
        found.extend(nested)
    unique: dict[Path, Path] = {}
    for path in found:
        unique.setdefault(path.resolve(), path)
    return list(unique.values())


def status_of(results: dict) -> str:
    """A run's status (one of :data:`STATUSES`)."""
    return results.get("status", COMPLETE)


def describe_backbone(backbone: dict | None) -> str:
    if not backbone:
        return "unknown backbone"
    return f"{backbone['arch']} {backbone['layers']}x{backbone['hidden']} ({backbone['heads']} heads, FFN {backbone['ffn']})"


def check_same_backbone(run: dict, baseline: dict) -> None:
    """Refuse a baseline whose encoder differs: PCR and speed-up compare embeddings on one backbone."""
    mine, theirs = run.get("backbone"), baseline.get("backbone")
    if mine and theirs and mine != theirs:
        raise ConfigError(
            f"baseline {baseline.get('run_dir', '?')} has backbone {describe_backbone(theirs)} but "
            f"{run.get('run_dir', 'this run')} has {describe_backbone(mine)}: compare against a baseline run "
            f"with the same backbone (the dense strategy on it, as the papers do)"
        )
