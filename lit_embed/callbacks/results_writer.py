"""The figures the papers report, logged to every logger and written to the run folder's ``results.json``."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import yaml
from pytorch_lightning.loggers import TensorBoardLogger
from pytorch_lightning.utilities.exceptions import SIGTERMException

from lit_embed._compat import keep_hparams_tab_for_final_figures, tensorboard_file_writer
from lit_embed.callbacks.efficiency import EfficiencyMonitor
from lit_embed.errors import ConfigError, DivergedError, UserError
from lit_embed.interfaces import TaskModel, provides
from lit_embed.measures.accounting import parameter_report, performance_retention, speed_up
from lit_embed.measures.metric_names import higher_is_better
from lit_embed.models.base import EmbeddingModule
from lit_embed.runs.folders import checkpoints_taken
from lit_embed.runs.logger import run_folder
from lit_embed.runs.results import (
    COMPLETE,
    DIVERGED,
    RESULTS_FILE,
    RESULTS_FORMAT,
    check_same_backbone,
    is_score,
    load_per_core,
    load_results,
    loads_differ,
    versions,
)
from lit_embed.runs.signals import Interrupted
from lit_embed.storage.files import write_json_atomic, writing

#: Lightning's name for an unnamed TensorBoard experiment: not a useful row label.
_DEFAULT_LOGGER_NAME = "lightning_logs"


class ResultsWriter(pl.Callback):
    """Parameter figures, timings, final metrics and PRR: logged, and written to ``results.json``.

    At the start of a run it logs the parameter counts and PCR_All, PCR_Emb, PoEP (``params/*``,
    ``compression/*``); at the end of fit, validate, test or predict it logs the timings of an
    :class:`EfficiencyMonitor` in the same trainer (``efficiency/*``), and against a ``baseline`` run
    the speed-ups (``speedup/*``; beside them in ``results.json`` both runs' loads per core and ``loads_differ``, whether
    they lie more than :data:`~lit_embed.runs.results.LOAD_MARGIN` apart) and the PRR of every evaluation score
    (``prr/{stage}/...``). It then
    records everything in TensorBoard's HPARAMS tab (other loggers get the figures as hyper-parameters)
    and writes ``results.json`` to the run folder (``trainer.log_dir``) atomically, on rank 0 only.

    Its ``status`` (:data:`lit_embed.runs.results.STATUSES`) is ``complete`` only when every step the command asked for has
    finished: a ``fit`` that tests afterwards (:meth:`expect_test`) writes ``untested`` when its training ends, a
    signal ``interrupted``, divergence ``diverged``. The metrics so far travel in the run's checkpoints, so a resumed run
    reports those logged before it stopped (a fit resumed at its end, to run its test, keeps its validation scores).

    Args:
        baseline: a finished run folder to compare against (its ``results.json``): PCR against its
            parameter counts, speed-up against its timings, PRR against its scores. Its backbone must
            match. Without it, PCR compares with the dense strategy on the same backbone and
            vocabulary, and there is no PRR or speed-up (``lit-embed report --baseline`` computes them
            afterwards).
        label: the run's row name in ``lit-embed report`` (default: the logger's experiment name,
            else the strategy). Give the runs of one model the same label across tasks and seeds.
    """

    def __init__(self, baseline: str | None = None, label: str | None = None) -> None:
        self.baseline = baseline
        self.label = label
        self._baseline: dict | None = None
        self._metrics: dict[str, float] = {}
        self._test_follows = False
        self._trained = False  # whether this fit ran training steps (a fit resumed at its end runs none)
        self._earlier: dict | None = None  # the results.json of the run this fit resumes

    def expect_test(self) -> None:
        """The command tests the fitted model afterwards (``lit-embed fit`` on task data): the results written when
        training ends are ``untested``, and the test's are ``complete``."""
        self._test_follows = True

    def state_dict(self) -> dict[str, Any]:
        return {"metrics": dict(self._metrics)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._metrics.update(state_dict.get("metrics") or {})

    # -- hooks -----------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                # TensorBoard shows the first HPARAMS session summary of a run; without this, Lightning's
                # placeholder (hp_metric = -1) would be that one and hide the figures written at the end.
                keep_hparams_tab_for_final_figures(logger)
        if self.baseline is not None and self._baseline is None:
            baseline = load_results(self.baseline)
            check_same_backbone({"backbone": _backbone(pl_module), "run_dir": "this run"}, baseline)
            if not baseline.get("parameters") and isinstance(pl_module, EmbeddingModule):
                raise ConfigError(f"baseline {self.baseline} has no parameter counts: pick a lit-embed model's run")
            self._baseline = baseline
        if stage == "fit" and trainer.ckpt_path is not None:
            self._earlier = _earlier_results(Path(trainer.log_dir or trainer.default_root_dir))  # collective

    def on_fit_start(self, trainer, pl_module) -> None:
        self._trained = False
        self._log_parameters(trainer, pl_module)

    def on_train_start(self, trainer, pl_module) -> None:
        self._trained = True

    def on_validation_start(self, trainer, pl_module) -> None:
        if _validating_alone(trainer):
            self._log_parameters(trainer, pl_module)

    def on_test_start(self, trainer, pl_module) -> None:
        self._log_parameters(trainer, pl_module)

    def on_predict_start(self, trainer, pl_module) -> None:
        self._log_parameters(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._finish(trainer, pl_module, self._end_of_training())

    def on_validation_end(self, trainer, pl_module) -> None:
        if _validating_alone(trainer):
            self._finish(trainer, pl_module)
        elif trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._metrics.update(_final_metrics(trainer))  # saved with the checkpoints of this step

    def on_fit_end(self, trainer, pl_module) -> None:
        if not self._trained:  # resumed at the end of its training (stopped as it ended): it ends now
            self._finish(trainer, pl_module, self._end_of_training())

    def on_test_end(self, trainer, pl_module) -> None:
        self._finish(trainer, pl_module)

    def on_predict_end(self, trainer, pl_module) -> None:
        self._finish(trainer, pl_module)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException):  # a signal stopped the run between two steps
            self._finish(trainer, pl_module, status="interrupted")
        elif isinstance(exception, DivergedError):  # every rank raised it (lit_embed.callbacks.RunGuard)
            self._finish(trainer, pl_module, status=DIVERGED, detail=exception.what)
        elif isinstance(exception, (KeyboardInterrupt, Interrupted)) and trainer.is_global_zero:
            _mark_stopped(run_folder(trainer))  # outside a loop (as the fit ended): no collective is safe here

    def _end_of_training(self) -> str:
        return "untested" if self._test_follows else COMPLETE

    # -- figures ---------------------------------------------------------------------------------
    def parameters(self, pl_module: pl.LightningModule) -> dict | None:
        """:func:`~lit_embed.measures.accounting.parameter_report` against the baseline run or the dense baseline."""
        if not isinstance(pl_module, EmbeddingModule):
            return None
        baseline = None
        if self._baseline is not None:
            counts = self._baseline["parameters"]
            baseline = {key: counts[key] for key in ("total_params", "embedding_params", "embedding_bytes") if key in counts}
        report = parameter_report(pl_module, baseline)
        report["baseline"] = self.baseline or "dense"
        return report

    def _log_parameters(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        figures = _parameter_figures(self.parameters(pl_module))
        for logger in trainer.loggers:
            logger.log_metrics(figures, step=trainer.global_step)

    def _finish(self, trainer: pl.Trainer, pl_module: pl.LightningModule, status: str = COMPLETE,
                detail: str | None = None) -> None:
        monitor = next((c for c in trainer.callbacks if isinstance(c, EfficiencyMonitor)), None)
        efficiency = monitor.summary(trainer) if monitor is not None else None  # collective: every rank
        run_dir = Path(trainer.log_dir or trainer.default_root_dir)  # collective too
        if not trainer.is_global_zero:
            return
        self._metrics.update(_final_metrics(trainer))
        results = self.results(trainer, pl_module, run_dir, _carried(efficiency, self._earlier), status, detail)
        write_json_atomic(run_dir / RESULTS_FILE, results)
        self._publish(trainer, results)

    def results(self, trainer: pl.Trainer, pl_module: pl.LightningModule, run_dir: Path, efficiency: dict | None,
                status: str = COMPLETE, detail: str | None = None) -> dict:
        hparams = dict(pl_module.hparams)
        embedding = pl_module.embedding if isinstance(pl_module, EmbeddingModule) else None
        data = dict(trainer.datamodule.hparams) if trainer.datamodule is not None else {}
        if hparams.get("task") is None:
            hparams["task"] = data.get("task")  # task data modules may hold it instead
        if isinstance(hparams["task"], dict):  # a config's own task: the name it is registered under
            hparams["task"] = hparams["task"]["name"]
        scores = _task_scores(pl_module)
        return {
            "format": RESULTS_FORMAT,
            "status": status,
            "detail": detail,  # why a run did not complete (what diverged, and where)
            "command": str(trainer.state.fn.value),  # fit, validate, test or predict: report reads the first three
            "label": self.label or _default_label(trainer, pl_module),
            "task": None if hparams.get("task") is None else str(hparams["task"]),
            "seed": _seed(hparams),
            "paper": data.get("paper"),  # whose protocol, so the report shows each task's metric as that paper does
            "model": f"{type(pl_module).__module__}.{type(pl_module).__qualname__}",
            "strategy": None if embedding is None else type(embedding).__name__,
            "backbone": _backbone(pl_module),
            "parameters": self.parameters(pl_module),
            "efficiency": efficiency,
            "metrics": dict(sorted(self._metrics.items())),
            "scores": scores,
            "baseline": self._comparison(efficiency, scores),
            "global_step": trainer.global_step,
            "checkpoint": _best_checkpoint(trainer, run_dir),
            "checkpoints_taken": checkpoints_taken(),  # which the command started from (--ckpt_path, a run folder)
            "config": _config(trainer, pl_module, run_dir),
            "versions": versions(),
            "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }

    def _comparison(self, efficiency: dict | None, scores: list[str]) -> dict | None:
        """PRR of every evaluation score and the speed-ups, against the baseline run."""
        if self._baseline is None:
            return None
        theirs = self._baseline.get("metrics", {})
        prr = {name: performance_retention(value, theirs[name]) for name, value in self._metrics.items()
               if is_score(name, scores) and name in theirs}
        speed = {}
        base_efficiency = self._baseline.get("efficiency") or {}
        for kind in EfficiencyMonitor.KINDS:
            mine = ((efficiency or {}).get(kind) or {}).get("ms_per_sample")
            base = (base_efficiency.get(kind) or {}).get("ms_per_sample")
            speed[kind] = speed_up(mine, base) if mine and base else None
        loads = [load_per_core((efficiency or {}).get("load")), load_per_core(base_efficiency.get("load"))]
        return {"run_dir": self.baseline, "label": self._baseline.get("label"), "prr": prr, "speed_up": speed,
                "load_per_core": loads, "loads_differ": loads_differ(*loads)}

    # -- loggers ---------------------------------------------------------------------------------
    def _publish(self, trainer: pl.Trainer, results: dict) -> None:
        ending = _end_figures(results)
        figures = {**_parameter_figures(results["parameters"]), **ending}
        for logger in trainer.loggers:
            logger.log_metrics(ending, step=trainer.global_step)
            if isinstance(logger, TensorBoardLogger):
                _write_hparams_tab(logger, _run_hparams(results), {**figures, **results["metrics"]})
            else:
                logger.log_hyperparams(figures)


def _validating_alone(trainer: pl.Trainer) -> bool:
    """A ``validate`` run (not the validation inside ``fit``, nor its sanity check)."""
    return trainer.state.fn == "validate" and not trainer.sanity_checking


def _parameter_figures(parameters: dict | None) -> dict[str, float]:
    if not parameters:
        return {}
    return {
        "params/total": parameters["total_params"],
        "params/embedding": parameters["embedding_params"],
        "params/baseline_total": parameters["baseline_total_params"],
        "params/baseline_embedding": parameters["baseline_embedding_params"],
        "bytes/embedding": parameters["embedding_bytes"],
        "compression/pcr_all": parameters["pcr_all"],
        "compression/pcr_emb": parameters["pcr_emb"],
        "compression/poep": parameters["poep"],
    }


def _end_figures(results: dict) -> dict[str, float]:
    figures: dict[str, Any] = {}
    efficiency = results.get("efficiency") or {}
    for kind in EfficiencyMonitor.KINDS:
        figures[f"efficiency/{kind}_ms_per_sample"] = (efficiency.get(kind) or {}).get("ms_per_sample")
        figures[f"efficiency/{kind}_tokens_per_s"] = (efficiency.get(kind) or {}).get("tokens_per_s")
    figures["efficiency/mfu"] = (efficiency.get("train") or {}).get("mfu")
    figures["efficiency/peak_memory_mb"] = efficiency.get("peak_memory_mb")
    comparison = results.get("baseline") or {}
    for kind, value in (comparison.get("speed_up") or {}).items():
        figures[f"speedup/{kind}"] = value
    for name, value in (comparison.get("prr") or {}).items():
        figures[f"prr/{name}"] = value
    return {name: float(value) for name, value in figures.items() if value is not None}


def _mark_stopped(run_dir: Path) -> None:
    """Mark the complete results a signal cut the command short after as ``interrupted`` (``--ckpt_path last`` then
    finishes the run: a fit resumed at its end completes it in :meth:`ResultsWriter.on_fit_end`)."""
    results = _earlier_results(run_dir)
    if results is not None and results.get("status") == COMPLETE:
        results.pop("run_dir")
        write_json_atomic(run_dir / RESULTS_FILE, {**results, "status": "interrupted"})


def _earlier_results(run_dir: Path) -> dict | None:
    """The results a run folder holds (those of the run a fit resumes), if it holds readable ones."""
    if not (run_dir / RESULTS_FILE).is_file():
        return None
    try:
        return load_results(run_dir)
    except UserError:
        return None


def _carried(efficiency: dict | None, earlier: dict | None) -> dict | None:
    """This process's timings, with those of the resumed run for each kind it measured none of (a fit resumed at its
    end trains no step: its training time per sample is the one measured before)."""
    before = (earlier or {}).get("efficiency")
    if efficiency is None or not isinstance(before, dict):
        return efficiency
    carried = dict(efficiency)
    for kind in EfficiencyMonitor.KINDS:
        if not (efficiency.get(kind) or {}).get("samples") and isinstance(before.get(kind), dict):
            carried[kind] = before[kind]
    return carried


def _task_scores(pl_module: pl.LightningModule) -> list[str]:
    """The higher-is-better metrics of the module's task (a config's own task may name any), for PRR and report."""
    task = pl_module.task if provides(pl_module, TaskModel) else None
    return [] if task is None else [metric for metric in task.metrics if higher_is_better(metric)]


def _final_metrics(trainer: pl.Trainer) -> dict[str, float]:
    metrics = {}
    for name, value in trainer.callback_metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            metrics[name] = float(value)
        elif isinstance(value, (int, float)):
            metrics[name] = float(value)
    return metrics


def _seed(hparams: dict) -> int | None:
    seed = hparams.get("seed", os.environ.get("PL_GLOBAL_SEED"))
    return None if seed is None else int(seed)


def _default_label(trainer: pl.Trainer, pl_module: pl.LightningModule) -> str:
    for logger in trainer.loggers:
        name = logger.name
        if isinstance(name, str) and name and name != _DEFAULT_LOGGER_NAME:
            return name
    folder = run_folder(trainer)
    if folder.name.startswith("version_") and folder.parent.name:
        return folder.parent.name  # the experiment folder (runs/demo/version_0: demo)
    if not isinstance(pl_module, EmbeddingModule):
        return type(pl_module).__name__
    embedding = pl_module.embedding
    details = embedding.extra_repr()
    return f"{type(embedding).__name__}({details})" if details else type(embedding).__name__


def _backbone(pl_module: pl.LightningModule) -> dict | None:
    return pl_module.encoder.shape() if isinstance(pl_module, EmbeddingModule) else None


def _best_checkpoint(trainer: pl.Trainer, run_dir: Path) -> dict | None:
    """The checkpoint callback's best checkpoint (the one ``fit`` tests; relative to the run folder) and its
    score: a sweep chooses among runs by it, and starts later stages from it."""
    callback = trainer.checkpoint_callback
    if callback is None or not getattr(callback, "best_model_path", ""):
        return None
    best = Path(callback.best_model_path).absolute()
    if run_dir.absolute() in best.parents:
        best = best.relative_to(run_dir.absolute())
    score = callback.best_model_score
    return {"monitor": callback.monitor, "mode": callback.mode, "best": str(best),
            "best_score": None if score is None else float(score)}


def _config(trainer: pl.Trainer, pl_module: pl.LightningModule, run_dir: Path) -> dict:
    """The CLI's saved config when there is one (``config.yaml`` in the run folder), else the hparams."""
    saved = run_dir / "config.yaml"
    if saved.is_file():
        return yaml.safe_load(saved.read_text())
    datamodule = trainer.datamodule
    return {"model": dict(pl_module.hparams), "data": dict(datamodule.hparams) if datamodule is not None else None}


def _run_hparams(results: dict) -> dict[str, Any]:
    """Flat, TensorBoard-safe hyper-parameters of a run: who it is and the model's config."""
    run = {"label": results["label"], "task": results["task"] or "", "seed": results["seed"] if results["seed"] is not None else -1,
           "strategy": results["strategy"] or ""}
    model = (results.get("config") or {}).get("model") or {}
    return {**run, **_flatten(model, "model")}


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, prefix if key == "init_args" else f"{prefix}/{key}"))
        return flat
    if isinstance(value, (bool, int, float, str)):
        return {prefix: value}
    return {prefix: str(value)}


def _write_hparams_tab(logger: TensorBoardLogger, params: dict[str, Any], metrics: dict[str, float]) -> None:
    """TensorBoard's HPARAMS tab: the run's hyper-parameters beside its figures and final metrics.

    The metrics are scalar tags already logged; only the tab's session summary is written here (what
    ``SummaryWriter.add_hparams`` does, without writing each value again as a new scalar).
    """
    from torch.utils.tensorboard.summary import hparams

    experiment, start, end = hparams(params, metrics)
    writer = tensorboard_file_writer(logger)
    with writing(logger.log_dir):  # TensorBoard's event file, appended to
        for summary in (experiment, start, end):
            writer.add_summary(summary)
        writer.flush()
