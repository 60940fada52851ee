"""The fine-tuning task table: GLUE, JGLUE, XNLI and the shipped demo task, one row each; plugins add
theirs with :func:`register_task`, and a config defines its own (your labelled data) with a
:class:`TaskDefinition`, which becomes a row of the table under its name.

A row says where the task lives on the HuggingFace hub, which columns hold the text and the label,
the label names (in the order every model of lit-embed uses; ``None`` for regression), the metrics
(the first selects checkpoints unless a paper selects by another), which splits evaluate it, and how the
papers' tables show it (their column header, and the metric each paper reports where it is not the first).
Local files in the hub's layout are read the same way (see :mod:`lit_embed.data.finetune`). This module is the
one place that knows a task: ``lit-embed report`` takes its columns and metrics from here, and ``val/score``
its selection.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from typing import Literal, get_args

from lit_embed.errors import ConfigError
from lit_embed.measures.metric_names import check_metrics

#: The 15 XNLI languages, in the order of the papers' tables.
XNLI_LANGUAGES = ("en", "fr", "es", "de", "el", "bg", "ru", "tr", "ar", "vi", "th", "zh", "hi", "sw", "ur")
NLI_LABELS = ("entailment", "neutral", "contradiction")  # MNLI's and XNLI's ids 0, 1, 2
#: The commits read (docs/experiments.md, "Hub datasets and models", gives the evidence for each): GLUE and XNLI as parquet
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
class Selection:
    """What selects a run's checkpoint (logged as ``val/score``): one of the task's metrics, on its first
    validation set, or on all of its validation sets taken as one (``pooled``: HashFormers' MNLI, whose script
    validates on matched and mismatched concatenated)."""

    metric: str
    pooled: bool = False


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
        train: the split that trains it.
        text_columns: one column (single sentence) or two (a pair).
        labels: label names in model order; ``None`` for regression; ``()`` for a config-defined classification
            whose labels its training rows give, not read yet (:func:`lit_embed.data.finetune.labelled` reads them).
        source_labels: the order of the integer labels in the hub's files where it differs from
            ``labels`` (JNLI's hub order is entailment, contradiction, neutral).
        value_range: the scores a regression label may take (STS-B and JSTS: 0 to 5).
        metrics: metric names; the first one selects checkpoints (logged as ``val/score``) unless ``selected`` says
            otherwise.
        validation: evaluation sets ``{name: split}``; a single set is named ``""``.
        test: labelled test sets; ``None`` where the labels are hidden (GLUE, JGLUE), in which case
            ``test`` scores the validation sets (what the papers report as dev results).
        heldout_test: the test sets of the train-split protocol (original validation as test);
            default ``validation``.
        source: where the task comes from, for the docs and errors.
        header: its column in the papers' tables (default the name, upper case).
        shown: the metric a paper's tables show where it is not the first of ``metrics``
            (HashFormers: MRPC accuracy).
        selected: how a paper's runs select their checkpoint where it is not by the first of ``metrics`` on the
            first validation set (HashFormers: MRPC by accuracy, MNLI by accuracy on matched and mismatched pooled).
        per_set_columns: the tables give each evaluation set a column (XNLI's languages); otherwise the
            first set stands for the task (MNLI matched).
        data_files: a config-defined task's local files of each split (``train``, ``validation``, ``test``).
        held_out: the splits a config-defined task takes from its training rows (those it was given no data for).
        definition: the :class:`TaskDefinition` a config gave, as plain data (with the labels it resolved).
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
    selected: dict[str, Selection] = field(default_factory=dict)
    per_set_columns: bool = False
    revision: str | None = None
    files: str | None = None
    train: str = "train"
    data_files: dict[str, tuple[str, ...]] | None = None
    held_out: tuple[str, ...] = ()
    definition: dict | None = None
    eval_every: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for paper, metric in [*self.shown.items(), *((p, s.metric) for p, s in self.selected.items())]:
            if metric not in self.metrics:
                raise ConfigError(f"task {self.name!r}: {paper}'s metric {metric!r} is not one of its metrics "
                                  f"{list(self.metrics)}: add it to metrics")

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

    def selection(self, paper: str | None) -> Selection:
        """What selects the checkpoints of a run that follows ``paper`` (the first metric on the first set unless
        it says otherwise)."""
        return self.selected.get(paper or "", Selection(self.main_metric))

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


# HashFormers selects checkpoints as its GLUE script does (HUIYINXUE/hashformer, src/tr_glue.py:206-215 and 300-306):
# by the metric it reports per task, eval_acc for MRPC (not F1) and eval_mnli/acc for MNLI, whose dev set is
# validation_mismatched and validation_matched concatenated (src/utils/preproc_glue.py:85-101; its test set, the
# figure the tables print, is matched alone); elsewhere by the first metric (CoLA mcc, QQP f1, STS-B spearmanr).
TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        _glue("cola", ("sentence",), ("unacceptable", "acceptable"), ("matthews", "accuracy"), header="CoLA"),
        _glue("sst2", ("sentence",), ("negative", "positive"), header="SST"),
        _glue("mrpc", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"), ("f1", "accuracy"),
              shown={"hashformers": "accuracy"}, selected={"hashformers": Selection("accuracy")}),
        _glue("qqp", ("question1", "question2"), ("not_duplicate", "duplicate"), ("f1", "accuracy")),
        _glue("stsb", ("sentence1", "sentence2"), None, ("spearman", "pearson"), value_range=(0.0, 5.0), header="STS"),
        _glue(
            "mnli", ("premise", "hypothesis"), NLI_LABELS,
            validation={"matched": "validation_matched", "mismatched": "validation_mismatched"},
            selected={"hashformers": Selection("accuracy", pooled=True)},
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


#: What a task's name is: lower case letters, digits and ``_``, not first.
TASK_NAME = re.compile(r"[a-z0-9][a-z0-9_]*")


def _key(name: str) -> str:
    """The table's key for a task name: lower case, ``_`` for ``-`` (``SST-2`` and ``sts-b`` are ``sst2``, ``stsb``)."""
    return name.lower().replace("-", "_").replace("sst_2", "sst2").replace("sts_b", "stsb")


def _checked_name(name: str) -> str:
    """``name`` as the table keys it, refused unless it is that key already and :data:`TASK_NAME`'s form (a task name
    names runs' rows, sweep folders and cached files: never a path, a hidden name or a control character)."""
    key = _key(name)
    if name != key or not TASK_NAME.fullmatch(key):
        named = re.sub(r"[^a-z0-9]+", "_", key).strip("_") or "my_task"
        raise ConfigError(f"task name {name!r} is not the form configs find: name it {named!r} (lower case letters, "
                          f"digits and _)")
    return key


def register_task(task: Task) -> Task:
    """Add ``task`` to :data:`TASKS`, so that configs name it (``task: my_task``); returns it.

    A plugin calls this when it is imported (see :mod:`lit_embed.plugins`). A name is lower case, with ``_``
    between words, and is taken once: a task of the same name, shipped or registered, is an error.
    """
    if not isinstance(task, Task):
        raise TypeError(f"register_task takes a lit_embed.data.tasks.Task, not {type(task).__name__}")
    if not task.name.strip():
        raise ConfigError("a task needs a name: give Task(name=...) the name configs will use")
    key = _checked_name(task.name)
    if key in TASKS:
        known = TASKS[key]
        raise ConfigError(
            f"a task named {key!r} exists already ({known.source or known.benchmark}): register yours under another name"
        )
    TASKS[key] = task
    return task


@dataclass(frozen=True)
class TaskDefinition:
    """A task of your own, defined in a config: labelled data in local files or on the hub.

    It becomes a :class:`Task` of the table under ``name`` (:func:`get_task`); give the same definition to
    the model and the data (a YAML anchor: ``task: &task {...}`` then ``task: *task``). A split it is given
    no data for is held out of the training rows (``val_fraction`` of them each, seeded by the data's
    ``split_seed``): one file gives train, validation and test.

    Args:
        name: what the runs, results and tables call it (lower case, ``_`` between words).
        text_columns: the column of the text, or two columns of a sentence pair.
        label_column: the column of the label.
        labels: classification: the label names in the order of the model's outputs; unset, they are read
            from the training split (sorted: numerically where every label is an integer) and the model
            records them, so its checkpoint predicts with the same order without the data. Integer labels
            name a label by its position in ``labels`` unless they are themselves a label's name.
        regression: a score per text (one output, squared-error loss) instead of labels.
        value_range: regression: the scores a label may take (others are refused).
        metrics: torchmetrics names (``accuracy``, ``f1``, ``matthews``, ``pearson``, ``spearman``, or any function
            of ``torchmetrics.functional``: ``f1_score``, ``auroc``, ``cohen_kappa``, ``r2_score``,
            ``mean_squared_error``...; ``_macro``, ``_weighted`` or ``_micro`` after a multiclass one picks its
            average). The first, higher-is-better, selects checkpoints (``val/score``). Default ``accuracy``, or
            ``spearman, pearson`` for regression.
        files: local files (csv, tsv, jsonl, parquet): one file, or ``{train: ..., validation: ..., test: ...}``
            (each a file or a list of files; ``train`` required).
        hub: a hub dataset instead of files (``imdb``, ``org/name``), with its ``config`` and the commit to read
            (``revision``; pin it, so the data cannot change under a run).
        splits: the hub dataset's split names: ``{train: train, validation: validation, test: test}`` by default;
            a split set to null is held out of the training rows.
    """

    name: str
    text_columns: list[str]
    label_column: str = "label"
    labels: list[str | int] | None = None
    regression: bool = False
    value_range: tuple[float, float] | None = None
    metrics: list[str] | None = None
    files: str | list[str] | dict[str, str | list[str]] | None = None
    hub: str | None = None
    config: str | None = None
    revision: str | None = None
    splits: dict[str, str | None] | None = None

    def __post_init__(self) -> None:
        if self.labels is not None:  # a star column's labels are written 1, 2, 3: names all the same
            object.__setattr__(self, "labels", [str(label) for label in self.labels])

    def plain(self) -> dict:
        """The definition as plain data (a checkpoint and a YAML file hold it)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


SPLITS = ("train", "validation", "test")


def define_task(definition: TaskDefinition | dict) -> Task:
    """The :class:`Task` a config defines, registered in :data:`TASKS` under its name (once per process: the
    same definition again returns it; labels left unset match any, so a checkpoint's labels win)."""
    if isinstance(definition, dict):
        try:
            definition = TaskDefinition(**definition)
        except TypeError as error:
            raise ConfigError(f"task definition {definition!r} does not fit lit_embed.data.tasks.TaskDefinition: {error}") from None
    key = _checked_name(definition.name)
    known = TASKS.get(key)
    if known is not None:
        if known.definition is not None and _same_definition(known.definition, definition.plain()):
            return known
        origin = "another definition" if known.definition is not None else (known.source or known.benchmark)
        raise ConfigError(f"a task named {key!r} exists already ({origin}): give your definition another name")
    task = _task_of(definition)
    TASKS[key] = task
    return task


def _task_of(definition: TaskDefinition) -> Task:
    columns = list(definition.text_columns) if not isinstance(definition.text_columns, str) else [definition.text_columns]
    name = definition.name
    if not 1 <= len(columns) <= 2:
        raise ConfigError(f"task {name!r}: text_columns={columns} must name one column, or two of a sentence pair")
    if (definition.files is None) == (definition.hub is None):
        raise ConfigError(f"task {name!r}: give its data as files (one file, or train/validation/test) or as a hub dataset "
                          f"(hub: NAME), one of the two")
    if definition.regression and definition.labels is not None:
        raise ConfigError(f"task {name!r} is a regression (one score per text): leave labels unset")
    if definition.labels is not None and len(definition.labels) < 2:
        raise ConfigError(f"task {name!r}: labels {list(definition.labels)} name fewer than two, and a classification "
                          f"needs two or more: list them all, or set regression: true for scores")
    metrics = tuple(definition.metrics or (("spearman", "pearson") if definition.regression else ("accuracy",)))
    data_files, held_out, train, sets = None, (), "train", {"validation": "validation", "test": "test"}
    if definition.files is not None:
        files = definition.files if isinstance(definition.files, dict) else {"train": definition.files}
        unknown = sorted(set(files) - set(SPLITS))
        if unknown or "train" not in files:
            raise ConfigError(f"task {name!r}: files {sorted(files)} must name train, and may name validation and test "
                              f"(not {unknown})" if unknown else f"task {name!r}: files must name the train split")
        data_files = {split: tuple([paths] if isinstance(paths, str) else paths) for split, paths in files.items()}
        held_out = tuple(split for split in SPLITS[1:] if split not in files)
    else:
        splits = {**dict(zip(SPLITS, SPLITS)), **(definition.splits or {})}
        unknown = sorted(set(splits) - set(SPLITS))
        if unknown or not splits["train"]:
            raise ConfigError(f"task {name!r}: splits {definition.splits} may name train, validation and test "
                              f"(train not null)")
        train = splits["train"]
        held_out = tuple(split for split in SPLITS[1:] if not splits[split])
        sets = {split: splits[split] or split for split in SPLITS[1:]}
    task = Task(
        name, "user", definition.hub or "", definition.config, tuple(columns),
        None if definition.regression else tuple(definition.labels) if definition.labels is not None else (),
        metrics, label_column=definition.label_column, value_range=definition.value_range,
        validation={"": sets["validation"]}, test={"": sets["test"]}, source="defined in a config",
        revision=definition.revision, train=train, data_files=data_files, held_out=held_out, definition=definition.plain(),
    )
    return task if task.labels == () else with_labels(task, task.labels)  # () : its training rows give them


def with_labels(task: Task, labels: tuple[str, ...] | None) -> Task:
    """A config-defined ``task`` with its ``labels`` (``None``: a regression), its metrics checked against them, and
    recorded in its definition (a checkpoint predicts with them without the data); the task table holds it so."""
    task = dataclasses.replace(task, labels=labels)
    check_metrics(task.metrics, None if task.regression else task.num_outputs, f"task {task.name!r}")
    definition = {**(task.definition or {}), "labels": None if labels is None else list(labels)}
    task = dataclasses.replace(task, definition=definition)
    TASKS[_key(task.name)] = task
    return task


def _same_definition(a: dict, b: dict) -> bool:
    """Whether two definitions are the same task (labels left unset on one side match the other's)."""
    a, b = dict(a), dict(b)
    if a.get("labels") is None or b.get("labels") is None:
        a.pop("labels", None), b.pop("labels", None)
    return a == b


def get_task(name: str | TaskDefinition | dict) -> Task:
    """The task called ``name`` (case-insensitive; ``sst-2``, ``sts-b``, ``MARC-ja`` are accepted), or the task a
    config defines (a :class:`TaskDefinition`, or the same as a dict), registered under its name."""
    if not isinstance(name, str):
        return define_task(name)
    key = _key(name)
    if key in TASKS:
        return TASKS[key]
    near = difflib.get_close_matches(key, TASKS, n=1, cutoff=0.5)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise ConfigError(f"unknown task {name!r}: {hint}known tasks: {', '.join(TASKS)}")


# -- what a task's data module reads (one definition: the data modules and ``lit-embed data check``) ------------

#: Eval-set name -> (hub config, split).
Sources = dict[str, tuple[str | None, str]]


@dataclass(frozen=True)
class TaskSources:
    """The ``(config, split)`` pairs a task's data module reads: concatenated for training, and each evaluation set's.
    Plain data, so that ``lit-embed data check`` learns them without building the module (or importing Lightning)."""

    train: list[tuple[str | None, str]]
    validation: Sources
    test: Sources

    def all(self) -> list[tuple[str | None, str]]:
        """Every pair read, whichever stage runs, once each in order."""
        return list(dict.fromkeys([*self.train, *self.validation.values(), *self.test.values()]))


def task_sources(task: Task, protocol: str = "standard") -> TaskSources:
    """What :class:`~lit_embed.data.finetune.TaskDataModule` reads of ``task`` under ``protocol``: ``test`` scores the
    labelled test split where the task has one, else the validation split(s); ``split_train`` tests on the original
    validation split (its ``heldout_test``)."""
    tests = task.test or task.validation
    if protocol == "split_train":
        tests = task.heldout_test or task.validation
    return TaskSources(
        [(task.config, task.train)],
        {name: (task.config, split) for name, split in task.validation.items()},
        {name: (task.config, split) for name, split in tests.items()},
    )


def xnli_languages(mode: str, train: list[str] | None, validation: list[str] | None,
                   test: list[str] | None) -> tuple[list[str], list[str], list[str]]:
    """XNLI's training, validating and tested languages in ``mode`` (``cross_lingual``: English trains and validates;
    ``translate_train_all``: all of them), where the config leaves them unset."""
    if mode not in ("cross_lingual", "translate_train_all"):
        raise ConfigError(f"mode={mode!r} is not known: use 'cross_lingual' or 'translate_train_all'")
    everything = list(XNLI_LANGUAGES)
    default = ["en"] if mode == "cross_lingual" else everything
    return _languages(train or default), _languages(validation or default), _languages(test or everything)


def xnli_sources(protocol: str, train: list[str], validation: list[str], test: list[str]) -> TaskSources:
    """What :class:`~lit_embed.data.finetune.XNLIDataModule` reads: each language is a configuration of the hub's
    dataset; ``split_train`` tests on the validation split."""
    return TaskSources(
        [(lang, "train") for lang in train],
        {lang: (lang, "validation") for lang in validation},
        {lang: (lang, "validation" if protocol == "split_train" else "test") for lang in test},
    )


def _languages(names: list[str]) -> list[str]:
    unknown = [n for n in names if n not in XNLI_LANGUAGES]
    if unknown:
        raise ConfigError(f"XNLI has no language(s) {unknown}: use some of {list(XNLI_LANGUAGES)}")
    return list(names)
