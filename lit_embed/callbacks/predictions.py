"""``lit-embed predict``'s output: one row per text, written into the run folder when prediction ends.

The model turns each batch into records (:meth:`prediction_records`: a fine-tuned classifier's label and
probabilities, or a regression's score; a masked LM's top-k fills for ``<mask>``); this callback puts
them in the order of the input, adds the texts (and a gold label where the input has one), and writes
``predictions.csv`` or ``predictions.jsonl`` atomically: a reader sees the whole file or none.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Literal

import pytorch_lightning as pl

from lit_embed.errors import ConfigError
from lit_embed.files import write_atomic
from lit_embed.interfaces import PredictData, require
from lit_embed.runs import run_folder


class PredictionWriter(pl.Callback):
    """Collects what ``predict_step`` returns (lists of records with the row ``index``) and writes them.

    Args:
        format: ``csv`` (a column per field; probabilities as ``p_<label>``) or ``jsonl`` (one object a line);
            unset, ``jsonl`` where the records nest lists (a MaskedLM's fills), else ``csv``.
        filename: the file's name in the run folder, without its suffix.
    """

    def __init__(self, format: Literal["csv", "jsonl"] | None = None, filename: str = "predictions") -> None:
        if format not in (None, "csv", "jsonl"):
            raise ConfigError(f"PredictionWriter format={format!r} is not known: use csv or jsonl")
        self.format = format
        self.filename = filename
        self.records: list[dict] = []

    def on_predict_start(self, trainer, pl_module) -> None:
        if trainer.world_size > 1:
            raise ConfigError(f"lit-embed predict runs on one device (this run has {trainer.world_size}): "
                              f"pass --trainer.devices 1")
        require(trainer.datamodule, PredictData, "the data of lit-embed predict")
        self.records = []

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.records.extend(outputs)

    def on_predict_end(self, trainer, pl_module) -> None:
        data = trainer.datamodule
        shown = {"text"} if data.task is None else {*data.task.text_columns, data.task.label_column}
        out = []
        for record in sorted(self.records, key=lambda record: record["index"]):
            record = data.describe_prediction(record)
            index = record.pop("index")
            given = {} if data.predict_rows is None else {k: v for k, v in data.predict_rows[index].items() if k in shown}
            out.append({**given, **record})
        nested = any(isinstance(value, (list, dict)) for row in out for value in row.values())
        format = self.format or ("jsonl" if nested else "csv")
        path = run_folder(trainer) / f"{self.filename}.{format}"
        write_atomic(path, _jsonl(out) if format == "jsonl" else _csv(out))
        self.path = path
        print(f"predictions of {len(out)} text(s): {path}")


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


__all__ = ["PredictionWriter"]
