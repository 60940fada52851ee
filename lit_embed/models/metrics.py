"""Task metrics from torchmetrics, exact under DDP.

A ``DistributedSampler`` pads the evaluation sets with repeated examples so that every rank gets
the same number of batches; averaging per rank would count those twice. :class:`TaskEvaluation`
therefore keeps every prediction with its evaluation set and row index, gathers them from all ranks
(torchmetrics' ``cat`` states), drops repeated ``(set, index)`` pairs, and only then computes the
metrics, so the figures equal a single-process evaluation of each set exactly once.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.functional import matthews_corrcoef, pearson_corrcoef, spearman_corrcoef
from torchmetrics.functional.classification import binary_f1_score, multiclass_accuracy
from torchmetrics.utilities import dim_zero_cat

METRICS = ("accuracy", "f1", "matthews", "pearson", "spearman")


def task_metric(name: str, preds: Tensor, target: Tensor, num_classes: int | None) -> Tensor:
    """One metric of the task table on predicted class ids (or scores, for regression)."""
    if name == "accuracy":
        return multiclass_accuracy(preds, target, num_classes=num_classes, average="micro")
    if name == "f1":  # of the positive class (MRPC "equivalent", QQP "duplicate"), as GLUE reports
        return binary_f1_score(preds, target)
    if name == "matthews":
        return matthews_corrcoef(preds, target, task="multiclass", num_classes=num_classes)
    if name == "pearson":
        return pearson_corrcoef(preds.double(), target.double()).float()
    if name == "spearman":
        return spearman_corrcoef(preds.double(), target.double()).float()
    raise ValueError(f"metric {name!r} is not known: use one of {METRICS}")


class TaskEvaluation(Metric):
    """Predictions of one stage over all its evaluation sets, deduplicated by ``(set, index)``.

    Args:
        metrics: names from :data:`METRICS`.
        num_classes: classes of a classification task; ``None`` for regression.
    """

    full_state_update = False

    def __init__(self, metrics: tuple[str, ...], num_classes: int | None) -> None:
        super().__init__()
        unknown = [m for m in metrics if m not in METRICS]
        if unknown:
            raise ValueError(f"metric(s) {unknown} are not known: use some of {METRICS}")
        self.metric_names = tuple(metrics)
        self.num_classes = num_classes
        for name in ("set_id", "index", "preds", "target", "loss"):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, set_id: int, index: Tensor, preds: Tensor, target: Tensor, loss: Tensor) -> None:
        """``loss`` holds one value per example (not reduced), so the set's mean loss is exact too."""
        self.set_id.append(torch.full_like(index, set_id))
        self.index.append(index)
        self.preds.append(preds.detach())
        self.target.append(target.detach())
        self.loss.append(loss.detach().float())

    def compute(self) -> dict[int, dict[str, Tensor]]:
        """``{set_id: {metric: value, "loss": mean loss, "count": examples}}`` over unique examples."""
        if not self.index:
            return {}
        set_id, index = dim_zero_cat(self.set_id), dim_zero_cat(self.index)
        keep = first_occurrences(set_id * (int(index.max()) + 1) + index)
        set_id, preds, target, loss = set_id[keep], dim_zero_cat(self.preds)[keep], dim_zero_cat(self.target)[keep], dim_zero_cat(self.loss)[keep]
        results = {}
        for sid in sorted(set(set_id.tolist())):
            mine = set_id == sid
            values = {m: task_metric(m, preds[mine], target[mine], self.num_classes) for m in self.metric_names}
            values["loss"] = loss[mine].mean()
            values["count"] = mine.sum()
            results[sid] = values
        return results


def first_occurrences(keys: Tensor) -> Tensor:
    """Positions of the first occurrence of each distinct key (sorted by key)."""
    unique, inverse = torch.unique(keys, return_inverse=True)
    positions = torch.arange(len(keys), device=keys.device)
    first = torch.full((len(unique),), len(keys), dtype=positions.dtype, device=keys.device)
    return first.scatter_reduce(0, inverse, positions, reduce="amin")
