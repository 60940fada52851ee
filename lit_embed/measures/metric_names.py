"""Metric names: which exist, which fit a task, which select checkpoints.

A task names its metrics (:mod:`lit_embed.data.tasks`): the papers' five (:data:`METRICS`) or any function of
``torchmetrics.functional``, an average after a multiclass one (``f1_score_macro``). Checking a name needs nothing
but the name, so the task table checks its rows here, the data asks which metrics need two target values, and
:mod:`lit_embed.models.metrics` computes them. torchmetrics is imported only where a name is looked up in it: the
import takes seconds (``python -X importtime``: 22.8 s cumulative for ``torchmetrics.functional`` at load 7.5, 0.2 s
for the task table without it), and the task table is read by every command, the light ones included.
"""

from __future__ import annotations

import difflib
import inspect

from lit_embed.errors import ConfigError

#: The task table's metrics (GLUE's and JGLUE's); any function of ``torchmetrics.functional`` may be named too.
METRICS = ("accuracy", "f1", "matthews", "pearson", "spearman")
_REGRESSION_METRICS = ("pearson", "spearman")
#: A multiclass metric's average, named after it (``f1_score_macro``); torchmetrics' default otherwise.
AVERAGES = ("macro", "weighted", "micro")
#: Metrics of a correlation, agreement or ranking, undefined on targets of one value (torchmetrics' names end so).
NEED_TWO_VALUES = ("matthews", "pearson", "spearman", "corrcoef", "cohen_kappa", "auroc", "average_precision", "r2_score",
                   "explained_variance")


def needs_two_values(name: str) -> bool:
    """Whether metric ``name`` is undefined on an evaluation set whose targets all have one value (:data:`NEED_TWO_VALUES`:
    ``matthews``, ``auroc_macro``, ``binary_auroc``...)."""
    base, _, average = name.rpartition("_")
    return (base if average in AVERAGES else name).endswith(NEED_TWO_VALUES)


def check_metrics(names: tuple[str, ...], num_classes: int | None, owner: str) -> None:
    """Refuse, naming the fix, metrics that do not exist, that do not fit the task (classification or regression,
    the number of labels), or a first metric that cannot select checkpoints (it must be higher-is-better)."""
    if not names:
        raise ConfigError(f"{owner}: give at least one metric (e.g. accuracy, or spearman for regression)")
    for name in names:
        regression = _is_regression(name)
        if regression != (num_classes is None):
            kind = "a regression" if num_classes is None else "a classification"
            raise ConfigError(f"{owner}: metric {name!r} does not fit {kind} task: use "
                              f"{'spearman, pearson, r2_score' if num_classes is None else 'accuracy, f1_score_macro'}...")
        if name == "f1" and num_classes != 2:
            raise ConfigError(f"{owner}: metric 'f1' is the second label's F1 of a two-label task; with {num_classes} "
                              f"labels use f1_score_macro (or f1_score_weighted)")
    if not higher_is_better(names[0]):
        raise ConfigError(f"{owner}: the first metric selects checkpoints (val/score, the higher the better), and lower "
                          f"{names[0]!r} is better: list a higher-is-better metric first (e.g. spearman, r2_score)")


def higher_is_better(name: str) -> bool:
    """Whether a larger value of metric ``name`` is better (torchmetrics' ``higher_is_better`` of its class)."""
    if name in METRICS:
        return True
    function, _ = metric_function(name)
    import torchmetrics
    from torchmetrics import Metric

    classes = {k.lower(): v for k, v in vars(torchmetrics).items() if isinstance(v, type) and issubclass(v, Metric)}
    found = classes.get(function.__name__.replace("_", ""))
    return getattr(found, "higher_is_better", True) is not False


def _is_regression(name: str) -> bool:
    if name in METRICS:
        return name in _REGRESSION_METRICS
    function, _ = metric_function(name)
    return ".regression." in function.__module__


def metric_function(name: str):
    """``torchmetrics.functional.<name>`` (an average after it: ``f1_score_macro``) and its keyword arguments."""
    import torchmetrics.functional as functional

    base, _, average = name.rpartition("_")
    kwargs = {}
    if average in AVERAGES and callable(getattr(functional, base, None)):
        name, kwargs = base, {"average": average}
    function = getattr(functional, name, None) if not name.startswith("_") else None
    if not callable(function) or not hasattr(function, "__module__") or not function.__module__.startswith("torchmetrics"):
        near = difflib.get_close_matches(name, [n for n in dir(functional) if not n.startswith("_")], n=3)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise ConfigError(f"metric {name!r} is not known{hint}: use one of {METRICS} or a function of "
                          f"torchmetrics.functional (f1_score_macro, auroc, cohen_kappa, r2_score...)")
    if kwargs and "average" not in inspect.signature(function).parameters:
        raise ConfigError(f"metric {base!r} takes no average: name it {base!r}")
    return function, kwargs
