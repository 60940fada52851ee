"""Every use of a private API of Lightning, datasets, transformers or jsonargparse, in one place.

Each function says what it reaches into and why no public way exists; when a library changes, this is
the file to fix. (Four method overrides live beside their classes: ``LitEmbedCLI._parse_ckpt_path``,
LightningCLI's hook that reads ``--ckpt_path`` and applies the model it records unchecked, turned off: the command
reads and checks the file once, in ``parse_arguments``; ``RunLogger._get_next_version``, TensorBoardLogger's hook
that picks a new version; ``EpochProgressBar._get_train_description``, the rich progress bar's title; and
``_Built._run_subcommand``, LightningCLI's hook that runs the subcommand once the run is built, deferred so that
``assemble`` returns the run built: ``Assembled.run`` calls LightningCLI's own.)
"""

from __future__ import annotations

import os


def built_by_cli() -> bool:
    """Whether the LightningModule being built is built by LightningCLI, which records its parsed config as
    the hyper-parameters (Lightning's ``_given_hyperparameters`` context; no public flag says so)."""
    from pytorch_lightning.core.mixins.hparams_mixin import _given_hyperparameters

    return _given_hyperparameters.get() is not None


def no_weight_initialisation():
    """A context in which torch's and transformers' weight initialisers do nothing (what ``from_pretrained`` builds
    under, its weights about to be loaded): transformers' ``no_init_weights``, undocumented, in
    ``transformers.initialization`` from version 5 and in ``transformers.modeling_utils`` before."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4
        from transformers.modeling_utils import no_init_weights  # type: ignore[attr-defined,no-redef]
    return no_init_weights()


def keep_hparams_tab_for_final_figures(logger) -> None:
    """TensorBoard shows the first HPARAMS session summary of a run; Lightning writes a placeholder one
    (``hp_metric = -1``) unless its private ``_default_hp_metric`` is off, which would hide the figures
    :class:`~lit_embed.callbacks.ResultsWriter` writes at the end (the constructor flag is the user's)."""
    logger._default_hp_metric = False


def tensorboard_file_writer(logger):
    """The event-file writer of a TensorBoardLogger's ``SummaryWriter``, to write an HPARAMS session summary
    without ``add_hparams`` writing each value again as a new scalar (``_get_file_writer`` is private)."""
    return logger.experiment._get_file_writer()


def request_stop(trainer) -> None:
    """Ask Lightning's loops to stop after the step in progress, as they do on SIGTERM: they read the signal
    connector's ``received_sigterm`` flag (there is no public request)."""
    trainer._signal_connector.received_sigterm = True


def set_save_dir(logger, folder: str | os.PathLike) -> None:
    """Move a TensorBoardLogger's ``save_dir`` before its first use (it is a read-only property over
    ``_root_dir``)."""
    logger._root_dir = os.fspath(folder)


def dataset_fingerprint(dataset) -> str:
    """``datasets``' fingerprint of a dataset: the cache key of what it was built from (``_fingerprint``),
    which keys our own maps' caches."""
    return dataset._fingerprint


def auto_model_class(config):
    """The class ``AutoModel`` would build for ``config`` (its private ``_model_mapping``), to ask whether it
    takes ``add_pooling_layer`` before building it."""
    import transformers

    return transformers.AutoModel._model_mapping[type(config)]


def instantiate(parser, config):
    """jsonargparse's ``parser.instantiate`` (>= 4.49), or its older name ``instantiate_classes``."""
    method = parser.instantiate if hasattr(parser, "instantiate") else parser.instantiate_classes
    return method(config)


def format_summary_table(*args, **kwargs) -> str:
    """Lightning's plain-text model summary table (its private ``_format_summary_table``), which
    :class:`~lit_embed.callbacks.console.LayerSummary` prints without the FLOPs column where none were counted."""
    from pytorch_lightning.utilities.model_summary.model_summary import _format_summary_table

    return _format_summary_table(*args, **kwargs)


def go_offline() -> None:
    """Switch huggingface_hub, transformers and datasets to offline mode in this process, as ``HF_HUB_OFFLINE=1``
    does at start-up: they read it once, into module constants, at import (no public switch later)."""
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"  # DDP ranks and worker processes
    import sys

    if "datasets" in sys.modules:
        import datasets.config

        datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True


def attached_trainer(module):
    """The trainer a LightningModule is attached to, or ``None``: ``module.trainer`` raises where there is none, and
    a module is built, counted and exported outside a trainer too (``_trainer`` is Lightning's private slot)."""
    return module._trainer


def validate_again_on_resume(trainer) -> None:
    """A fit stopped during validation (a signal between two of its batches): make the checkpoint saved now run that
    validation again, from its first batch, when it resumes. Lightning goes back into an interrupted validation only
    when a batch was started and not finished (its loop's "restarted mid evaluation"); a stop between batches would
    skip the rest, so the metrics and the checkpoint selection of that validation would be lost. Its progress is set
    back to "the first batch was started", which Lightning resumes from the start (fresh metric states)."""
    progress = trainer.fit_loop.epoch_loop.val_loop.batch_progress
    before = progress.total.completed - progress.current.completed  # the batches of earlier validations
    progress.current.ready = progress.current.started = 1
    progress.current.processed = progress.current.completed = 0
    progress.total.ready = progress.total.started = before + 1
    progress.total.processed = progress.total.completed = before


def subcommand_parser(cli, subcommand: str | None):
    """The parser of a LightningCLI subcommand (``fit``...), to dump its config (LightningCLI's ``_parser``)."""
    return cli._parser(subcommand)


def writes_logs_this_step(trainer) -> bool:
    """Whether the training step about to run is one whose logged values the loggers write (every
    ``log_every_n_steps``): a metric that costs a pass over the vocabulary is computed on those steps only. Lightning
    decides it in its private logger connector (``should_update_logs``; under ``fast_dev_run`` every step is
    written); no trainer: every step."""
    return trainer is None or bool(trainer.fast_dev_run) or trainer._logger_connector.should_update_logs


def hub_client_errors() -> tuple[type[Exception], ...]:
    """What huggingface_hub's HTTP client raises for a request that failed (no connection, a refusal): its
    ``HfHubHTTPError`` is an ``OSError``, but a transport's errors are the HTTP library's own (httpx's, whose name
    changed across versions; requests' are ``OSError``), which ``huggingface_hub.errors`` imports as ``HTTPError``."""
    from huggingface_hub import errors

    return (OSError, getattr(errors, "HTTPError", OSError))
