"""The fine-tuning task table: GLUE, JGLUE, XNLI and the shipped demo task, one row each; plugins add
theirs with :func:`register_task`.

A row says where the task lives on the HuggingFace hub, which columns hold the text and the label,
the label names (in the order every model of lit-embed uses; ``None`` for regression), the metrics
(the first selects checkpoints), which splits evaluate it, and how the papers' tables show it (their
column header, and the metric each paper reports where it is not the first). Local files in the hub's
layout are read the same way (see :mod:`lit_embed.data.finetune`). This module is the one place that
knows a task: ``lit-embed report`` takes its columns and metrics from here.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Literal, get_args

from lit_embed.errors import ConfigError

#: The 15 XNLI languages, in the order of the papers' tables.
XNLI_LANGUAGES = ("en", "fr", "es", "de", "el", "bg", "ru", "tr", "ar", "vi", "th", "zh", "hi", "sw", "ur")
NLI_LABELS = ("entailment", "neutral", "contradiction")  # MNLI's and XNLI's ids 0, 1, 2
#: The commits read (README, "Hub datasets and models", gives the evidence for each): GLUE and XNLI as parquet
#: files after their loading scripts were deleted (datasets 4+ refuses a repository with one).
GLUE_REVISION = "0de23925db68e9cf6287d3776a0f67f5267a42eb"
XNLI_REVISION = "83ecd0da7773326e49a494fca44b9467b27103c8"
#: JGLUE's repository (shunk031/JGLUE) is a loading script: lit-embed reads the hub's parquet conversion of it
#: (branch refs/convert/parquet) at this commit, where MARC-ja kept the converter's older file names.
JGLUE_REVISION = "3a4a622d8ae03c700184c17da7afa1d3dc870cd3"
JGLUE_FILES = "{config}/{split}/*.parquet"
#: The papers whose fine-tuning protocols lit-embed follows (``data.init_args.paper``): a run records its
#: paper, and ``lit-embed report`` shows each task's metric as that paper's tables do.
Paper = Literal["k-sub-embedding", "hashformers", "sparse-coding"]
PAPERS: tuple[str, ...] = get_args(Paper)


@dataclass(frozen=True)
class Task:
    """One fine-tuning task.

    Args:
        name: the name configs use (``rte``, ``jnli``, ``xnli``).
        benchmark: ``glue``, ``jglue``, ``xnli`` or ``sample``.
        hub: the hub dataset (``nyu-mll/glue``).
        config: the hub configuration (``rte``; ``JNLI``); XNLI's is the language.
        revision: the commit of ``hub`` that is read (a full sha: the data cannot change under a run).
        files: where the task reads parquet files of ``hub`` instead of its configurations (JGLUE, whose
            repository is a loading script that ``datasets`` 4+ refuses): the files of one split, a
            pattern in the repository with ``{config}`` and ``{split}``.
        text_columns: one column (single sentence) or two (a pair).
        labels: label names in model order; ``None`` for regression.
        source_labels: the order of the integer labels in the hub's files where it differs from
            ``labels`` (JNLI's hub order is entailment, contradiction, neutral).
        value_range: the scores a regression label may take (STS-B and JSTS: 0 to 5).
        metrics: metric names; the first one selects checkpoints (logged as ``val/score``).
        validation: evaluation sets ``{name: split}``; a single set is named ``""``.
        test: labelled test sets; ``None`` where the labels are hidden (GLUE, JGLUE), in which case
            ``test`` scores the validation sets (what the papers report as dev results).
        heldout_test: the test sets of the train-split protocol (original validation as test);
            default ``validation``.
        source: where the task comes from, for the README and errors.
        header: its column in the papers' tables (default the name, upper case).
        shown: the metric a paper's tables show where it is not the first of ``metrics``
            (HashFormers: MRPC accuracy; the sparse-coding paper: CoLA accuracy).
        per_set_columns: the tables give each evaluation set a column (XNLI's languages); otherwise the
            first set stands for the task (MNLI matched).
        eval_every: training steps between validations in a paper's protocol where it does not validate once
            per epoch (HashFormers, its Table 5); ``lit-embed fit`` applies it where the config leaves
            ``trainer.val_check_interval`` unset, and the ModelCheckpoint on ``val/score`` keeps the best.
    """

    name: str
    benchmark: str
    hub: str
    config: str | None
    text_columns: tuple[str, ...]
    labels: tuple[str, ...] | None
    metrics: tuple[str, ...] = ("accuracy",)
    label_column: str = "label"
    source_labels: tuple[str, ...] | None = None
    value_range: tuple[float, float] | None = None
    validation: dict[str, str] = field(default_factory=lambda: {"": "validation"})
    test: dict[str, str] | None = None
    heldout_test: dict[str, str] | None = None
    source: str = ""
    header: str = ""
    shown: dict[str, str] = field(default_factory=dict)
    per_set_columns: bool = False
    revision: str | None = None
    files: str | None = None
    eval_every: dict[str, int] = field(default_factory=dict)

    @property
    def regression(self) -> bool:
        return self.labels is None

    @property
    def num_outputs(self) -> int:
        return 1 if self.labels is None else len(self.labels)

    @property
    def main_metric(self) -> str:
        return self.metrics[0]

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.text_columns, self.label_column)

    def hub_files(self, config: str | None, split: str) -> str | None:
        """The ``hf://`` pattern of the parquet files of ``split`` where the task reads files (``files``), else ``None``."""
        if self.files is None:
            return None
        at = f"@{self.revision}" if self.revision else ""
        return f"hf://datasets/{self.hub}{at}/{self.files.format(config=config, split=split)}"

    def shown_metric(self, paper: str | None) -> str:
        """The metric ``paper``'s tables show for this task (the first of ``metrics`` unless it says otherwise)."""
        return self.shown.get(paper or "", self.main_metric)

    def report_columns(self) -> list[tuple[str, str]]:
        """``(header, evaluation set)`` of each column the papers' tables give this task."""
        sets = list(self.test or self.validation)
        if self.per_set_columns:
            return [(name, name) for name in sets]
        return [(self.header or self.name.upper(), sets[0])]


#: HashFormers' evaluation schedule (its Table 5): training steps between validations of each GLUE task.
HASHFORMERS_EVAL_STEPS = {"mnli": 2455, "qnli": 655, "qqp": 2275, "rte": 48, "sst2": 421, "mrpc": 69, "cola": 162,
                          "stsb": 108}


def _glue(name, columns, labels, metrics=("accuracy",), **kwargs) -> Task:
    kwargs.setdefault("header", name.upper())
    if name in HASHFORMERS_EVAL_STEPS:
        kwargs.setdefault("eval_every", {"hashformers": HASHFORMERS_EVAL_STEPS[name]})
    return Task(name, "glue", "nyu-mll/glue", name, columns, labels, metrics, source="GLUE", revision=GLUE_REVISION,
                **kwargs)


def _jglue(name, config, columns, labels, metrics=("accuracy",), files=JGLUE_FILES, **kwargs) -> Task:
    return Task(name, "jglue", "shunk031/JGLUE", config, columns, labels, metrics, source="JGLUE", header=config,
                revision=JGLUE_REVISION, files=files, **kwargs)


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        _glue("cola", ("sentence",), ("unacceptable", "acceptable"), ("matthews", "accuracy"), header="CoLA",
              shown={"sparse-coding": "accuracy"}),
        _glue("sst2", ("sentence",), ("negative", "positive"), header="SST"),
        _glue("mrpc", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"), ("f1", "accuracy"),
              shown={"hashformers": "accuracy"}),
        _glue("qqp", ("question1", "question2"), ("not_duplicate", "duplicate"), ("f1", "accuracy")),
        _glue("stsb", ("sentence1", "sentence2"), None, ("spearman", "pearson"), value_range=(0.0, 5.0), header="STS"),
        _glue(
            "mnli", ("premise", "hypothesis"), NLI_LABELS,
            validation={"matched": "validation_matched", "mismatched": "validation_mismatched"},
        ),
        _glue("qnli", ("question", "sentence"), ("entailment", "not_entailment")),
        _glue("rte", ("sentence1", "sentence2"), ("entailment", "not_entailment")),
        _glue("wnli", ("sentence1", "sentence2"), ("not_entailment", "entailment")),
        _jglue(
            "jcola", "JCoLA", ("sentence",), ("unacceptable", "acceptable"), ("accuracy", "matthews"),
            validation={"in_domain": "validation", "out_of_domain": "validation_out_of_domain"},
            heldout_test={"": "validation_out_of_domain"},  # the sparse-coding paper's JCoLA test set
        ),
        _jglue("jsts", "JSTS", ("sentence1", "sentence2"), None, ("spearman", "pearson"), value_range=(0.0, 5.0)),
        _jglue(
            "jnli", "JNLI", ("sentence1", "sentence2"), NLI_LABELS,
            source_labels=("entailment", "contradiction", "neutral"),
        ),
        # MARC-ja was converted before the converter named files {split}/NNNN.parquet, and never again.
        _jglue("marc_ja", "MARC-ja", ("sentence",), ("positive", "negative"), files="{config}/jglue-{split}.parquet"),
        Task(
            "xnli", "xnli", "facebook/xnli", "en", ("premise", "hypothesis"), NLI_LABELS,
            validation={lang: "validation" for lang in XNLI_LANGUAGES},
            test={lang: "test" for lang in XNLI_LANGUAGES}, source="XNLI", per_set_columns=True, revision=XNLI_REVISION,
        ),
        Task(
            "topics", "sample", "sample-topics", None, ("text",),
            ("city", "forest", "garden", "kitchen", "school", "sea"),
            test={"": "test"}, source="generated by tools/make_sample_corpus.py, ships with lit-embed",
        ),
    )
}


#: The papers' score tables: each benchmark's tasks, in the papers' column order (HashFormers' for GLUE).
BENCHMARK_TABLES: dict[str, tuple[str, ...]] = {
    "GLUE": ("mnli", "qnli", "qqp", "rte", "sst2", "mrpc", "cola", "stsb"),
    "JGLUE": ("marc_ja", "jcola", "jsts", "jnli"),
    "XNLI": ("xnli",),
}


def _key(name: str) -> str:
    """The table's key for a task name: lower case, ``_`` for ``-`` (``SST-2`` and ``sts-b`` are ``sst2``, ``stsb``)."""
    return name.lower().replace("-", "_").replace("sst_2", "sst2").replace("sts_b", "stsb")


def register_task(task: Task) -> Task:
    """Add ``task`` to :data:`TASKS`, so that configs name it (``task: my_task``); returns it.

    A plugin calls this when it is imported (see :mod:`lit_embed.plugins`). A name is lower case, with ``_``
    between words, and is taken once: a task of the same name, shipped or registered, is an error.
    """
    if not isinstance(task, Task):
        raise TypeError(f"register_task takes a lit_embed.data.tasks.Task, not {type(task).__name__}")
    key = _key(task.name)
    if not key.strip():
        raise ConfigError("a task needs a name: give Task(name=...) the name configs will use")
    if task.name != key:
        raise ConfigError(f"task name {task.name!r} is not the form configs find: name it {key!r}")
    if key in TASKS:
        known = TASKS[key]
        raise ConfigError(
            f"a task named {key!r} exists already ({known.source or known.benchmark}): register yours under another name"
        )
    TASKS[key] = task
    return task


def get_task(name: str) -> Task:
    """The task called ``name`` (case-insensitive; ``sst-2``, ``sts-b``, ``MARC-ja`` are accepted)."""
    key = _key(name)
    if key in TASKS:
        return TASKS[key]
    near = difflib.get_close_matches(key, TASKS, n=1, cutoff=0.5)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise ConfigError(f"unknown task {name!r}: {hint}known tasks: {', '.join(TASKS)}")
