"""Task data written as the hub lays it out, for the data modules to read offline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lit_embed.data.tasks import Task

WORDS = ["the", "river", "city", "quiet", "bridge", "market", "owl", "runs", "green", "late"]
FORMATS = ["parquet", "tsv", "jsonl", "csv"]


def label_values(task: Task, count: int, as_names: bool) -> list:
    if task.regression:
        return [round(5.0 * i / max(1, count - 1), 2) for i in range(count)]
    names = task.source_labels or task.labels
    return [names[i % len(names)] if as_names else i % len(names) for i in range(count)]


def write_split(folder: Path, task: Task, split: str, fmt: str, count: int = 12, seed: int = 0) -> Path:
    """A split of ``task`` as the hub lays it out (``<split>-00000-of-00001.parquet``) or as a plain file."""
    rng = np.random.default_rng(seed)
    rows = {c: [" ".join(rng.choice(WORDS, rng.integers(3, 9))) for _ in range(count)] for c in task.text_columns}
    rows[task.label_column] = label_values(task, count, as_names=fmt == "jsonl")
    rows["idx"] = list(range(count))
    folder.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = folder / f"{split}-00000-of-00001.parquet"
        pq.write_table(pa.table(rows), path)
    elif fmt == "jsonl":
        path = folder / f"{split}.jsonl"
        path.write_text("".join(json.dumps(dict(zip(rows, values))) + "\n" for values in zip(*rows.values())))
    else:
        sep = "\t" if fmt == "tsv" else ","
        path = folder / f"{split}.{fmt}"
        lines = [sep.join(rows)] + [sep.join(str(v) for v in values) for values in zip(*rows.values())]
        path.write_text("\n".join(lines) + "\n")
    return path


def write_task(root: Path, task: Task, fmt: str) -> Path:
    """Every split the task reads, under ``root/<config>/`` (the hub's layout)."""
    splits = {"train", *task.validation.values(), *(task.test or {}).values(), *(task.heldout_test or {}).values()}
    for number, split in enumerate(sorted(splits)):
        write_split(root / (task.config or ""), task, split, fmt, seed=number)
    return root
