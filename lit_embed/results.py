"""Run results: one ``results.json`` per run folder, written atomically, read back by ``lit-embed report``.

The file holds what a table row needs without the checkpoint: the config, seed, task and label, the
library versions, the final metrics, the parameter figures and the timings (see
:class:`lit_embed.callbacks.ResultsWriter`, which writes it).
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Collection
from pathlib import Path

from lit_embed.errors import ConfigError, MissingFileError

RESULTS_FILE = "results.json"
#: Bumped when the layout of ``results.json`` changes incompatibly.
RESULTS_FORMAT = 1
#: What every ``results.json`` holds (``status``, added later, defaults to ``complete``).
REQUIRED_KEYS = ("label",)
#: A run's ``status``, the one list of them: ``complete`` (every step the command asked for finished: fit, then the
#: test it runs on task data), ``interrupted`` (a signal stopped it; ``--ckpt_path last`` resumes it), ``untested`` (its
#: fit finished and the test it asked for has not: a kill in between leaves this), ``diverged`` (stopped on a
#: non-finite loss or non-finite weights: its checkpoints are no model). Only ``complete`` runs are reported.
STATUSES = ("complete", "interrupted", "untested", "diverged")
COMPLETE = "complete"
DIVERGED = "diverged"
#: The last component of a metric name that is a score (higher is better): PRR is defined for these.
SCORE_METRICS = ("accuracy", "f1", "matthews", "pearson", "spearman", "exact_match")
#: Stages whose metrics are evaluations (PRR is computed for these, not for training metrics).
EVAL_STAGES = ("val", "test")


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


def is_score(name: str, scores: Collection[str] = ()) -> bool:
    """Whether metric ``name`` (``{stage}/...{metric}``) is an evaluation score that PRR applies to: one of
    :data:`SCORE_METRICS`, or of ``scores``, the higher-is-better metrics a run's task names (results.json's
    ``scores``: a config's own task may name any torchmetrics function)."""
    parts = name.split("/")
    return len(parts) >= 2 and parts[0] in EVAL_STAGES and (parts[-1] in SCORE_METRICS or parts[-1] in scores)


def load_results(run_dir: str | os.PathLike) -> dict:
    """The results of one run folder, with ``run_dir`` set; a clear error when there are none."""
    path = Path(run_dir) / RESULTS_FILE
    if not path.is_file():
        raise MissingFileError(
            f"{run_dir}: no {RESULTS_FILE}. The run did not finish, or ran without the "
            f"lit_embed.callbacks.ResultsWriter callback (the shipped trainer configs enable it): "
            f"rerun it, or leave the folder out"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is not valid JSON ({error}): rerun the run or delete the file") from error
    if not isinstance(data, dict) or data.get("format") != RESULTS_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ConfigError(f"{path} has format {found!r}, expected {RESULTS_FORMAT}: it was not written by this lit-embed")
    missing = [key for key in REQUIRED_KEYS if key not in data]
    if missing:
        raise ConfigError(f"{path} lacks {', '.join(missing)}: it was not written by ResultsWriter; rerun the run or leave it out")
    data["run_dir"] = str(run_dir)
    return data


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
