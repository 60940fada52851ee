"""Evaluation metrics from torchmetrics, exact under DDP.

A ``DistributedSampler`` pads the evaluation sets with repeated examples so that every rank gets
the same number of batches; averaging per rank would count those twice. :class:`TaskEvaluation`
(fine-tuning) therefore keeps every prediction with its evaluation set and row index, gathers them
from all ranks (torchmetrics' ``cat`` states), drops repeated ``(set, index)`` pairs, and only then
computes the metrics, so the figures equal a single-process evaluation of each set exactly once.
:class:`BlockEvaluation` does the same for the pre-training objectives' token-level figures.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.functional import matthews_corrcoef, pearson_corrcoef, spearman_corrcoef
from torchmetrics.functional.classification import binary_f1_score, multiclass_accuracy
from torchmetrics.utilities import dim_zero_cat

from lit_embed.errors import ConfigError
from lit_embed.measures.metric_names import check_metrics, metric_function

if TYPE_CHECKING:
    from lit_embed.data.tasks import Selection

#: :meth:`TaskEvaluation.compute`'s key of the figures over all evaluation sets as one (MNLI matched + mismatched).
POOLED = -1


def task_metric(name: str, preds: Tensor, target: Tensor, num_classes: int | None) -> Tensor:
    """One metric of a task on its predictions: class probabilities ``(N, C)`` (or class ids ``(N,)``), or
    scores ``(N,)`` for regression (``num_classes`` ``None``)."""
    ids = preds.argmax(-1) if num_classes is not None and preds.dim() == 2 else preds
    if name == "accuracy":
        return multiclass_accuracy(ids, target, num_classes=num_classes, average="micro")
    if name == "f1":  # of the positive class (MRPC "equivalent", QQP "duplicate"), as GLUE reports
        return binary_f1_score(ids, target)
    if name == "matthews":
        return matthews_corrcoef(ids, target, task="multiclass", num_classes=num_classes)
    if name == "pearson":
        return pearson_corrcoef(preds.double(), target.double()).float()
    if name == "spearman":
        return spearman_corrcoef(preds.double(), target.double()).float()
    function, kwargs = metric_function(name)
    parameters = inspect.signature(function).parameters
    if num_classes is not None:
        if function.__name__.startswith("binary_"):
            preds = preds[:, 1] if preds.dim() == 2 else preds
        else:
            kwargs |= {"task": "multiclass"} if "task" in parameters else {}
            kwargs |= {"num_classes": num_classes} if "num_classes" in parameters else {}
    value = function(preds, target, **kwargs)
    if not isinstance(value, Tensor) or value.numel() != 1:
        raise ConfigError(f"metric {name!r} gives {value!r}, not one number: pick another metric or average")
    return value.float().reshape(())


class TaskEvaluation(Metric):
    """Predictions of one stage over all its evaluation sets, deduplicated by ``(set, index)``.

    Args:
        metrics: names from :data:`~lit_embed.measures.metric_names.METRICS`, or of torchmetrics functions (:func:`task_metric`).
        num_classes: classes of a classification task; ``None`` for regression.
    """

    full_state_update = False

    def __init__(self, metrics: tuple[str, ...], num_classes: int | None) -> None:
        super().__init__()
        check_metrics(tuple(metrics), num_classes, "the task")
        self.metric_names = tuple(metrics)
        self.num_classes = num_classes
        for name in ("set_id", "index", "preds", "target", "loss"):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, set_id: int, index: Tensor, preds: Tensor, target: Tensor, loss: Tensor) -> None:
        """``preds``: class probabilities ``(B, C)`` (or class ids), or scores for regression; ``loss`` holds one
        value per example (not reduced), so the set's mean loss is exact too."""
        self.set_id.append(torch.full_like(index, set_id))
        self.index.append(index)
        self.preds.append(preds.detach())
        self.target.append(target.detach())
        self.loss.append(loss.detach().float())

    def compute(self) -> dict[int, dict[str, Tensor]]:
        """``{set_id: {metric: value, "loss": mean loss, "count": examples}}`` over unique examples; where there are
        several sets, :data:`POOLED` holds the same over all of them taken as one set."""
        if len(self.index) == 0:  # a list before the sync across ranks, a tensor after it
            return {}
        set_id, index = dim_zero_cat(self.set_id), dim_zero_cat(self.index)
        keep = first_occurrences(set_id * (int(index.max()) + 1) + index)
        set_id, preds, target, loss = set_id[keep], dim_zero_cat(self.preds)[keep], dim_zero_cat(self.target)[keep], dim_zero_cat(self.loss)[keep]
        sets = sorted(set(set_id.tolist()))
        groups = [(sid, set_id == sid) for sid in sets] + ([(POOLED, torch.ones_like(set_id, dtype=torch.bool))]
                                                           if len(sets) > 1 else [])
        results = {}
        for sid, mine in groups:
            values = {m: task_metric(m, preds[mine], target[mine], self.num_classes) for m in self.metric_names}
            values["loss"] = loss[mine].mean()
            values["count"] = mine.sum()
            results[sid] = values
        return results


def selection_score(results: dict[int, dict[str, Tensor]], selection: Selection, averaged: bool = False) -> Tensor:
    """The figure that selects checkpoints (``val/score``) from :meth:`TaskEvaluation.compute`'s ``results``:
    ``selection``'s metric over all sets pooled where it says so (and there are several), else its mean over the
    sets where they are ``averaged`` (XNLI's languages), else on the first set."""
    if selection.pooled and POOLED in results:
        return results[POOLED][selection.metric]
    sets = [values for key, values in sorted(results.items()) if key != POOLED]
    if averaged:
        return torch.stack([values[selection.metric] for values in sets]).mean()
    return sets[0][selection.metric]


def first_occurrences(keys: Tensor) -> Tensor:
    """Positions of the first occurrence of each distinct key (sorted by key)."""
    unique, inverse = torch.unique(keys, return_inverse=True)
    positions = torch.arange(len(keys), device=keys.device)
    first = torch.full((len(unique),), len(keys), dtype=positions.dtype, device=keys.device)
    return first.scatter_reduce(0, inverse, positions, reduce="amin")


class BlockEvaluation(Metric):
    """Token-level means of a pre-training objective over the evaluation blocks, each block once.

    Every update adds, per block (by its row ``index``), the sums of per-token values over the
    block's labelled tokens and their count; :meth:`compute` gathers all ranks, keeps each block
    once and divides the totals by the token count: the loss, accuracy and rates of one pass over
    the evaluation set, weighted by tokens, on any number of devices.

    Args:
        names: the per-token values, e.g. ``("loss", "accuracy")``.
    """

    full_state_update = False

    def __init__(self, names: tuple[str, ...]) -> None:
        super().__init__()
        self.names = tuple(names)
        self.add_state("index", default=[], dist_reduce_fx="cat")
        self.add_state("sums", default=[], dist_reduce_fx="cat")

    def update(self, index: Tensor, token_rows: Tensor, values: dict[str, Tensor]) -> None:
        """``index``: ``(B,)`` block rows; ``token_rows``: ``(M,)`` the batch row of each labelled token;
        ``values``: ``(M,)`` per-token values for every name."""
        columns = [values[name].detach().double() for name in self.names]
        per_token = torch.stack([*columns, torch.ones_like(columns[0])], dim=1)
        sums = torch.zeros(len(index), len(self.names) + 1, dtype=torch.float64, device=per_token.device)
        self.index.append(index)
        self.sums.append(sums.index_add_(0, token_rows, per_token))

    def compute(self) -> dict[str, Tensor]:
        """``{name: mean}`` plus ``tokens`` and ``blocks`` (counted once each); empty before any update."""
        if len(self.index) == 0:  # a list before the sync across ranks, a tensor after it
            return {}
        index = dim_zero_cat(self.index)
        totals = dim_zero_cat(self.sums)[first_occurrences(index)].sum(0)
        tokens = totals[-1]
        results = {name: (totals[i] / tokens.clamp_min(1)).float() for i, name in enumerate(self.names)}
        results["tokens"] = tokens
        results["blocks"] = torch.tensor(float(len(torch.unique(index))), device=tokens.device)
        return results
