"""``lit-embed predict``'s output: one row per text, written into the predictions folder when prediction ends.

The model turns each batch into records (:meth:`prediction_records`: a fine-tuned classifier's label and
probabilities, or a regression's score; a masked LM's top-k fills for ``<mask>``); this callback gathers them from
every rank, puts them in the order of the input, adds the texts (and a gold label where the input has one), and rank 0
writes ``predictions.csv`` or ``predictions.jsonl`` atomically: a reader sees the whole file or none.

The folder is ``predict --output``'s, else :func:`predictions_folder`'s beside the checkpoint: never a folder a run
owns, and never one that exists (the CLI claims it, numbered, before the run).
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from pathlib import Path
from typing import Literal

import pytorch_lightning as pl
import torch.distributed

from lit_embed.checkpoints.recorded import written_by_lit_embed
from lit_embed.errors import ConfigError
from lit_embed.interfaces import PredictData, require
from lit_embed.runs.folders import CHECKPOINTS
from lit_embed.runs.logger import run_folder
from lit_embed.storage.files import write_atomic


class PredictionWriter(pl.Callback):
    """Collects what ``predict_step`` returns (lists of records with the row ``index``) and writes them.

    Args:
        format: ``csv`` (a column per field; probabilities as ``p_<label>``) or ``jsonl`` (one object a line);
            unset, ``jsonl`` where the records nest lists (a MaskedLM's fills), else ``csv``.
        filename: the file's name in the predictions folder, without its suffix.
    """

    def __init__(self, format: Literal["csv", "jsonl"] | None = None, filename: str = "predictions") -> None:
        if format not in (None, "csv", "jsonl"):
            raise ConfigError(f"PredictionWriter format={format!r} is not known: use csv or jsonl")
        self.format = format
        self.filename = filename
        self.records: list[dict] = []

    def on_predict_start(self, trainer, pl_module) -> None:
        require(trainer.datamodule, PredictData, "the data of lit-embed predict")
        self.records = []

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.records.extend(outputs)

    def on_predict_end(self, trainer, pl_module) -> None:
        records = self.records
        if trainer.world_size > 1:  # each rank predicted its share; a distributed sampler repeats rows to even them out
            shares: list[list[dict]] = [[] for _ in range(trainer.world_size)]
            torch.distributed.all_gather_object(shares, records)
            records = list({record["index"]: record for share in shares for record in share}.values())
        if not trainer.is_global_zero:
            return
        data = trainer.datamodule
        shown = {"text"} if data.task is None else {*data.task.text_columns, data.task.label_column}
        out = []
        for record in sorted(records, key=lambda record: record["index"]):
            record = data.describe_prediction(record)
            index = record.pop("index")
            given = {} if data.predict_rows is None else {k: v for k, v in data.predict_rows[index].items() if k in shown}
            out.append({**given, **record})
        nested = any(isinstance(value, (list, dict)) for row in out for value in row.values())
        format = self.format or ("jsonl" if nested else "csv")
        path = run_folder(trainer) / f"{self.filename}.{format}"
        write_atomic(path, _jsonl(out) if format == "jsonl" else _csv(out))
        self.path = path
        print(f"lit-embed: predict: predictions of {len(out)} text(s) in {path}", file=sys.stderr, flush=True)


def predictions_folder(checkpoint: str | None, predict_input: str | list | None, root: str) -> Path:
    """Where ``predict`` writes without ``--output``: beside what owns the checkpoint, named after the input.

    A run's checkpoint (``RUN/checkpoints/x.ckpt``) is owned by its run folder, a ``compress`` output's by that folder:
    the predictions go beside it (``runs/own/version_0-predictions-new_texts``), never into it; any other checkpoint
    file gets them beside itself (``models/model-predictions-new_texts``). Without a checkpoint (an untrained model),
    under the config's ``default_root_dir``. The input's name: a file's stem, ``texts`` for a list, else the split.
    """
    if isinstance(predict_input, list):
        name = "texts"
    else:
        name = Path(str(predict_input)).stem if predict_input is not None else "test"
    name = re.sub(r"[^\w.-]+", "_", name)
    if checkpoint is None:
        return Path(root) / f"predictions-{name}"
    path = Path(checkpoint).absolute()
    if path.parent.name == CHECKPOINTS:
        owner = path.parent.parent
    elif written_by_lit_embed(path.parent / "config.yaml"):
        owner = path.parent
    else:
        owner = path.with_suffix("")
    return owner.parent / f"{owner.name}-predictions-{name}"


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def _csv(rows: list[dict]) -> str:
    names = list(dict.fromkeys(k for row in rows for k in row))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else v for k, v in row.items()})
    return out.getvalue()


__all__ = ["PredictionWriter", "predictions_folder"]
