"""Fine-tuning data: a task of the table (GLUE, JGLUE, XNLI, the demo task, or one a config defines) -> the
strategy's codes -> batches; and the texts a fine-tuned model predicts on.

Texts become codes only through the model's strategy (``text_encoder()``: ``encode`` and
``special_code``), and batches are padded by :class:`~lit_embed.data.collate.PadCollator`, so any
strategy (vocabulary ids, hash buckets, bit vectors) fine-tunes the same way.

Data comes from the hub (``nyu-mll/glue``, ``facebook/xnli``, JGLUE's parquet conversion, each at the
commit its task row pins) or from ``data_dir``, a folder in the hub's layout:
``[<config>/]<split>{.ext,-*.ext,/*.ext}`` with ``ext`` one of csv, tsv, jsonl, json (JSON lines), parquet,
e.g. ``glue/rte/train-00000-of-00001.parquet``, ``rte/validation.tsv``, ``xnli/de/test.jsonl``, JGLUE's own
``train-v1.3.json``/``valid-v1.3.json`` or its conversion's ``MARC-ja/jglue-train.parquet``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import datasets
import numpy as np
from torch.utils.data import DataLoader

from lit_embed._compat import dataset_fingerprint
from lit_embed.data.base import TextDataModule, check_batching
from lit_embed.data.loading import ResumableLoader
from lit_embed.data.sources import (
    SAMPLE_DIR,
    is_script_refusal,
    load_files,
    script_refusal,
    text_lines,
)
from lit_embed.data.tasks import (
    SPLITS,
    Paper,
    Sources,
    Task,
    TaskDefinition,
    TaskSources,
    get_task,
    task_sources,
    with_labels,
    xnli_languages,
    xnli_sources,
)
from lit_embed.embeddings.text import TextEncoder
from lit_embed.errors import ConfigError, HubError, MissingFileError
from lit_embed.hub import require_hub
from lit_embed.interfaces import TaskModel, provides
from lit_embed.measures.metric_names import needs_two_values
from lit_embed.progress import Stage

PIPELINE_VERSION = 1
DATA_SUFFIXES = (".parquet", ".csv", ".tsv", ".jsonl", ".json")
#: Other names the same split has in the benchmarks' own downloads (GLUE's dev.tsv, JGLUE's valid-v1.3.json,
#: MARC-ja's jglue-validation.parquet in JGLUE's parquet conversion).
SPLIT_ALIASES = {
    "train": ("in_domain_train", "jglue-train"),
    "validation": ("valid", "dev", "in_domain_valid", "jglue-validation"),
    "validation_matched": ("dev_matched",),
    "validation_mismatched": ("dev_mismatched",),
    "validation_out_of_domain": ("out_of_domain_valid",),
}


class TaskDataModule(TextDataModule):
    """One task of :data:`~lit_embed.data.tasks.TASKS` (GLUE, JGLUE or the demo task).

    Protocols:

    * ``standard``: train on ``train``, validate on the validation split(s); ``test`` scores the
      labelled test split where the task has one, else the validation split(s) (GLUE and JGLUE hide
      their test labels; the papers report validation figures).
    * ``split_train`` (the frequency-aware sparse-coding paper): ``train`` is split 90/10 with
      ``split_seed`` 42, the 10% validates, and the original validation split is the test set.

    Args:
        task: a task name of the table (``rte``, ``stsb``, ``jnli``, ``topics``...), or the definition of your
            own (:class:`~lit_embed.data.tasks.TaskDefinition`: files or a hub dataset, columns, labels, metrics).
        tokenizer: the tokenizer whose vocabulary the model uses; default the model's own (its
            HuggingFace ``pretrained`` encoder, or the tokenizer its pre-training checkpoint recorded).
        data_dir: a folder in the hub's layout; default the hub (the demo task: the shipped files).
        protocol: ``standard`` or ``split_train``.
        val_fraction: the ``split_train`` protocol's held-out share.
        split_seed: the ``split_train`` protocol's seed.
        max_length: codes per example, specials included (pairs are truncated longest-first).
        batch_size: training examples per batch on each device (with ``global_batch_size``, the most
            per device); ``eval_batch_size`` (default the same) for validation and test.
        global_batch_size: training examples per optimiser step over all devices; the per-device
            batch and the gradient accumulation follow from the number of devices.
        pretokenize: ``mecab`` splits Japanese text into words (fugashi + unidic-lite) before the
            tokenizer, for tokenizers that expect pre-split input.
        trust_remote_code: let the tokenizer run the code its hub repository ships (LINE's Japanese
            DistilBERT tokenizer runs MeCab that way; it needs ``pip install 'lit-embed[ja]'``).
        num_workers: DataLoader worker processes.
        paper: the paper whose protocol the run follows (``k-sub-embedding``, ``hashformers``,
            ``sparse-coding``; the configs under ``configs/protocol/`` set it): results.json records it,
            ``val/score`` selects checkpoints by that paper's metric and ``lit-embed report`` shows each task's
            metric as that paper's tables do (the task table's ``selection`` and ``shown_metric``).
        predict_input: what ``lit-embed predict`` predicts: a file (``.txt``: one text per line, a pair
            tab-separated; csv, tsv, jsonl or parquet with the task's text columns), texts (a list), or a split
            of the task (``test``, ``validation``, ``train``); default the task's test split.
    """

    #: Log ``{stage}/average/{metric}`` over the evaluation sets (XNLI's languages).
    average_eval_sets = False

    def __init__(
        self,
        task: str | TaskDefinition,
        tokenizer: str | None = None,
        data_dir: str | None = None,
        protocol: Literal["standard", "split_train"] = "standard",
        val_fraction: float = 0.1,
        split_seed: int = 42,
        max_length: int = 128,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        pretokenize: Literal["mecab"] | None = None,
        trust_remote_code: bool = False,
        num_workers: int = 0,
        global_batch_size: int | None = None,
        paper: Paper | None = None,
        predict_input: str | list[str] | None = None,
    ) -> None:
        super().__init__()
        check_batching(batch_size, num_workers, eval_batch_size=eval_batch_size, global_batch_size=global_batch_size)
        self.task: Task = labelled(get_task(task))
        if protocol not in ("standard", "split_train"):
            raise ConfigError(f"protocol={protocol!r} is not known: use 'standard' or 'split_train'")
        if not 0.0 < val_fraction < 1.0:
            raise ConfigError(f"val_fraction={val_fraction} must lie strictly between 0 and 1")
        if max_length < 3 + (len(self.task.text_columns) > 1):
            raise ConfigError(f"max_length={max_length} leaves no room for text between the special tokens")
        if pretokenize not in (None, "mecab"):
            raise ConfigError(f"pretokenize={pretokenize!r} is not known: use 'mecab' or leave it unset")
        self.save_hyperparameters()
        if self.task.definition is not None:
            self.hparams["task"] = self.task.definition  # plain data (with its labels), as checkpoints hold it
        self.tokenizer = tokenizer
        self.data_dir = Path(data_dir).expanduser() if data_dir else None
        if self.data_dir is not None and not self.data_dir.is_dir():
            raise MissingFileError(f"data_dir {data_dir!r} is not a folder: check the path")
        self.protocol = protocol
        self.paper = paper
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        self.max_length = max_length
        self.batch_size = self.train_batch_size = batch_size
        self.global_batch_size = global_batch_size
        self.eval_batch_size = batch_size if eval_batch_size is None else eval_batch_size
        self.pretokenize = pretokenize
        self.trust_remote_code = trust_remote_code
        self.num_workers = num_workers
        self.text_encoder: TextEncoder | None = None
        self.collate = None
        self.train_set = None
        self.eval_sets: dict[str, dict[str, datasets.Dataset]] = {}
        self.predict_input = predict_input
        self.predict_rows: datasets.Dataset | None = None
        self.predict_set = None
        self._splits: dict[str, datasets.Dataset] | None = None  # a config-defined task's held-out splits
        self._origins: dict[str, str] = {}  # rows' fingerprint -> where they were read (files, hub split), for errors

    # -- what the task reads ---------------------------------------------------------------------
    def train_sources(self) -> list[tuple[str | None, str]]:
        """The ``(config, split)`` pairs concatenated into the training data."""
        return task_sources(self.task, self.protocol).train

    def validation_sources(self) -> Sources:
        return task_sources(self.task, self.protocol).validation

    def test_sources(self) -> Sources:
        return task_sources(self.task, self.protocol).test

    def eval_set_names(self, stage: str) -> list[str]:
        """Names of the evaluation sets of ``stage`` (``val`` or ``test``) in dataloader order;
        ``""`` for a single unnamed set (metrics are then logged as ``{stage}/{metric}``)."""
        if stage == "val" and self.protocol == "split_train":
            return [""]
        return list((self.validation_sources() if stage == "val" else self.test_sources()).keys())

    def train_texts(self) -> Iterator[str]:
        """Every text of the training data as the model sees it (both sides of a pair, after any
        ``pretokenize``), for counting token frequencies (post-hoc compression). Needs no model."""
        rows = self._train_rows()
        split = _Pretokenizer(self.pretokenize)
        for batch in rows.select_columns(list(self.task.text_columns)).iter(batch_size=1000):
            for column in self.task.text_columns:
                yield from split([_text(t) for t in batch[column]])

    def test_examples(self) -> Iterator[list[str]]:
        """The texts of each example of the test sets (one per side of a pair, after any ``pretokenize``), for the
        sparse-coding paper's coverage of the test data by the common tokens (its Tables 5 and 6). Needs no model."""
        split = _Pretokenizer(self.pretokenize)
        for rows in self._load_all(self.test_sources()).values():
            for batch in rows.select_columns(list(self.task.text_columns)).iter(batch_size=1000):
                sides = [split([_text(t) for t in batch[column]]) for column in self.task.text_columns]
                yield from (list(texts) for texts in zip(*sides))

    # -- Lightning hooks -------------------------------------------------------------------------
    def prepare_data(self) -> None:
        # Once per node, before any rank's setup: download and encode what this run needs, so that
        # every rank's setup reads the datasets cache instead of running the same maps.
        self._build(self.trainer.state.fn.value if self.trainer is not None else None, self.text_encoder_for())

    def setup(self, stage: str | None = None) -> None:
        self._build(stage, self.text_encoder_for(shared=True))
        self.train_batch_size = self.per_device_batch_size(stage)

    def fit_texts(self) -> Iterator[str]:
        return self.train_texts()  # a model trained on the task (ProFormer): its LSH n-grams

    def fit_size(self) -> int | None:
        return len(self._train_rows()) * len(self.task.text_columns)  # each side of a pair is a text

    def _build(self, stage: str | None, encoder: TextEncoder) -> None:
        """Encode the sets ``stage`` uses (``fit``, ``validate``, ``test``; ``None``: all)."""
        model = self.model()
        if provides(model, TaskModel) and model.task.name != self.task.name:
            raise ConfigError(
                f"the model is built for task {model.task.name!r} but the data is {self.task.name!r}: set the same task "
                f"in model.init_args.task and data.init_args.task"
            )
        self.check_length(self.max_length)
        self.collate = model.collator(encoder)
        build = ExampleBuilder(encoder, self.task, self.max_length, model.pair_separators, self.pretokenize)
        needs_train = stage in (None, "fit", "validate")
        train_rows, heldout = self._train_rows(with_heldout=True) if needs_train else (None, None)
        if stage in (None, "fit"):
            self.train_set = self._encode(train_rows, build, "train")
            self._check_spread(self.train_set, train_rows, "train")
        if stage in (None, "fit", "validate"):
            rows = {"": heldout} if heldout is not None else self._load_all(self.validation_sources())
            self.eval_sets["val"] = {name: self._encode(r, build, f"validation {name}".strip(), index=True)
                                     for name, r in rows.items()}
            for name, r in rows.items():
                self._check_spread(self.eval_sets["val"][name], r, name or "validation")
        if stage in (None, "fit", "test"):  # fit: a test label outside the label set stops the run before it trains
            rows = self._load_all(self.test_sources())
            self.eval_sets["test"] = {name: self._encode(r, build, f"test {name}".strip(), index=True)
                                      for name, r in rows.items()}
            for name, r in rows.items():
                self._check_spread(self.eval_sets["test"][name], r, name or "test")
        if stage == "predict":
            self.predict_rows = self._predict_rows()
            self.predict_set = self._encode(self.predict_rows, build, "predict", index=True, labels=False)

    def train_dataloader(self) -> ResumableLoader:
        return self.resumable_loader(self.train_set, self.train_batch_size, self.collate)

    def val_dataloader(self) -> list[DataLoader]:
        return [self._loader(d, self.eval_batch_size) for d in self.eval_sets["val"].values()]

    def test_dataloader(self) -> list[DataLoader]:
        return [self._loader(d, self.eval_batch_size) for d in self.eval_sets["test"].values()]

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.predict_set, self.eval_batch_size)

    def _predict_rows(self) -> datasets.Dataset:
        """The rows ``predict_input`` names, with the task's text columns (and its labels where they have them)."""
        given, columns = self.predict_input, list(self.task.text_columns)
        if given is None or given in SPLITS:
            sources = self.test_sources() if given in (None, "test") else (
                self.validation_sources() if given == "validation" else {"": self.train_sources()[0]})
            name, (config, split) = next(iter(sources.items()))
            return self._load(config, split, name or split)
        if isinstance(given, list):
            texts = [[text] if isinstance(text, str) else list(text) for text in given]
        elif str(given).endswith(".txt"):
            texts = [line.split("\t") for line in text_lines(given)]
        else:
            rows = load_files([given], split="predict")
            missing = [c for c in columns if c not in rows.column_names]
            if missing:
                raise ConfigError(f"predict_input {given!r} has no column(s) {missing} (columns: {rows.column_names}): "
                                  f"task {self.task.name!r} reads {columns}")
            return rows
        wrong = [number for number, parts in enumerate(texts, 1) if len(parts) != len(columns)]
        if wrong:
            raise ConfigError(f"predict_input {given if isinstance(given, str) else 'texts'}: text {wrong[0]} has "
                              f"{len(texts[wrong[0] - 1])} part(s); task {self.task.name!r} reads {len(columns)} "
                              f"({', '.join(columns)}){': a tab between the two' if len(columns) == 2 else ''}")
        if not texts:
            raise ConfigError(f"predict_input {given!r} has no texts: give one text per line")
        return datasets.Dataset.from_dict({c: [parts[i] for parts in texts] for i, c in enumerate(columns)})

    # -- pipeline --------------------------------------------------------------------------------
    def _train_rows(self, with_heldout: bool = False):
        """The training rows under the protocol (and the held-out rows of ``split_train``)."""
        parts = [self._load(config, split, "train") for config, split in self.train_sources()]
        rows = datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]
        heldout = None
        if self.protocol == "split_train":
            count = math.ceil(self.val_fraction * len(rows))
            if not 1 <= count < len(rows):
                raise ConfigError(
                    f"{self.task.name}: val_fraction={self.val_fraction} of {len(rows)} training rows leaves "
                    f"nothing to train or validate on: add rows or change val_fraction"
                )
            parts = rows.train_test_split(test_size=self.val_fraction, seed=self.split_seed, shuffle=True)
            rows, heldout = parts["train"], parts["test"]
        return (rows, heldout) if with_heldout else rows

    def _load_all(self, sources: Sources) -> dict[str, datasets.Dataset]:
        return {name: self._load(config, split, name or split) for name, (config, split) in sources.items()}

    def _defined_split(self, split: str) -> datasets.Dataset:
        """A config-defined task's rows of ``split`` (its own name for it: ``train``, ``validation``, ``test``):
        read from its files or the hub, or held out of the training rows (``val_fraction`` each, seeded)."""
        task = self.task
        if split not in task.held_out and (split != "train" or not task.held_out):
            return _defined_rows(task, split, self.data_dir)  # only the split asked for: predicting needs no training file
        if self._splits is None:
            rows = {"train": _defined_rows(task, "train", self.data_dir)}
            for number, name in enumerate(task.held_out):
                train = rows["train"]
                count = math.ceil(self.val_fraction * len(train))
                if not 1 <= count < len(train):
                    raise ConfigError(
                        f"task {task.name!r}: holding out {name} rows (val_fraction={self.val_fraction}) of {len(train)} "
                        f"training rows leaves nothing to train or {name} on: add rows, or give a {name} file"
                    )
                parts = train.train_test_split(test_size=count, seed=self.split_seed + number, shuffle=True)
                rows["train"], rows[name] = parts["train"], parts["test"]
            self._splits = rows
        return self._splits[split]

    def _load(self, config: str | None, split: str, what: str) -> datasets.Dataset:
        where = self.data_dir or (SAMPLE_DIR / "topics" if self.task.benchmark == "sample" else None)
        if self.task.definition is not None:
            own = _own_split_name(self.task, split)
            rows = self._defined_split(own)
            origin = _defined_origin(self.task, own)
        elif where is not None:
            files = split_files(where, config, split)
            origin = f"{files[0].parent}/{split}*"
            try:
                rows = load_files([str(f) for f in files], split=split)
            except ValueError as error:  # datasets refuses files with a header and no rows
                if "corresponds to no data" not in str(error):
                    raise
                rows = datasets.Dataset.from_dict({})
        else:
            rows = load_from_hub(self.task, config, split)
            origin = f"{self.task.hub}@{self.task.revision} ({config}, {split})"
        if len(rows) == 0:
            raise ConfigError(f"{origin}: the {what} split of task {self.task.name!r} has no rows: give it data")
        missing = [c for c in self.task.columns if c not in rows.column_names]
        if missing:
            fix = "set text_columns and label_column to its columns" if self.task.definition is not None else \
                "give the task's columns"
            raise ConfigError(
                f"{origin}: no column(s) {missing} (columns: {rows.column_names}); task {self.task.name!r} "
                f"expects {list(self.task.columns)}: {fix}"
            )
        self._origins[dataset_fingerprint(rows)] = origin
        return rows

    def _encode(self, rows: datasets.Dataset, build: ExampleBuilder, name: str, index: bool = False, labels: bool = True):
        key = "|".join(
            [dataset_fingerprint(rows), build.fingerprint(), self.task.name, str(index), str(labels), str(PIPELINE_VERSION)]
        )
        try:
            with Stage(f"Encoding {self.task.name} {name}".rstrip()) as stage:  # the map's bar is off in a log
                mapped = rows.map(
                    build,
                    batched=True,
                    batch_size=1000,
                    with_indices=True,
                    fn_kwargs={"label_names": _label_names(rows, self.task), "keep_index": index, "keep_labels": labels},
                    remove_columns=rows.column_names,
                    new_fingerprint=hashlib.sha256(key.encode()).hexdigest()[:32],
                    desc=stage.name,
                )
                stage.count = len(mapped)
        except ConfigError as error:  # a row's label: say which data it is in (row numbers count from 0)
            origin = self._origins.get(dataset_fingerprint(rows))
            if origin is None:
                raise
            raise ConfigError(f"{origin}: {error}") from None
        return mapped.with_format("numpy")

    def _check_spread(self, encoded, rows: datasets.Dataset, split: str) -> None:
        """Refuse, before any training, labels that cannot train or be scored: a training split whose labels (or
        regression scores) all have one value, or an evaluation split with one where a task's metric needs two
        (a correlation, agreement or ranking: torchmetrics would fail on it, or give a number that means nothing)."""
        # the column through arrow: a numpy-formatted dataset's column is read row by row (50 ms for 900 rows)
        values = np.unique(encoded.with_format("arrow")["labels"].to_numpy())
        if len(values) != 1:
            return
        training = split == "train"
        needing = [m for m in self.task.metrics if needs_two_values(m)]
        if not training and not needing:
            return
        task = self.task
        origin = self._origins.get(dataset_fingerprint(rows)) or f"task {task.name!r}"
        value = values[0].item() if task.regression else task.labels[int(values[0])]
        kind = "score" if task.regression else "label"
        if training:
            why = ("a regression learns nothing from scores that do not vary" if task.regression
                   else "a classification needs two labels or more to learn")
            fix = f"give it rows of other {kind}s"
        else:
            why = f"metric {needing[0]!r} needs two {kind}s or more to score it"
            fix = (f"give it rows of other {kind}s, or only metrics that one {kind} defines "
                   f"({'mean_squared_error' if task.regression else 'accuracy'})")
        raise ConfigError(f"{origin}: every row of the {split} split has the {kind} {value!r} in column "
                          f"{task.label_column!r} ({len(encoded)} rows), and {why}: {fix}")

    def _loader(self, dataset, batch_size: int) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=False,
            collate_fn=self.collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )


class XNLIDataModule(TaskDataModule):
    """XNLI in the papers' two settings (Huang et al. 2019, followed by the k-sub-embedding paper).

    * ``cross_lingual``: fine-tune on the English training set, evaluate every language.
    * ``translate_train_all``: fine-tune on the (machine-translated) training sets of all
      languages together, evaluate every language.

    Metrics are logged per language (``test/de/accuracy``) and averaged (``test/average/accuracy``).

    The other arguments are :class:`TaskDataModule`'s.

    Args:
        mode: ``cross_lingual`` or ``translate_train_all``.
        train_languages: override the mode's training languages.
        val_languages: languages that validate (select checkpoints); default English for
            cross-lingual transfer (no target-language data is used) and all for translate-train-all.
        test_languages: languages tested (default all 15).
    """

    average_eval_sets = True

    def __init__(
        self,
        mode: Literal["cross_lingual", "translate_train_all"] = "cross_lingual",
        train_languages: list[str] | None = None,
        val_languages: list[str] | None = None,
        test_languages: list[str] | None = None,
        tokenizer: str | None = None,
        data_dir: str | None = None,
        protocol: Literal["standard", "split_train"] = "standard",
        val_fraction: float = 0.1,
        split_seed: int = 42,
        max_length: int = 128,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        global_batch_size: int | None = None,
        paper: Paper | None = None,
    ) -> None:
        super().__init__(
            "xnli", tokenizer=tokenizer, data_dir=data_dir, protocol=protocol, val_fraction=val_fraction,
            split_seed=split_seed, max_length=max_length, batch_size=batch_size,
            eval_batch_size=eval_batch_size, num_workers=num_workers, global_batch_size=global_batch_size, paper=paper,
        )
        self.mode = mode
        self.train_languages, self.val_languages, self.test_languages = xnli_languages(
            mode, train_languages, val_languages, test_languages)

    def _sources(self) -> TaskSources:
        return xnli_sources(self.protocol, self.train_languages, self.val_languages, self.test_languages)

    def train_sources(self) -> list[tuple[str | None, str]]:
        return self._sources().train

    def validation_sources(self) -> Sources:
        return self._sources().validation

    def test_sources(self) -> Sources:
        return self._sources().test


# -- where rows come from ----------------------------------------------------------------------------


def split_files(root: Path, config: str | None, split: str) -> list[Path]:
    """The files of ``split`` under ``root`` in the hub's layout (``[<config>/]<split>...``)."""
    folders = [root / name for name in dict.fromkeys([config, (config or "").lower()]) if name and (root / name).is_dir()]
    folders.append(root)
    for folder in folders:
        for name in (split, *SPLIT_ALIASES.get(split, ())):
            found = [p for p in (folder / name).glob("*") if p.suffix in DATA_SUFFIXES] if (folder / name).is_dir() else []
            found += [
                p for p in folder.iterdir()
                if p.is_file() and p.suffix in DATA_SUFFIXES and (p.stem == name or p.name.startswith(name + "-"))
            ]
            if found:
                return sorted(found)
    where = " or ".join(str(f) for f in folders)
    raise MissingFileError(
        f"no {split!r} files in {where}: expected {split}.{{parquet,csv,tsv,jsonl}}, {split}-*.parquet or "
        f"{split}/*.parquet (the hub's layout)"
    )


def load_from_hub(task: Task, config: str | None, split: str) -> datasets.Dataset:
    """The rows of ``split`` of ``task`` from the hub, at the commit its task row pins."""
    files = task.hub_files(config, split)
    if files is not None:
        how = (
            f"The hub's {task.hub} is a loading script that datasets 4+ refuses, so lit-embed reads its parquet "
            f"conversion ({files}). Offline? Download it once (hf download {task.hub} --repo-type dataset "
            f"--revision {task.revision} --include '{config}/*' --local-dir DIR) and pass data.init_args.data_dir DIR"
        )
        if task.benchmark == "jglue":
            how += (
                ", or download JGLUE itself (github.com/yahoojapan/JGLUE, e.g. datasets/jnli-v1.3/train-v1.3.json and "
                "valid-v1.3.json) and pass that folder"
            )
    else:
        how = (
            f"Offline? Save it once where the hub is reachable (load_dataset({task.hub!r}, {config!r}, "
            f"revision={task.revision!r})[split].to_parquet('DIR/{config + '/' if config else ''}{split}.parquet')) "
            f"and pass data.init_args.data_dir DIR"
        )
    require_hub()
    try:
        with Stage(f"Loading {task.name} {split} split") as stage:
            if files is not None:
                rows = datasets.load_dataset("parquet", data_files={split: files}, split=split)
            else:
                rows = datasets.load_dataset(task.hub, config, split=split, revision=task.revision)
            stage.count = len(rows) if isinstance(rows, datasets.Dataset) else None
        return rows
    except RuntimeError as error:
        if not is_script_refusal(error):
            raise
        raise script_refusal(f"{task.hub}@{task.revision}", how, error) from error
    except (ConnectionError, FileNotFoundError, OSError, ValueError) as error:
        raise HubError(f"could not load {task.name} {split} from the hub: {how}. Cause: {error}") from error


def _own_split_name(task: Task, split: str) -> str:
    """``train``, ``validation`` or ``test``: what a config-defined task calls the split its sources name ``split``."""
    names = {task.train: "train", task.validation.get("", "validation"): "validation", task.test.get("", "test"): "test"}
    return names.get(split, split)


def _defined_rows(task: Task, split: str, data_dir: Path | None = None) -> datasets.Dataset:
    """The rows a config-defined task gives for ``split`` (its files, or the hub split it names)."""
    if task.data_files is not None:
        try:
            return load_files(list(task.data_files[split]), split=split)
        except ValueError as error:  # datasets refuses files with a header and no rows
            if "corresponds to no data" not in str(error):
                raise
            return datasets.Dataset.from_dict({})
    hub_split = {"train": task.train, **{k: v[""] for k, v in (("validation", task.validation), ("test", task.test))}}[split]
    if data_dir is not None:
        return load_files([str(f) for f in split_files(data_dir, task.config, hub_split)], split=hub_split)
    return load_from_hub(task, task.config, hub_split)


def _defined_origin(task: Task, split: str) -> str:
    """Where a config-defined task's ``split`` comes from, for messages: its files, or the hub split."""
    if task.data_files is not None:
        if split in task.data_files:
            return ", ".join(task.data_files[split])
        return f"{', '.join(task.data_files['train'])} (its {split} rows, held out of training)"
    return f"{task.hub}@{task.revision} ({split})"


def labelled(task: Task) -> Task:
    """``task`` with its labels: a config-defined classification's read from its training rows (:func:`training_labels`)
    where its definition leaves them unset; the model and its data both ask, and the first reads them (the task table
    then holds the task labelled)."""
    return with_labels(task, training_labels(task)) if task.labels == () else task


def training_labels(task: Task) -> tuple[str, ...]:
    """A config-defined classification task's label names, read from its training rows in a stable order: a
    ClassLabel's own order, else sorted (numerically where every label is an integer)."""
    rows, origin = _defined_rows(task, "train"), _defined_origin(task, "train")
    if len(rows) == 0:
        raise ConfigError(f"{origin}: the train split of task {task.name!r} has no rows: give it data")
    if task.label_column not in rows.column_names:
        raise ConfigError(f"{origin}: task {task.name!r} finds no label column {task.label_column!r} "
                          f"(columns: {rows.column_names}): set label_column")
    feature = rows.features[task.label_column]
    if isinstance(feature, datasets.ClassLabel):
        return tuple(feature.names)
    values = {v.strip() if isinstance(v, str) else v for v in rows[task.label_column]} - {None, ""}
    if not values:
        raise ConfigError(f"{origin}: task {task.name!r} finds no labels in column {task.label_column!r}: fill them in")
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        return tuple(str(v) for v in sorted(values))
    if any(not isinstance(v, str) for v in values):
        raise ConfigError(f"task {task.name!r}: labels {sorted(map(str, values))[:6]} are neither all names nor all "
                          f"integers: give the label names (labels: [...]), or regression: true for scores")
    return tuple(sorted(values))


# -- rows -> examples ----------------------------------------------------------------------------------


def _text(value) -> str:
    return value if isinstance(value, str) else ""


def _label_names(rows: datasets.Dataset, task: Task) -> list[str] | None:
    """Names of the integer labels in ``rows``: the file's ClassLabel names, else the hub's order."""
    feature = rows.features.get(task.label_column)
    if isinstance(feature, datasets.ClassLabel):
        return list(feature.names)
    return list(task.source_labels or task.labels or []) or None


class _Pretokenizer:
    """Splits Japanese text into MeCab words (fugashi + unidic-lite), or leaves text as it is."""

    def __init__(self, kind: str | None) -> None:
        self.kind = kind
        self._tagger = None

    def __call__(self, texts: list[str]) -> list[str]:
        if self.kind is None:
            return texts
        if self._tagger is None:
            try:
                import fugashi
                import unidic_lite  # noqa: F401  (fugashi finds its dictionary)
            except ImportError as error:
                raise ImportError(
                    "pretokenize: mecab needs fugashi and unidic-lite: pip install 'lit-embed[ja]'"
                ) from error
            self._tagger = fugashi.Tagger("-Owakati")
        return [self._tagger.parse(t).strip() for t in texts]

    def __getstate__(self):
        return {"kind": self.kind, "_tagger": None}


class ExampleBuilder:
    """Batched map: text (or a pair) -> ``cls A sep [sep B sep]`` codes, segment ids, label, row index.

    Pairs are truncated longest-first to ``max_length``; RoBERTa-family encoders separate the pair
    with two ``sep`` (``separators=2``) as in their pre-training. Labels become the model's ids:
    integer labels are read in the file's order (ClassLabel names, else the hub's order, which for
    JNLI differs from MNLI/XNLI's) and string labels by name; anything else is refused by row.
    """

    def __init__(self, encoder: TextEncoder, task: Task, max_length: int, separators: int, pretokenize) -> None:
        self.encoder = encoder
        self.task = task
        self.max_length = max_length
        self.separators = separators
        self.split = _Pretokenizer(pretokenize)
        self.cls = encoder.special_code("cls")
        self.sep = encoder.special_code("sep")

    def fingerprint(self) -> str:
        """What the encoded rows depend on: the text encoder, the lengths, and what the task reads and makes of its
        labels (a config-defined task keeps its name while its columns, label names or order change)."""
        task = self.task
        reads = json.dumps([task.text_columns, task.label_column, task.labels, task.source_labels, task.value_range])
        return f"{self.encoder.fingerprint()}|{self.max_length}|{self.separators}|{self.split.kind}|{reads}"

    def __call__(self, batch: dict[str, list], indices: list[int], label_names, keep_index: bool,
                 keep_labels: bool = True) -> dict:
        sides = [self.encoder.encode(self.split([_text(t) for t in batch[c]])) for c in self.task.text_columns]
        out = {"codes": [], "token_type_ids": []}
        if keep_labels:
            out["labels"] = self.labels(batch[self.task.label_column], indices, label_names)
        for parts in zip(*sides):
            codes, segments = self.join(list(parts))
            out["codes"].append(codes)
            out["token_type_ids"].append(segments)
        if keep_index:
            out["index"] = list(indices)
        return out

    def join(self, parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        specials = 2 + (len(parts) - 1) * self.separators
        lengths = truncate_longest_first([len(p) for p in parts], self.max_length - specials)
        pieces, segments = [self.cls[None]], [0]
        for number, (part, length) in enumerate(zip(parts, lengths)):
            seps = 1 if number == len(parts) - 1 else self.separators
            pieces += [part[:length], np.stack([self.sep] * seps)]
            segments += [number] * (length + seps)
        return np.concatenate(pieces), np.asarray(segments, dtype=np.int64)

    def labels(self, values: list, indices: list[int], names: list[str] | None) -> list:
        task = self.task
        for row, value in zip(indices, values):
            if value is None or (isinstance(value, str) and not value.strip()):
                raise ConfigError(
                    f"{task.name}: row {row} has no label (column {task.label_column!r} is empty): give it one, or, if the "
                    f"file has it, a row was split in two: a line break inside an unquoted text, or a stray \\r "
                    f"(quote texts that hold line breaks; save the file with \\n line ends)")
        if task.regression:
            low, high = task.value_range or (-math.inf, math.inf)
            out = []
            for row, value in zip(indices, values):
                number = _as_float(value)
                if number is None or not low <= number <= high:
                    raise ConfigError(f"{task.name}: row {row} has label {value!r} in column {task.label_column!r}; the "
                                      f"task's scores are numbers in [{low}, {high}]")
                out.append(number)
            return out
        ours = {name: i for i, name in enumerate(task.labels)}
        out = []
        for row, value in zip(indices, values):
            name = value.strip() if isinstance(value, str) else None
            if name is None and task.definition is not None and str(value) in ours:
                name = str(value)  # an integer label that is itself a label's name
            if name is None and isinstance(value, (int, np.integer)) and names and 0 <= value < len(names):
                name = names[value]
            if name not in ours and isinstance(name, str) and name.lower() in ours:
                name = name.lower()
            if name not in ours:
                hidden = " (-1 marks a hidden test label: evaluate on a labelled split)" if value == -1 else ""
                unseen = " (unseen in training: a task's labels are those given, or those of its training split)" \
                    if task.definition is not None else ""
                raise ConfigError(
                    f"{task.name}: row {row} has label {value!r}, outside the label set {list(task.labels)} "
                    f"(or ids 0..{len(task.labels) - 1}){hidden}{unseen}"
                )
            out.append(ours[name])
        return out


def _as_float(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def truncate_longest_first(lengths: list[int], budget: int) -> list[int]:
    """Lengths that fit ``budget``, taking tokens from the longest part first (HF's ``longest_first``)."""
    lengths = list(lengths)
    while sum(lengths) > budget:
        longest = max(range(len(lengths)), key=lambda i: (lengths[i], -i))
        excess = sum(lengths) - budget
        others = sorted((n for i, n in enumerate(lengths) if i != longest), reverse=True)
        floor = others[0] if others else 0
        lengths[longest] -= max(1, min(excess, lengths[longest] - floor))
    return lengths
