"""What ``lit-embed compress`` reads (a lit-embed checkpoint or a HuggingFace model) and writes.

The output folder is built beside its final place and renamed into it, so it is complete or absent.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import yaml
from torch import Tensor, nn

from lit_embed.checkpoints.format import (
    build_from_config,
    check_finite,
    load_model,
    recorded_tokenizer,
    write_checkpoint,
)
from lit_embed.checkpoints.recorded import WRITTEN_HEADER, name_user_classes, recorded_config, without_trust
from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.embeddings.dense import DenseEmbedding
from lit_embed.errors import ConfigError, MissingFileError, OutputExistsError
from lit_embed.hub import load_tokenizer, loading_pretrained, resolve_pretrained
from lit_embed.models import Encoder, SequenceClassifier
from lit_embed.models.base import EmbeddingModule
from lit_embed.models.mlm import MaskedLM
from lit_embed.runs.folders import start_checkpoint
from lit_embed.storage.files import write_atomic

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".ot", ".ckpt")
COMPACT_FILE = "compressed_embedding.safetensors"
TIED_EXPLANATION = (
    "its output layer is tied to the input embedding. Sparse coding rebuilds rare rows only when they are "
    "looked up; a tied output layer scores every token against the whole table, so it would score rare tokens "
    "with rebuilt vectors it was never trained on, and the table could not shrink (the paper's Limitations: "
    "the method applies to models without weight tying)"
)


@dataclass
class Source:
    """The model to compress.

    Attributes:
        name: what the user gave (a checkpoint path, or a HuggingFace name or folder).
        weight: its dense ``V x d`` input embedding.
        tokenizer: the tokenizer whose ids index ``weight``.
        module: the lit-embed model (``None`` for a HuggingFace model until a task gives it a head).
        model_config: the module's ``{"class_path", "init_args"}``.
        data_config: the data config the checkpoint recorded (its fine-tuning data), if any.
        hf_model: a HuggingFace input as loaded (heads included), written back as a folder.
        hf_folder: the local folder of a HuggingFace input (its other files are copied along).
    """

    name: str
    weight: Tensor
    tokenizer: str
    module: pl.LightningModule | None = None
    model_config: dict | None = None
    data_config: dict | None = None
    hf_model: nn.Module | None = None
    hf_folder: Path | None = None


def load_source(name: str, model_config: dict | None = None, untie: bool = False) -> Source:
    """A lit-embed checkpoint (a file, a run folder or an experiment folder: see
    :func:`~lit_embed.runs.folders.start_checkpoint`) or a HuggingFace model (a folder with ``config.json``, or a hub name)."""
    path = Path(name).expanduser()
    if path.is_file() or (path.is_dir() and not (path / "config.json").is_file()):
        path = start_checkpoint(path)  # which file, and why, goes to the report
    if path.is_file():
        return _load_checkpoint(path, model_config, untie)
    if path.suffix == ".ckpt" or (name.startswith((".", "/", "~")) and not path.exists()):
        raise MissingFileError(f"checkpoint {name!r} does not exist: check the path")
    return _load_huggingface(name, untie)


def _load_checkpoint(path: Path, given: dict | None, untie: bool) -> Source:
    """``given``: the model config of ``--model_config`` (``{"class_path", "init_args"}``), for a checkpoint that records none."""
    name_user_classes(given)  # the checkpoint may name the classes of your own --model_config
    module, raw = load_model(path, config=given, fix="pass --model_config FILE, the config it was trained with")
    if not isinstance(module, EmbeddingModule):
        raise ConfigError(f"checkpoint {str(path)!r} holds a {type(module).__name__}, which has no lit-embed embedding strategy")
    if not isinstance(module.embedding, DenseEmbedding):
        raise ConfigError(
            f"checkpoint {str(path)!r} has a {type(module.embedding).__name__} embedding; compress reads a dense "
            f"vocabulary x hidden table (DenseEmbedding): compress a model fine-tuned with the dense strategy"
        )
    tokenizer = recorded_tokenizer(raw) or module.expected_tokenizer
    if tokenizer is None:
        raise ConfigError(f"checkpoint {str(path)!r} does not record its tokenizer: fine-tune it with `lit-embed fit`, "
                         f"which records it")
    config = module.model_config()
    if isinstance(module, MaskedLM) and module.tie_decoder:
        if not untie:
            raise ConfigError(f"checkpoint {str(path)!r} cannot be compressed as it is: {TIED_EXPLANATION}. "
                             f"Pass --untie to give the output layer its own copy of the table first")
        _untie_module(module)
        config["init_args"]["tie_decoder"] = False
    if "checkpoint" in config["init_args"]:
        config["init_args"]["checkpoint"] = None  # its weights are the ones compressed: the start point is not needed
    data = raw.get("datamodule_hyper_parameters") or None
    return Source(
        name=str(path), weight=module.embedding.weight.detach().clone(), tokenizer=tokenizer, module=module,
        model_config=config, data_config=_as_config(data) if data and "_class_path" in data else None,
    )


def _as_config(hparams: dict) -> dict:
    """Lightning's recorded ``{"_class_path": ..., **init_args}`` as ``{"class_path", "init_args"}``."""
    init = {k: v for k, v in hparams.items() if not k.startswith("_")}
    return {"class_path": hparams["_class_path"], "init_args": json.loads(json.dumps(init, default=_plain))}


def _plain(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return str(value)
    raise TypeError(f"cannot record {value!r} in a config")


def _untie_module(module: nn.Module) -> None:
    """Give a tied MLM decoder its own copy of the dense table."""
    weight = module.embedding.weight.detach().clone()
    module.decoder = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        module.decoder.weight.copy_(weight)
    module.tie_decoder = False


def _load_huggingface(name: str, untie: bool) -> Source:
    import transformers

    where = resolve_pretrained(name)
    with loading_pretrained(name, "model"):
        config = transformers.AutoConfig.from_pretrained(where, trust_remote_code=False)  # a model's own code never runs
        architecture = getattr(transformers, (config.architectures or ["AutoModel"])[0], transformers.AutoModel)
        model = architecture.from_pretrained(where, config=config, trust_remote_code=False)
    check_finite(model.state_dict(), f"model {name!r}")
    table = model.get_input_embeddings()
    if not isinstance(table, nn.Embedding):
        raise ConfigError(f"{name!r} has no input embedding table (nn.Embedding) to compress: give a BERT-like encoder")
    output = model.get_output_embeddings()
    if isinstance(output, nn.Linear) and output.weight is table.weight:
        if not untie:
            raise ConfigError(f"{name!r} cannot be compressed as it is: {TIED_EXPLANATION}. Pass --untie to give "
                             f"the output layer its own copy of the table first")
        output.weight = nn.Parameter(table.weight.detach().clone())
        model.config.tie_word_embeddings = False
    folder = Path(where) if Path(where).is_dir() else None
    return Source(name=name, weight=table.weight.detach().float().clone(), tokenizer=name, hf_model=model, hf_folder=folder)


def classifier_for(source: Source, task: str, seed: int) -> None:
    """Give a HuggingFace source a lit-embed :class:`SequenceClassifier` for ``task`` (a new, seeded head)."""
    vocab = source.weight.shape[0]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        source.module = SequenceClassifier(task, Encoder(pretrained=source.name), vocab_size=vocab, trained_tokenizer=source.tokenizer)
    source.model_config = {
        "class_path": "lit_embed.models.SequenceClassifier",
        "init_args": {
            "task": task, "vocab_size": vocab, "trained_tokenizer": source.tokenizer, "seed": seed,
            "encoder": {"class_path": "lit_embed.models.Encoder", "init_args": {"pretrained": source.name}},
        },
    }


def strategy_config(strategy: EmbeddingStrategy) -> dict:
    """The strategy as a model's config holds it: its public class path and the init args beyond the two sizes."""
    return strategy.config()


# -- writing ---------------------------------------------------------------------------------------------


#: What ``lit-embed compress`` writes into its output folder; a folder holding anything else is not one of its outputs.
OUTPUT_ENTRIES = frozenset({"model.ckpt", "config.yaml", "report.json", "report.md", "hf"})


def check_replaceable(out: Path) -> None:
    """Refuse to replace ``out`` unless it is an earlier ``lit-embed compress`` output and holds nothing else."""
    report = out / "report.json"
    try:
        earlier = report.is_file() and {"source", "method", "vocabulary"} <= set(json.loads(report.read_text()))
    except (OSError, ValueError):
        earlier = False
    if not out.is_dir() or not earlier:
        raise OutputExistsError(
            f"--out {str(out)!r} exists and is not a lit-embed compress output (no report.json of one): --overwrite "
            f"replaces only those; choose another --out"
        )
    foreign = sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir() if p.name not in OUTPUT_ENTRIES)
    if foreign:
        raise OutputExistsError(
            f"--out {str(out)!r} is a compress output that also holds {', '.join(foreign[:5])}, which compress did not "
            f"write (runs of the compressed model?): move them away or choose another --out"
        )


def write_model(folder: Path, source: Source, strategy: EmbeddingStrategy, data_config: dict | None,
                out: Path, trusted: bool = False) -> None:
    """``model.ckpt`` (the compressed lit-embed model) and ``config.yaml`` to validate or test it; those
    runs log beside it, to ``OUT/version_N`` with results.json, as every shipped config does. Neither records
    ``trust_remote_code`` (no recorded file grants it): ``trusted`` (the tokenizer ran its own code) puts the
    flag into the command the header gives."""
    config = json.loads(json.dumps(source.model_config))
    config["init_args"]["embedding"] = strategy_config(strategy)
    data_config = without_trust(data_config)
    # the model as compress rebuilt it: the compressed strategy, an untied decoder, no start point
    write_checkpoint(folder / "model.ckpt", source.module, config, source.tokenizer, data_config)
    document = {"model": config}
    if data_config is not None:
        document["data"] = data_config
    document["trainer"] = {
        "accelerator": "auto",
        "devices": 1,
        "default_root_dir": str(out),  # validate/test runs of the compressed model log beside it
        "callbacks": [{"class_path": "lit_embed.callbacks.EfficiencyMonitor"},
                      {"class_path": "lit_embed.callbacks.ResultsWriter"}],
    }
    trust = " --data.init_args.trust_remote_code true" if trusted else ""
    header = (
        f"{WRITTEN_HEADER} compress`: the compressed model (its weights are in model.ckpt beside this file).\n"
        f"#   lit-embed test --config DIR/config.yaml --ckpt_path DIR/model.ckpt{trust}\n"
    )
    write_atomic(folder / "config.yaml", header + yaml.safe_dump(document, sort_keys=False))


def write_huggingface(folder: Path, source: Source, strategy: EmbeddingStrategy) -> None:
    """A HuggingFace folder of the compressed model: the input's files (its model card left out), the
    rebuilt dense table in its weights (so
    any HuggingFace tool loads it and computes what the compressed model computes), and the compact form
    in ``compressed_embedding.safetensors`` (:func:`load_compact`)."""
    folder.mkdir()
    if source.hf_folder is not None:
        for path in sorted(source.hf_folder.rglob("*")):
            relative = path.relative_to(source.hf_folder)
            if path.is_file() and path.suffix not in WEIGHT_SUFFIXES and path.name != "README.md" and not any(p.startswith(".") for p in relative.parts):
                (folder / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, folder / relative)
    model = source.hf_model
    table = model.get_input_embeddings()
    with torch.no_grad():
        table.weight.copy_(strategy.full_weight().detach().to(table.weight.dtype))
    model.save_pretrained(folder)
    load_tokenizer(source.tokenizer).save_pretrained(folder)
    save_compact(strategy, folder / COMPACT_FILE)


def save_compact(strategy: EmbeddingStrategy, path: Path) -> None:
    """The compressed embedding alone, as :func:`load_compact` reads it: its state and, in the header, its config."""
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in strategy.state_dict().items()}
    save_file(state, str(path), metadata={"lit_embed_strategy": json.dumps(strategy_config(strategy)),
                                          "vocab_size": str(strategy.vocab_size), "hidden_size": str(strategy.hidden_size)})


def load_compact(path: str | Path) -> EmbeddingStrategy:
    """The compressed embedding saved in a HuggingFace output folder (or its ``compressed_embedding.safetensors``),
    its recorded strategy read as :mod:`lit_embed.checkpoints.recorded` reads every recorded config."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(path)
    if path.is_dir():
        path = path / COMPACT_FILE
    with safe_open(str(path), framework="pt") as handle:
        meta = handle.metadata()
    config = recorded_config(json.loads(meta["lit_embed_strategy"]), f"compact embedding {str(path)!r}", "embedding")
    sizes = {"vocab_size": int(meta["vocab_size"]), "hidden_size": int(meta["hidden_size"])}
    config = {"class_path": config["class_path"], "init_args": {**sizes, **config["init_args"]}}
    strategy = build_from_config(EmbeddingStrategy, config, "embedding")
    strategy.load_state_dict(load_file(str(path)))
    return strategy
