"""``LitEmbedCLI``: LightningCLI for ``lit-embed fit/validate/test/predict`` (and the config parsing of ``params``).

Strategies, data modules and models are chosen by ``class_path`` in YAML; jsonargparse resolves them, so a
user's own strategy is one class in an importable module and one YAML file. Every run gets a folder of its
own (:mod:`lit_embed.runs.folders`), atomic checkpoints and a clean stop on a signal
(:mod:`lit_embed.callbacks.guard`), and a progress bar and model summary that say only what is true
(:mod:`lit_embed.callbacks.console`); a checkpoint given to ``--ckpt_path`` is read safely and must be of the
configured model. A ``--config`` file that lit-embed wrote (a run's or a compress output's ``config.yaml``) is read
as :mod:`lit_embed.checkpoints.recorded` reads every recorded config. :mod:`lit_embed.commands` imports this module only for the
commands that need Lightning.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import sys
import warnings
from pathlib import Path

import pytorch_lightning as pl
import yaml
from jsonargparse import Namespace
from pytorch_lightning.callbacks import ModelSummary, ProgressBar
from pytorch_lightning.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from pytorch_lightning.plugins.io import TorchCheckpointIO
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from lit_embed._compat import subcommand_parser
from lit_embed.callbacks.console import LayerSummary, progress_bar
from lit_embed.callbacks.guard import RunGuard
from lit_embed.callbacks.predictions import PredictionWriter, predictions_folder
from lit_embed.callbacks.results_writer import ResultsWriter
from lit_embed.checkpoints.atomic_io import AtomicCheckpointIO
from lit_embed.checkpoints.format import (
    build_from_config,
    check_model,
    read_checkpoint,
    recorded_run,
    resolve_class,
)
from lit_embed.checkpoints.recorded import (
    name_user_classes,
    recorded_config,
    run_config_hints,
    written_by_lit_embed,
)
from lit_embed.commands.parsing import ConciseErrors

# Configs may name lit-embed's classes short (class_path: TaskDataModule): jsonargparse finds imported subclasses.
from lit_embed.data import CorpusDataModule, TaskDataModule, XNLIDataModule  # noqa: F401
from lit_embed.data.frequencies import counted_frequencies
from lit_embed.data.tasks import get_task
from lit_embed.embeddings.mixed_dimension import DATA, SAMPLE_TOKENS
from lit_embed.embeddings.text import VocabTextEncoder
from lit_embed.errors import CheckpointError, ConfigError, MissingFileError
from lit_embed.hub import counting_only
from lit_embed.interfaces import TaskData, provides, wire
from lit_embed.models import MaskedLM, SequenceClassifier, ShuffleRandom  # noqa: F401
from lit_embed.models.classifier import START, STARTING_ARGUMENTS, load_pretraining, starting_arguments
from lit_embed.runs.folders import (
    CHECKPOINTS,
    claim_folder,
    newest_checkpoint,
    run_of,
    start_checkpoint,
    taken,
)
from lit_embed.runs.logger import RunLogger, run_folder
from lit_embed.runs.signals import stop_if_signalled
from lit_embed.storage.cache import cache_folder
from lit_embed.storage.files import write_atomic

log = logging.getLogger(__name__)

# We hand LightningCLI the arguments ourselves (after taking our own subcommands off).
warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")

SUBCOMMANDS = ("fit", "validate", "test", "predict")
#: No option is taken for a prefix of another (``--trainer.max_step`` is an error, not ``max_steps``).
PARSER_KWARGS = {"default_env": False, "allow_abbrev": False}
OUTPUT_HELP = (
    "the folder to write the predictions to (with the run's results.json and config.yaml); it must not exist. "
    "Default: beside the checkpoint's run folder (or the checkpoint file), named after the input, numbered "
    "(-2, -3, ...) where that name is taken"
)
CKPT_MODEL_HELP = (
    "config (default): refuse a --ckpt_path checkpoint of another model than the config builds; "
    "checkpoint: build the model the checkpoint records instead"
)


class RecordedConfigParser(ConciseErrors, LightningArgumentParser):
    """Lightning's parser, reading a config file that lit-embed wrote as a recorded config: no trust-granting key,
    no class from outside lit-embed, Lightning and the installed plugins (:mod:`lit_embed.checkpoints.recorded`); its errors
    are one line and a close match, not the usage (:mod:`lit_embed.commands.parsing`)."""

    def parse_path(self, path, ext_vars=None, env=None, defaults=True, **kwargs):
        if not written_by_lit_embed(path):
            return super().parse_path(path, ext_vars=ext_vars, env=env, defaults=defaults, **kwargs)

        document = recorded_config(yaml.safe_load(Path(path).read_text()) or {}, f"config {str(path)!r}", "",
                                   run_config_hints())
        return self.parse_string(yaml.safe_dump(document, sort_keys=False), path=os.path.basename(path),
                                 ext_vars=ext_vars, env=env, defaults=defaults, **kwargs)


class AtomicSaveConfig(SaveConfigCallback):
    """LightningCLI's ``config.yaml`` in the run folder, written atomically (:func:`~lit_embed.storage.files.write_atomic`): a
    resumed run rewrites it, and a full disk must leave the earlier one whole and name the file and its device."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.already_saved:
            return
        log_dir = trainer.log_dir if self.save_to_log_dir else None  # a broadcast: every rank asks
        if trainer.is_global_zero:
            if log_dir is not None:
                write_atomic(Path(log_dir) / self.config_filename, self.parser.dump(self.config, skip_none=False))
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)


class LitEmbedCLI(LightningCLI):
    """LightningCLI in subclass mode; configs compose by naming piece files (see ``configs/``).

    Runs go to ``trainer.default_root_dir`` (default ``runs/<name of the first --config file>``), each in
    its own ``version_N`` folder (:class:`~lit_embed.runs.logger.RunLogger`, unless the config names a logger).
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("save_config_callback", AtomicSaveConfig)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("parser_kwargs", {**PARSER_KWARGS, "prog": "lit-embed",  # also when run in-process
                                            **{name: dict(PARSER_KWARGS) for name in SUBCOMMANDS}})
        kwargs.setdefault("trainer_defaults", {"logger": {"class_path": "lit_embed.runs.RunLogger"},
                                               "callbacks": [RunGuard()]})
        kwargs.setdefault("parser_class", RecordedConfigParser)
        super().__init__(pl.LightningModule, pl.LightningDataModule, *args, subclass_mode_model=True,
                         subclass_mode_data=True, auto_configure_optimizers=False, **kwargs)

    def parse_arguments(self, parser, args) -> None:
        """LightningCLI's parse; ``--print_config`` prints the config as the run will use it, with what lit-embed fills
        in before the run (a paper's evaluation schedule), where jsonargparse would print it before that."""
        asked = [a for a in args or [] if a == "--print_config" or a.startswith("--print_config=")]
        if not asked or isinstance(args, (dict, Namespace)):
            super().parse_arguments(parser, args)
            self.link_task()
            self.start_checkpoint()
            self.pretraining_start()
            self.count_frequencies()
            self.predictions_output()
            return
        super().parse_arguments(parser, [a for a in args if a not in asked])
        self.link_task()
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        if subcommand in (None, "fit"):
            apply_evaluation_schedule(config)
        flags = set(asked[-1].partition("=")[2].split(","))
        sys.stdout.write(subcommand_parser(self, subcommand).dump(
            config, skip_default="skip_default" in flags, skip_none="skip_null" in flags or "skip_unset" in flags))
        sys.exit(0)

    def link_task(self) -> None:
        """The data's task is the model's: ``data.init_args.task`` becomes ``model.init_args.task`` where the model takes
        a task and the config leaves it unset, so a config says it once (and records it in both). A model given
        another task than its data's is refused when the data is set up, naming both."""
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        data, model = config.get("data"), config.get("model")
        if not isinstance(data, Namespace) or not isinstance(model, Namespace):
            return
        task = (data.get("init_args") or Namespace()).get("task")
        if task is None or (model.get("init_args") or Namespace()).get("task") is not None:
            return
        cls = resolve_class(model.class_path)
        if not isinstance(cls, type) or "task" not in inspect.signature(cls).parameters:
            return
        update = {"model": {"class_path": model.class_path, "init_args": {"task": _plain(task)}}}
        self.config = self.parser.parse_object({subcommand: update} if subcommand else update, self.config)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--ckpt_model", choices=["config", "checkpoint"], default="config", help=CKPT_MODEL_HELP)

    def _prepare_subcommand_parser(self, klass, subcommand: str, **kwargs):  # LightningCLI's: one parser a subcommand
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        if subcommand == "predict":
            parser.add_argument("--output", type=str | None, default=None, help=OUTPUT_HELP)
        return parser

    # -- before the classes: the run's folder and the checkpoint it starts from --------------------------
    def _parse_ckpt_path(self) -> None:  # LightningCLI's hook (see lit_embed._compat)
        """Nothing: Lightning's would read the ``--ckpt_path`` file a second time and apply the hyper-parameters it
        records over the config unchecked; :meth:`start_checkpoint` has read it once and checked it."""

    def start_checkpoint(self) -> None:
        """The run's folder and the checkpoint ``--ckpt_path`` names, read once: resolved (``last``, a run or
        experiment folder), checked against the configured model (:func:`~lit_embed.checkpoints.format.check_model`: a
        different model refused, what the config leaves unset filled in), and handed to Lightning's checkpoint IO
        so that the trainer does not read the file again."""
        self.given_checkpoint: tuple[str, dict] | None = None
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        config = self.config[subcommand]
        name_user_classes(config.as_dict())  # what a checkpoint records may name them too
        if config.trainer.default_root_dir is None:
            config.trainer.default_root_dir = default_root_dir(config)
        ckpt_path = config.get("ckpt_path")
        root = self._run_root(config)
        if ckpt_path == "last":
            found = newest_checkpoint(root, config.trainer.default_root_dir) if root is not None else None
            if found is None and subcommand != "fit":  # Lightning would evaluate the untrained model, saying only that
                raise MissingFileError(f"--ckpt_path last: no checkpoint under {root}: give a checkpoint file or run folder")
            if found is None:
                log.warning("--ckpt_path last: no checkpoint under %s yet, so the run starts afresh", root)
            else:
                taken("--ckpt_path checkpoint", ckpt_path, found, f"the newest checkpoint under {root}")
            config.ckpt_path = ckpt_path = None if found is None else str(found)
        elif ckpt_path not in (None, "best", "hpc", "registry") and Path(ckpt_path).exists():
            # a file, a run folder or an experiment folder, as every other command takes them: fit resumes the newest
            # state; an evaluation takes the model the run reported (its best, where monitored)
            config.ckpt_path = ckpt_path = str(start_checkpoint(ckpt_path, "--ckpt_path checkpoint", newest=subcommand == "fit"))
        if ckpt_path in ("best", "hpc", "registry") and subcommand != "fit":
            raise ConfigError(f"--ckpt_path {ckpt_path} names a checkpoint of a fit in this process (lit-embed {subcommand} "
                              f"runs none): give a checkpoint file, a run folder or an experiment folder")
        if ckpt_path is None or ckpt_path in ("best", "hpc", "registry"):
            return
        checkpoint = read_checkpoint(ckpt_path, "--ckpt_path checkpoint")
        if subcommand == "fit" and "optimizer_states" not in checkpoint:
            raise CheckpointError(
                f"--ckpt_path {ckpt_path} holds weights only (no optimiser or loop state: a compress output, or a "
                f"weights-only save), so no run can resume from it: start a new run from its weights with "
                f"model.init_args.checkpoint {ckpt_path} (fine-tuning), or give a checkpoint a fit saved"
            )
        self._check_model(config, checkpoint, ckpt_path)
        self.given_checkpoint = (ckpt_path, checkpoint)
        config = self.config[subcommand]  # the check may have filled in the model from the checkpoint
        if subcommand == "fit" and config.model.init_args.get("checkpoint") is not None:
            config.model.init_args.checkpoint = None  # resumed: every weight comes from --ckpt_path, not the start point
        if subcommand == "fit" and root is not None:
            recorded = recorded_run(checkpoint)  # a SLURM requeue checkpoint lies outside its run folder
            version = run_of(ckpt_path, root)
            if version is None and recorded is not None:
                version = run_of(Path(recorded) / CHECKPOINTS, root)
            if version is not None:  # resuming a run of this experiment: it continues in its own folder
                for logger in _logger_configs(config.trainer):
                    logger.init_args.version = version

    def pretraining_start(self) -> None:
        """The checkpoint a fine-tuning starts from (``model.init_args.checkpoint``), read once, for ``fit`` alone:
        resolved (a file, a run or experiment folder's), checked, and what the config leaves unset of the model taken
        from it (:func:`~lit_embed.models.classifier.starting_arguments`); its weights go into the model once it is
        built (:meth:`after_instantiate_classes`). validate, test, predict and a resumed fit (``--ckpt_path``, which
        clears it) take every weight from ``--ckpt_path`` and read no start point."""
        self.given_start: tuple[str, Path, dict] | None = None
        if self.config.get("subcommand") != "fit":
            return
        model = self.config.fit.model
        init = model.get("init_args") or Namespace()
        cls = resolve_class(model.class_path)
        if init.get("checkpoint") is None or not (isinstance(cls, type) and issubclass(cls, SequenceClassifier)):
            return
        name = str(init.checkpoint)
        path = start_checkpoint(name, START)  # a file, or a run's newest
        checkpoint = read_checkpoint(path, START)
        given = {key: init.get(key) for key in (*STARTING_ARGUMENTS, "trained_tokenizer")}
        filled = starting_arguments(checkpoint, name, given)
        if filled:
            update = {"class_path": model.class_path, "init_args": filled}
            self.config = self.parser.parse_object({"fit": {"model": update}}, self.config)
        self.given_start = (name, path, checkpoint)

    def predictions_output(self) -> None:
        """``predict``'s folder, claimed now on rank 0 (:func:`~lit_embed.runs.folders.claim_folder`): ``--output``, else
        beside the checkpoint (:func:`~lit_embed.callbacks.predictions.predictions_folder`), numbered where taken. The
        run writes there and nowhere else: no logger (``predict`` logs nothing), no ``version_N`` among training runs."""
        if self.config.get("subcommand") != "predict":
            return
        config = self.config.predict
        given = config.get("output")
        if given is not None and Path(given).suffix in (".csv", ".jsonl", ".json", ".tsv"):
            raise ConfigError(f"--output {given!r} names a folder (it holds predictions.csv or .jsonl, results.json and "
                              f"config.yaml): give a folder, e.g. --output {str(Path(given).with_suffix(''))!r}")
        data = (config.get("data") or {}).get("init_args") or {}
        folder = Path(given) if given is not None else predictions_folder(
            config.get("ckpt_path"), _plain(data.get("predict_input")), config.trainer.default_root_dir)
        if rank_zero_only.rank == 0:  # every rank parses; rank 0's folder is the one (its log_dir is broadcast)
            folder = claim_folder(folder, numbered=given is None, option="--output")
        config.trainer.default_root_dir = str(folder)
        config.trainer.logger = False

    def count_frequencies(self) -> None:
        """A strategy that ranks tokens by the training data's counts (``frequencies: data``, mixed dimension's default)
        is given them as a count file before it is built (its widths follow them): counted from the config's data (its
        first ``counted_tokens`` tokens) and cached in :meth:`frequencies_folder` (:mod:`lit_embed.data.frequencies`);
        the config then names that file, so the run's ``config.yaml`` records which counts it used."""
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        model, data = config.get("model"), config.get("data")
        embedding = (model.get("init_args") or Namespace()).get("embedding") if isinstance(model, Namespace) else None
        init = embedding.get("init_args") if isinstance(embedding, Namespace) else None
        if not isinstance(init, Namespace) or init.get("frequencies") != DATA or init.get("block_dims") or counting_only():
            return  # a model built to be counted (params, a sweep's plan) is sized by the id-order widths: no data read
        module = build_from_config(pl.LightningDataModule, _plain(data), "data")
        encoder = model.init_args.get("encoder")
        tokenizer = getattr(module, "tokenizer", None) or (_plain(encoder) or {}).get("init_args", {}).get("pretrained")
        if tokenizer is None:
            raise ConfigError("frequencies: data counts the training data's tokens and the config names no tokenizer: set "
                              "data.init_args.tokenizer")
        vocab_size = model.init_args.get("vocab_size") or len(VocabTextEncoder(tokenizer))
        folder = self.frequencies_folder(config)
        folder.mkdir(parents=True, exist_ok=True)
        most = init.get("counted_tokens", SAMPLE_TOKENS)
        init.frequencies = str(counted_frequencies(module, _plain(data), tokenizer, vocab_size, folder, most))

    def frequencies_folder(self, config) -> Path:
        """Where a run's token counts are cached: its experiment's folder, beside its ``version_N`` runs."""
        if config.trainer.get("default_root_dir") is None:  # in-process (run=False): no subcommand set it
            return Path(default_root_dir(config))
        return self._run_root(config) or Path(config.trainer.default_root_dir)

    def _check_model(self, config, checkpoint: dict, ckpt_path: str) -> None:
        """Refuse a checkpoint of another model; fill in what the config leaves unset from what it records.

        What a fit records (the seed, the tokenizer its weights expect) is taken from the checkpoint where the
        config leaves it unset: testing a fine-tuned checkpoint needs no other file.
        """
        configured = config.model.as_dict()
        data = (config.get("data") or {}).get("init_args") or {}
        check = check_model(checkpoint, configured, tokenizer=data.get("tokenizer"))
        if check.recorded is None:
            return  # not written by the CLI: its weights are checked against the model when they load
        recorded = check.recorded
        subcommand = self.config.subcommand
        if check.differences:
            listed = check.listed()
            if config.ckpt_model != "checkpoint":
                raise CheckpointError(
                    f"--ckpt_path {ckpt_path} is a checkpoint of another model than the config builds ({listed}): give "
                    f"the config it was trained with (its run folder's config.yaml), or --ckpt_model checkpoint to build "
                    f"the checkpoint's model instead"
                )
            log.warning("--ckpt_model checkpoint: building the checkpoint's model, not the config's (%s)", listed)
            update = recorded
        else:
            unset = configured.get("init_args") or {}
            filled = dict(check.filled)
            labels = _recorded_labels(recorded, unset)
            if labels is not None:  # a config-defined task predicts with the labels it was trained with, data or not
                filled["task"] = {**unset["task"], "labels": labels}
                task = _plain(data.get("task"))
                if isinstance(task, dict) and task.get("name") == unset["task"].get("name"):
                    self.config = self.parser.parse_object(
                        {subcommand: {"data": {"class_path": config.data.class_path,
                                           "init_args": {"task": {**task, "labels": labels}}}}}, self.config)
            if not filled:
                return
            update = {"class_path": configured["class_path"], "init_args": filled}
        self.config = self.parser.parse_object({subcommand: {"model": update}}, self.config)

    @staticmethod
    def _run_root(config) -> Path | None:
        """The folder holding this experiment's ``version_N`` run folders."""
        loggers = _logger_configs(config.trainer)
        if not loggers:
            return Path(config.trainer.default_root_dir)
        args = loggers[0].init_args
        if loggers[0].class_path == "lit_embed.runs.RunLogger" and args.get("save_dir") is None:
            return Path(config.trainer.default_root_dir) / (args.get("name") or "")
        if args.get("save_dir") is None:
            return None
        return Path(args.save_dir) / (args.get("name") or "")

    def before_instantiate_classes(self) -> None:
        """Give the run lit-embed's progress bar and model summary, unless the config names its own or turns them off,
        and ``predict`` a :class:`~lit_embed.callbacks.predictions.PredictionWriter` unless it names one; ``fit``
        validates on its paper's schedule unless the config says when."""
        if self.subcommand in (None, "fit"):  # None: run=False, the config is not nested under a subcommand
            config = self.config[self.subcommand] if self.subcommand else self.config
            interval = config.trainer.get("val_check_interval")
            if isinstance(interval, (int, float)) and interval <= 0:
                raise ConfigError(f"trainer.val_check_interval={interval} must be positive: a number of training batches, "
                                  f"or a fraction of an epoch in (0, 1]")
            apply_evaluation_schedule(config)
        if self.subcommand is None:
            return
        trainer = self.config[self.subcommand].trainer
        configured = trainer.get("callbacks") or []
        configured = configured if isinstance(configured, list) else [configured]
        named = [resolve_class(c.class_path) if isinstance(c, Namespace) else type(c) for c in configured]
        shown = []
        if trainer.get("enable_progress_bar") is not False and not any(_is(c, ProgressBar) for c in named):
            shown.append(progress_bar())
        if trainer.get("enable_model_summary") is not False and not any(_is(c, ModelSummary) for c in named):
            shown.append(LayerSummary())
        if self.subcommand == "predict" and not any(_is(c, PredictionWriter) for c in named):
            shown.append(PredictionWriter())
        self.trainer_defaults["callbacks"] = [RunGuard(), *shown]

    def after_instantiate_classes(self) -> None:
        if self.subcommand is not None:
            if self.given_start is not None:  # before the data is set up: its text encoder is the pre-training's
                name, path, checkpoint = self.given_start
                load_pretraining(self.model, checkpoint, name)
                self.model.hparams["checkpoint"] = str(path)  # the run records which file it started from
                self.given_start = None  # the file's tensors are the model's now
            wire(self.model, self.datamodule)  # the one step that hands model and data each other
            self._hand_over_checkpoint()
            for logger in self.trainer.loggers:
                if isinstance(logger, RunLogger):
                    logger.bind(self.trainer.default_root_dir)
            # The guard first: its hooks (last.ckpt at the end of training) run before the results that report them.
            callbacks = self.trainer.callbacks
            callbacks.sort(key=lambda callback: not isinstance(callback, RunGuard))

    def _hand_over_checkpoint(self) -> None:
        """The ``--ckpt_path`` checkpoint read in :meth:`start_checkpoint`, given to the trainer's checkpoint IO so that
        it is not read again (a checkpoint IO of the config's own, not lit-embed's, reads the file itself)."""
        if self.given_checkpoint is None:
            return
        strategy = self.trainer.strategy
        if type(strategy.checkpoint_io) is TorchCheckpointIO:
            strategy.checkpoint_io = AtomicCheckpointIO()  # what RunGuard would install at setup
        if isinstance(strategy.checkpoint_io, AtomicCheckpointIO):
            strategy.checkpoint_io.hand_over(*self.given_checkpoint)

    def before_fit(self) -> None:
        if self._tests_after_fit():
            for callback in self.trainer.callbacks:
                if isinstance(callback, (ResultsWriter, RunGuard)):
                    callback.expect_test()

    def _tests_after_fit(self) -> bool:
        return provides(self.datamodule, TaskData)

    def after_fit(self) -> None:
        """Fine-tuning data with test sets: test the selected checkpoint (the best ``val/score``
        where a ModelCheckpoint monitors it, else the last weights) right after ``fit``; not after a signal, which
        stops the command here (the run's results stay ``untested``; ``--ckpt_path last`` tests it)."""
        if self._tests_after_fit() and not self.trainer.interrupted:
            stop_if_signalled()
            callback = self.trainer.checkpoint_callback
            best = callback is not None and callback.monitor is not None and callback.best_model_path
            self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path="best" if best else None)
        if self.trainer.is_global_zero:
            print(f"lit-embed: fit: {fit_outputs(self.trainer)}", file=sys.stderr, flush=True)


def default_root_dir(config) -> str:
    """``runs/<name of the first --config file>``: where a run goes when its config names no ``default_root_dir``."""
    files = [file for file in config.get("config") or [] if file is not None]  # None: a config given inline
    return str(Path("runs") / (Path(str(files[0])).stem if files else "lightning_logs"))


def fit_outputs(trainer: pl.Trainer) -> str:
    """Where a fit left what a user looks for next: its run folder, best checkpoint (and its score) and last one."""
    said = [f"run folder {run_folder(trainer)}"]  # not trainer.log_dir: a collective, and only rank 0 says this
    callback = trainer.checkpoint_callback
    if callback is not None and callback.monitor is not None and callback.best_model_path:
        score = callback.best_model_score
        said.append(f"best checkpoint {callback.best_model_path}"
                    + (f" ({callback.monitor} {float(score):.4g})" if score is not None else ""))
    if callback is not None and callback.last_model_path:
        said.append(f"last checkpoint {callback.last_model_path}")
    return "; ".join(said)


def _recorded_labels(recorded: dict, configured: dict) -> list | None:
    """The labels a checkpoint's config-defined task recorded, where the config's definition leaves them unset."""
    theirs, mine = recorded["init_args"].get("task"), configured.get("task")
    if isinstance(theirs, dict) and isinstance(mine, dict) and mine.get("labels") is None:
        return theirs.get("labels")
    return None


def _plain(value):
    return value.as_dict() if isinstance(value, Namespace) else value


def _is(cls, base: type) -> bool:
    return isinstance(cls, type) and issubclass(cls, base)


def apply_evaluation_schedule(config) -> None:
    """Validate as the run's paper did: every ``eval_every`` steps of the task table (HashFormers' Table 5),
    where the config leaves ``trainer.val_check_interval`` unset; the steps count across epochs."""
    data = (config.get("data") or {}).get("init_args") or {}
    if config.trainer.get("val_check_interval") is not None or not data.get("task") or not data.get("paper"):
        return
    steps = get_task(_plain(data["task"])).eval_every.get(data["paper"])  # a definition given on the command line: parsed
    if steps is not None:
        config.trainer.val_check_interval = steps
        config.trainer.check_val_every_n_epoch = None


def _logger_configs(trainer_config) -> list:
    """The trainer's logger configs that name a class (``class_path`` + ``init_args``)."""
    loggers = trainer_config.get("logger")
    loggers = loggers if isinstance(loggers, list) else [loggers]
    return [item for item in loggers if isinstance(item, Namespace) and item.get("init_args") is not None]


class ModelOnlyCLI(LitEmbedCLI):
    """Parses a full config but builds only the model: no data, no trainer, no download. ``prog`` names the command
    in its errors."""

    def __init__(self, *args, prog: str = "lit-embed", **kwargs) -> None:
        kwargs.setdefault("parser_kwargs", {**PARSER_KWARGS, "prog": prog})
        super().__init__(*args, **kwargs)

    def start_checkpoint(self) -> None:
        """Nothing: no run is made."""

    def frequencies_folder(self, config) -> Path:
        """lit-embed's cache (:func:`~lit_embed.storage.cache.cache_folder`): a model built alone is no run to keep them beside."""
        return cache_folder() / "token_counts"

    def _set_seed(self) -> None:
        """Seed as a run does, without its "Seed set to N" line: a model built alone (params, compress, data check) is
        no run, and nothing records the seed."""
        seed = self.config.get("seed_everything", True)
        if seed is not False:
            self.config["seed_everything"] = pl.seed_everything(None if seed is True else seed, workers=True, verbose=False)

    def instantiate_classes(self) -> None:
        self.model = build_from_config(pl.LightningModule, self.config["model"].as_dict(), "model")

    def after_instantiate_classes(self) -> None:
        """Nothing: there is no trainer."""





def fit(argv: list[str]) -> int:
    """Train a model from a config (--config FILE): pre-training, fine-tuning; --ckpt_path last resumes."""
    return _run("fit", argv)


def validate(argv: list[str]) -> int:
    """Evaluate a checkpoint (--ckpt_path) on the validation data of a config."""
    return _run("validate", argv)


def test(argv: list[str]) -> int:
    """Evaluate a checkpoint (--ckpt_path) on the test data of a config."""
    return _run("test", argv)


def predict(argv: list[str]) -> int:
    """Write a checkpoint's predictions (labels and probabilities, scores, or a MaskedLM's <mask> fills) to --output or beside it."""
    return _run("predict", argv)


def _run(subcommand: str, argv: list[str]) -> int:
    assemble(None, *argv, subcommand=subcommand).run()
    return 0


class Assembled:
    """A run as :func:`assemble` built it, not yet run: the model, the data module and the trainer (its callbacks and
    loggers included), handed each other, and the config they were built from (as ``--print_config`` shows it)."""

    def __init__(self, cli: LitEmbedCLI, subcommand: str) -> None:
        self.model: pl.LightningModule = cli.model
        self.datamodule: pl.LightningDataModule = cli.datamodule
        self.trainer: pl.Trainer = cli.trainer
        self.config: Namespace = cli.config[subcommand]
        self._cli, self._subcommand = cli, subcommand

    def run(self) -> None:
        """Run it as the command does: the trainer's ``fit`` (``validate``, ``test``, ``predict``) with the config's
        ``ckpt_path``, and what lit-embed does around it (``fit`` on task data then tests the selected checkpoint)."""
        LitEmbedCLI._run_subcommand(self._cli, self._subcommand)


class _Built(LitEmbedCLI):
    """:class:`LitEmbedCLI` that stops once the run is built: :meth:`Assembled.run` runs it."""

    def _run_subcommand(self, subcommand: str) -> None:  # LightningCLI's hook that runs the subcommand
        """Nothing yet: :meth:`Assembled.run` runs it."""


def assemble(config: str | os.PathLike | dict | None = None, *args: str, subcommand: str = "fit") -> Assembled:
    """Build a run as ``lit-embed SUBCOMMAND --config CONFIG ARGS...`` builds it, and return it unrun.

    The command itself is ``assemble(None, *argv, subcommand=...).run()``, so a script or a notebook gets what the
    command would run: the same parser, defaults and checks (the run's own folder under ``default_root_dir``, a
    ``--ckpt_path`` read and checked against the model, model and data handed each other, the run guard, the progress
    bar and the summary)::

        from lit_embed.commands.lightning import assemble

        run = assemble("configs/demo.yaml", "--trainer.max_steps", "20")
        run.model, run.datamodule, run.trainer  # inspect or change them here
        run.run()                                # trainer.fit, as lit-embed fit runs it

    Args:
        config: a config file (the files it names are relative to it, as on the command line), the same as a dict
            (those files relative to the working folder), or ``None`` where ``args`` give ``--config``.
        args: more of the command line, as ``lit-embed`` takes it (``"--trainer.max_steps", "20"``).
        subcommand: ``fit``, ``validate``, ``test`` or ``predict``.
    """
    if subcommand not in SUBCOMMANDS:
        raise ConfigError(f"subcommand={subcommand!r} is not one lit-embed assembles: use one of {list(SUBCOMMANDS)}")
    given = [] if config is None else ["--config", json.dumps(config) if isinstance(config, dict) else os.fspath(config)]
    return Assembled(_Built(args=[subcommand, *given, *args]), subcommand)
