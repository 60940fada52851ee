"""lit-embed checkpoints: the one place that reads them, and what they record about their model.

Every command that takes a checkpoint (``--ckpt_path``, ``model.init_args.checkpoint``, ``compress --ckpt``,
``analyze --ckpt``, ``export --ckpt``) reads it with :func:`read_checkpoint`: ``torch.load(weights_only=True)``
with no classes allowed beyond tensors and plain data, so a crafted file cannot run code when it is loaded (a
pickle can name any function to call). What lit-embed writes is plain data already: a Lightning
checkpoint made by ``lit-embed fit`` records its hyper-parameters as the parsed config (class paths
and init args). What it records is then read as :mod:`lit_embed.checkpoints.recorded` reads every recorded config: no
trust-granting key, no class from outside lit-embed, Lightning and the installed plugins. A file that needs
anything else is refused, naming the type; a checkpoint you trust can be rewritten as plain data once,
knowingly::

    lit-embed convert --trust IN.ckpt OUT.ckpt
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from jsonargparse import ArgumentParser

from lit_embed._compat import instantiate
from lit_embed.checkpoints.recorded import checked_class, recorded_config, without_trust
from lit_embed.embeddings import EmbeddingStrategy
from lit_embed.embeddings.state import fixed_shapes
from lit_embed.errors import CheckpointError, ConfigError, MissingFileError, did_you_mean
from lit_embed.runs.folders import start_checkpoint
from lit_embed.runs.results import versions
from lit_embed.storage.files import atomic_writer, check_file_output
from lit_embed.storage.plain_data import load_plain, plain

#: Key of the facts a checkpoint records about its strategy, vocabulary, tokenizer and run.
FACTS = "lit_embed"
#: Model arguments that change how a model trains, not what it is: a checkpoint may differ from the
#: config in these (resuming restores the checkpoint's), but not in anything else.
TRAINING_ARGUMENTS = frozenset({
    "optim", "checkpoint", "seed", "trained_tokenizer", "dropout", "attention_dropout", "classifier_dropout",
    "mask_prob", "prob", "init_range", "baseline_vocab_size", "baseline_encoder",
})
#: Where a config-defined task reads its data and what it logs: the same model may predict on other data.
TASK_DATA = frozenset({"files", "hub", "config", "revision", "splits", "metrics", "label_column", "value_range"})


def read_checkpoint(path: str | os.PathLike, what: str = "checkpoint") -> dict[str, Any]:
    """The checkpoint at ``path`` as tensors and plain data; a clear :class:`CheckpointError` otherwise.

    Nothing in the file is executed: it is unpickled with ``weights_only=True``, and the configs it records (its
    model's and data's hyper-parameters, lit-embed's facts) come back as :func:`~lit_embed.checkpoints.recorded.recorded_config`
    reads them. A missing, empty, truncated or foreign file, one holding Python objects, one without a ``state_dict``
    and one whose weights hold NaN or infinity are refused, naming the file (and tensor) and what to do.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise MissingFileError(f"{what} {str(path)!r} does not exist{did_you_mean(path)}: check the path")
    if path.is_dir():
        raise CheckpointError(f"{what} {str(path)!r} is a folder: give the .ckpt file (e.g. {path}/checkpoints/last.ckpt)")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{what} {str(path)!r} is empty (0 bytes): it was never written whole; use another checkpoint")
    checkpoint = load_plain(path, what)
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise CheckpointError(
            f"{what} {str(path)!r} holds no state_dict: give a checkpoint written by `lit-embed fit` or `lit-embed compress`"
        )
    check_finite(checkpoint["state_dict"], f"{what} {str(path)!r}")
    return _as_recorded(checkpoint, f"{what} {str(path)!r}")


def check_finite(state: dict[str, Any], where: str) -> None:
    """Refuse weights holding NaN or infinity, naming the first such tensor: no model, evaluation or compression made
    from them means anything (a run's own saves never hold them: :class:`~lit_embed.callbacks.RunGuard` stops first)."""
    for key, value in state.items():
        if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()):
            bad = int((~torch.isfinite(value)).sum())
            if bad:
                kinds = "NaN" if bool(torch.isnan(value).any()) else "infinite"
                raise CheckpointError(f"{where} holds non-finite weights: {key} has {bad} {kinds} value(s) of "
                                      f"{value.numel()}: it gives no usable model; take an earlier checkpoint of its run")


def _as_recorded(checkpoint: dict, where: str) -> dict:
    """``checkpoint`` with what it records about its model and data read as recorded configs: Lightning's
    hyper-parameters (``{"_class_path": ..., **init_args}``, its other ``_`` keys dropped: lit-embed builds no
    ``_instantiator``) and lit-embed's facts."""
    out = dict(checkpoint)
    for name, key in (("hyper_parameters", "model"), ("datamodule_hyper_parameters", "data")):
        hparams = out.get(name)
        if not isinstance(hparams, dict):
            continue
        init = {k: v for k, v in hparams.items() if not k.startswith("_")}
        if "_class_path" not in hparams:  # saved from Python: nothing rebuilds from these
            out[name] = without_trust(init)
            continue
        config = recorded_config({"class_path": hparams["_class_path"], "init_args": init}, where, key)
        out[name] = {"_class_path": config["class_path"], **config["init_args"]}
    facts = out.get(FACTS)
    if isinstance(facts, dict):
        facts = dict(facts)
        if facts.get("model") is not None:
            facts["model"] = recorded_config(facts["model"], where, "model")
        if facts.get("strategy") is not None:
            checked_class(facts["strategy"], "model.init_args.embedding.class_path", where)
        out[FACTS] = facts
    return out


#: Bumped when what :func:`describe` records changes (1: strategy, sizes, tokenizer and run only).
FACTS_FORMAT = 2


def describe(module, tokenizer: str | None, run_dir: os.PathLike | None) -> dict[str, Any]:
    """The facts a checkpoint records beside its weights: the config that rebuilds its model (stable class
    paths, the encoder's and strategy's arguments), the tokenizer its weights expect, the run it belongs to,
    and the versions that wrote it. Every lit-embed checkpoint carries them, however it was made."""
    strategy = module.embedding
    return {
        "format": FACTS_FORMAT,
        "model": module.model_config(),
        "strategy": strategy.config()["class_path"],
        "vocab_size": strategy.vocab_size,
        "hidden_size": strategy.hidden_size,
        "tokenizer": tokenizer,
        "run_dir": None if run_dir is None else str(run_dir),
        "versions": versions(),
    }


def recorded_model(checkpoint: dict) -> dict | None:
    """The model config a checkpoint records, ``{"class_path", "init_args"}`` (``None`` if it records none):
    its facts' (every checkpoint since format 2), else what ``lit-embed fit`` recorded as hyper-parameters."""
    model = (checkpoint.get(FACTS) or {}).get("model")
    if model is not None:
        return model
    hparams = dict(checkpoint.get("hyper_parameters") or {})
    if "_class_path" not in hparams:
        return None
    return {"class_path": hparams["_class_path"],
            "init_args": {k: v for k, v in hparams.items() if not k.startswith("_")}}


def recorded_tokenizer(checkpoint: dict) -> str | None:
    """The tokenizer the checkpoint's weights were trained with (its facts, else its data's hyper-parameters)."""
    return ((checkpoint.get(FACTS) or {}).get("tokenizer")
            or (checkpoint.get("datamodule_hyper_parameters") or {}).get("tokenizer"))


def recorded_run(checkpoint: dict) -> str | None:
    """The run folder that wrote the checkpoint, where it recorded one."""
    return (checkpoint.get(FACTS) or {}).get("run_dir")


def model_differences(recorded: dict, configured: dict) -> list[str]:
    """What makes two model configs different models: ``key: checkpoint X, config Y`` lines.

    Training arguments (:data:`TRAINING_ARGUMENTS`), a defined task's data (:data:`TASK_DATA`) and arguments one
    side leaves unset are not differences; class paths are compared as the classes they name.
    """
    mine, theirs = _flatten(recorded, "model"), _flatten(configured, "model")
    lines = []
    for key in sorted(set(mine) | set(theirs)):
        a, b = mine.get(key), theirs.get(key)
        if a is None or b is None or _same(key, a, b):
            continue
        lines.append(f"{key}: checkpoint {a!r}, config {b!r}")
    return lines


@dataclass(frozen=True)
class ModelCheck:
    """A checkpoint's recorded model held against the requested one (:func:`check_model`)."""

    #: The model config the checkpoint records (``None``: it records none, and nothing was compared).
    recorded: dict | None
    #: What makes them different models, one ``key: checkpoint X, config Y`` line each.
    differences: list[str]
    #: The init args the request leaves unset, as the checkpoint records them.
    filled: dict

    def listed(self, most: int = 6) -> str:
        """The differences in one line (the first ``most``, and how many more)."""
        extra = len(self.differences) - most
        return "; ".join(self.differences[:most]) + (f"; and {extra} more" if extra > 0 else "")


def check_model(checkpoint: dict, requested: dict, keys: Collection[str] | None = None,
                tokenizer: str | None = None) -> ModelCheck:
    """The one check of a checkpoint against the model a command is asked to build: ``--ckpt_path``, the start
    checkpoint of a fine-tuning (``model.init_args.checkpoint``), compress, export and analyze all come here.

    ``requested`` is a model config (``{"class_path", "init_args"}``; either may be missing), ``keys`` the init args
    compared and filled (default all), ``tokenizer`` the one the request's data reads (a checkpoint trained with another
    is a different model). What the checkpoint records comes through :func:`read_checkpoint`, as
    :mod:`lit_embed.checkpoints.recorded` reads it.
    """
    recorded = recorded_model(checkpoint)
    if recorded is None:
        return ModelCheck(None, [], {})
    theirs, mine = dict(recorded["init_args"]), dict(requested.get("init_args") or {})
    if keys is not None:
        theirs, mine = {k: theirs.get(k) for k in keys}, {k: mine.get(k) for k in keys}
    differences = model_differences({**recorded, "init_args": theirs}, {**requested, "init_args": mine})
    trained = recorded_tokenizer(checkpoint)
    if trained and tokenizer and tokenizer != trained:
        differences.append(f"data tokenizer: checkpoint {trained!r}, config {tokenizer!r}")
    filled = {k: v for k, v in theirs.items() if v is not None and mine.get(k) is None}
    return ModelCheck(recorded, differences, filled)


def build_from_config(base: type, config: dict, key: str):
    """Instantiate a ``{"class_path", "init_args"}`` config of a subclass of ``base`` as jsonargparse does."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(base, key, required=True)
    try:
        parsed = parser.parse_object({key: config})
    except Exception as error:  # jsonargparse's ArgumentError: a config that does not fit the class
        raise ConfigError(f"the {key} config does not build ({error}): check {config.get('class_path')}") from error
    return instantiate(parser, parsed)[key]


def strategy_factory(config: dict):
    """The strategy ``config`` (``{"class_path", "init_args"}``) describes, as a factory of the two sizes the
    model gives (a model's ``embedding`` argument)."""

    def build(vocab_size: int | None, hidden_size: int):
        sized = {"class_path": config["class_path"],
                 "init_args": {**config.get("init_args", {}), "vocab_size": vocab_size, "hidden_size": hidden_size}}
        return build_from_config(EmbeddingStrategy, sized, "embedding")

    return build


def load_model(name: str | os.PathLike, what: str = "checkpoint", config: dict | None = None,
               fix: str = "give the config it was trained with"):
    """The LightningModule a ``lit-embed fit`` checkpoint records, with its weights, and the checkpoint.

    ``name`` is a file, a run folder or an experiment folder (:func:`~lit_embed.runs.folders.start_checkpoint`).
    The module is built from ``config`` where given (``{"class_path", "init_args"}``), else from the model config
    the checkpoint records; a checkpoint that records none (saved from Python) is refused with ``fix``. Every
    consumer that rebuilds a model from its checkpoint (analyze, export, compress) comes here.
    """
    path = start_checkpoint(name, what)
    checkpoint = read_checkpoint(path, what)
    if config is not None:  # the given config: the model the checkpoint records, or it does not fit
        check = check_model(checkpoint, config)
        if check.differences:
            raise CheckpointError(f"{what} {str(path)!r} records another model than the config given "
                                  f"({check.listed()}): {fix}")
    config = config or recorded_model(checkpoint)
    if config is None:
        raise CheckpointError(f"{what} {str(path)!r} does not record its model config (it was not written by "
                              f"`lit-embed fit`): {fix}")
    module = build_from_config(pl.LightningModule, config, "model")
    details = state_differences(module.state_dict(), checkpoint["state_dict"], sized=fixed_shapes(module))
    if details:
        raise CheckpointError(f"{what} {str(path)!r} does not fit the model it records or is given ({details}): {fix}")
    module.load_state_dict(checkpoint["state_dict"])
    return module, checkpoint


def write_checkpoint(path: str | os.PathLike, module, model: dict, tokenizer: str | None, data: dict | None = None) -> None:
    """Write ``module`` as a checkpoint that ``--ckpt_path``, ``checkpoint:`` and :func:`load_model` read like one
    ``lit-embed fit`` wrote (Lightning's layout, its hyper-parameters and lit-embed's facts), atomically.

    ``model`` is the config that rebuilds it, ``data`` that of its data (``{"class_path", "init_args"}``, or None).
    For models made outside a fit: ``lit-embed compress``'s output.
    """
    instantiator = "pytorch_lightning.cli.instantiate_module"
    checkpoint = {
        "pytorch-lightning_version": pl.__version__,
        "epoch": 0,
        "global_step": 0,
        "state_dict": {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()},
        "hparams_name": "kwargs",
        "hyper_parameters": {"_class_path": model["class_path"], "_instantiator": instantiator, **model["init_args"]},
        FACTS: {**describe(module, tokenizer, run_dir=None), "model": model},
    }
    if data is not None:
        checkpoint["datamodule_hparams_name"] = "kwargs"
        checkpoint["datamodule_hyper_parameters"] = {"_class_path": data["class_path"], "_instantiator": instantiator,
                                                     **data["init_args"]}
    with atomic_writer(path) as handle:
        torch.save(checkpoint, handle)


def state_differences(expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor],
                      sized: set[str] | None = None) -> str:
    """How a state dict ``found`` fails to fit a model's ``expected`` one (``""`` when it fits).

    Shapes are compared for the keys in ``sized`` (default all): what takes its size from the checkpoint
    (a fitted LSH vocabulary, a grown vocabulary's codes, tables sized by codes) is left out by the caller
    (:func:`~lit_embed.embeddings.state.fixed_shapes`).
    """
    wrong = [f"{k} {tuple(found[k].shape)} vs {tuple(v.shape)}" for k, v in expected.items()
             if k in found and (sized is None or k in sized) and found[k].shape != v.shape]
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    return "; ".join(filter(None, [
        f"shapes differ (checkpoint vs model): {wrong[:3]}" if wrong else "",
        f"missing: {missing[:3]}" + (f" and {len(missing) - 3} more" if len(missing) > 3 else "") if missing else "",
        f"unexpected: {extra[:3]}" + (f" and {len(extra) - 3} more" if len(extra) > 3 else "") if extra else "",
    ]))


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            if key in TRAINING_ARGUMENTS or (prefix.endswith(".task") and key in TASK_DATA):
                continue
            flat.update(_flatten(item, prefix if key == "init_args" else f"{prefix}.{key}"))
        return flat
    if isinstance(value, (list, tuple)):
        return {prefix: json.dumps(value, default=str)}
    return {prefix: value}


def _same(key: str, a: Any, b: Any) -> bool:
    if a == b:
        return True
    if key.endswith("class_path") and isinstance(a, str) and isinstance(b, str):
        return resolve_class(a) is not None and resolve_class(a) is resolve_class(b)
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and float(a) == float(b)


def resolve_class(class_path: str):
    """The class a class path names (``None`` where it cannot be imported)."""
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


# -- the one-off conversion of a trusted checkpoint --------------------------------------------------------


def convert(source: str, target: str, overwrite: bool = False) -> None:
    """Load ``source`` trusting it (this runs whatever code it holds) and write it as plain data to ``target``: never
    over ``source`` itself, nor over a file that exists unless ``overwrite``."""
    path = Path(source).expanduser()
    if not path.is_file():
        raise MissingFileError(f"IN {source!r} {'is a folder' if path.is_dir() else 'does not exist'}: give a checkpoint file")
    check_file_output(target, overwrite, [source])
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # a file torch cannot read, or one whose unpickling (trusted) fails: its own code's error
        raise CheckpointError(f"IN {source!r} is not a readable checkpoint ({type(error).__name__}: {error})") from None
    with atomic_writer(target) as handle:
        torch.save(plain(checkpoint), handle)
    load_plain(target, "converted checkpoint")  # plain data now (what it names is checked when a command reads it)

