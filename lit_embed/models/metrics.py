"""Evaluation metrics from torchmetrics, exact under DDP.

A ``DistributedSampler`` pads the evaluation sets with repeated examples so that every rank gets
the same number of batches; averaging per rank would count those twice. :class:`TaskEvaluation`
(fine-tuning) therefore keeps every prediction with its evaluation set and row index, gathers them
from all ranks (torchmetrics' ``cat`` states), drops repeated ``(set, index)`` pairs, and only then
computes the metrics, so the figures equal a single-process evaluation of each set exactly once.
:class:`BlockEvaluation` does the same for the pre-training objectives' token-level figures.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.functional import matthews_corrcoef, pearson_corrcoef, spearman_corrcoef
from torchmetrics.functional.classification import binary_f1_score, multiclass_accuracy
from torchmetrics.utilities import dim_zero_cat

from lit_embed.errors import ConfigError

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
    raise ConfigError(f"metric {name!r} is not known: use one of {METRICS}")


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
            raise ConfigError(f"metric(s) {unknown} are not known: use some of {METRICS}")
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
        if len(self.index) == 0:  # a list before the sync across ranks, a tensor after it
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
