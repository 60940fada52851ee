"""``lit-embed export``: a checkpoint as a folder that ``transformers`` loads without lit-embed.

    lit-embed export --ckpt CKPT_OR_RUN_FOLDER --out DIR [--overwrite] [--tokenizer NAME]

The folder holds ``config.json`` (the encoder's config, the strategy's config, ``auto_map``), the weights in
``model.safetensors``, the code that defines them (``modeling_lit_embed.py``, generated from lit-embed's own
source by :mod:`lit_embed.export.vendor`; ``configuration_lit_embed.py``), the tokenizer where the strategy
reads tokenizer ids, and a model card (``README.md``: parameters, provenance, usage). Load it with
``AutoModel.from_pretrained(DIR, trust_remote_code=True)``, or ``AutoModelForSequenceClassification`` for a
fine-tuned classifier: the flag is needed because the folder's own code runs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from lit_embed.accounting import format_parameters, parameter_report
from lit_embed.checkpoints import load_model, recorded_tokenizer
from lit_embed.embeddings.state import CheckpointSized
from lit_embed.errors import CheckpointError, ConfigError, OutputExistsError
from lit_embed.export.configuration_lit_embed import LitEmbedConfig
from lit_embed.export.vendor import module_source
from lit_embed.files import atomic_folder, check_output, write_atomic, write_json_atomic
from lit_embed.folders import checkpoints_taken, start_checkpoint
from lit_embed.hub import load_tokenizer, trusting_remote_code
from lit_embed.interfaces import TaskModel, provides
from lit_embed.recorded import class_paths
from lit_embed.results import versions

#: What marks a folder as an earlier export (``--overwrite`` replaces only those).
MARKER = "lit_embed_export.json"
CONFIG_CODE = "configuration_lit_embed.py"
MODEL_CODE = "modeling_lit_embed.py"
#: Strategies whose encoder keeps HuggingFace's own input layer, which an export cannot rebuild.
UNSUPPORTED = {"CanineHashEmbedding": "its CANINE encoder reads characters through the strategy's hash tables"}
AUTO_MAP = {
    "AutoConfig": "configuration_lit_embed.LitEmbedConfig",
    "AutoModel": "modeling_lit_embed.LitEmbedModel",
    "AutoModelForSequenceClassification": "modeling_lit_embed.LitEmbedForSequenceClassification",
}


def export(ckpt: str, out: str, overwrite: bool = False, tokenizer: str | None = None,
           trust_remote_code: bool = False) -> Path:
    """Write the export of ``ckpt`` (a .ckpt, a run folder or an experiment folder) to ``out``, atomically.
    ``trust_remote_code``: let the tokenizer run the code it ships (never taken from what the checkpoint records)."""
    check_output(Path(out), overwrite, check_replaceable, inputs=[ckpt])  # at once, not after the loading's seconds
    path = start_checkpoint(ckpt)
    module, checkpoint = load_model(path)
    module.eval()
    strategy = module.embedding
    name = type(strategy).__name__
    if name in UNSUPPORTED:
        raise ConfigError(f"checkpoint {str(path)!r} uses {name}, which export does not support: {UNSUPPORTED[name]}")
    tokenizer = tokenizer or recorded_tokenizer(checkpoint)
    if tokenizer is None and strategy.reads_tokenizer:
        raise CheckpointError(f"checkpoint {str(path)!r} records no tokenizer: give the one it was trained with (--tokenizer NAME)")
    with trusting_remote_code(trust_remote_code, "--trust_remote_code"):
        atomic_folder(Path(out), overwrite, lambda folder: _fill(folder, module, checkpoint, path, tokenizer),
                      replaceable=check_replaceable, inputs=[ckpt, path, tokenizer])
    return Path(out)


def _fill(folder: Path, module, checkpoint: dict, path: Path, tokenizer: str | None) -> None:
    strategy = module.embedding
    classifier = provides(module, TaskModel)
    backbone = {k: v for k, v in module.encoder.config.to_dict().items()
                if k not in ("architectures", "_name_or_path", "transformers_version", "auto_map")}
    extra: dict = {}
    if classifier:
        task = module.task
        extra["classifier"] = {"pre_classifier": module.pre_classifier is not None, "regression": task.regression,
                               "dropout": module.classifier[0].p}
        extra["num_labels"] = task.num_outputs
        if not task.regression:
            extra["id2label"] = dict(enumerate(task.labels))
            extra["label2id"] = {label: i for i, label in enumerate(task.labels)}
    config = LitEmbedConfig(backbone=backbone, strategy=strategy.config(with_sizes=True),
                            pooler=module.encoder.has_pooler, sized_buffers=_sized_buffers(strategy), **extra)
    config.auto_map = AUTO_MAP
    config.architectures = ["LitEmbedForSequenceClassification" if classifier else "LitEmbedModel"]
    config.save_pretrained(folder)
    save_file(_weights(module, classifier), str(folder / "model.safetensors"), metadata={"format": "pt"})
    here = Path(__file__).parent
    shutil.copyfile(here / CONFIG_CODE, folder / CONFIG_CODE)
    write_atomic(folder / MODEL_CODE, module_source(type(strategy), (here / MODEL_CODE).read_text(),
                                                    declared=class_paths(config.strategy)))
    if tokenizer is not None:
        _save_tokenizer(tokenizer, folder)
    recorded = checkpoint.get("lit_embed") or {}
    provenance = {"format": 1, "source": str(path.absolute()), "run_dir": recorded.get("run_dir"),
                  "trained_with": recorded.get("versions"), "exported_with": versions(), "tokenizer": tokenizer,
                  "checkpoints_taken": checkpoints_taken()}
    write_json_atomic(folder / MARKER, provenance)
    write_atomic(folder / "README.md", model_card(module, provenance, classifier))


def _weights(module, classifier: bool) -> dict[str, torch.Tensor]:
    """The state dict under the exported model's names (heads of pre-training objectives left out)."""
    base = "lit_embed." if classifier else ""
    renamed = {}
    for key, value in module.state_dict().items():
        if key.startswith("embedding."):
            renamed[base + key] = value
        elif key.startswith("encoder.model."):
            renamed[base + "backbone." + key.removeprefix("encoder.model.")] = value
        elif classifier and key.split(".")[0] in ("pre_classifier", "classifier"):
            renamed[key] = value
    return {key: value.detach().cpu().clone().contiguous() for key, value in renamed.items()}


def _sized_buffers(strategy) -> dict[str, list[int]]:
    """Shapes of the buffers whose size only the weights know, by their path in the strategy."""
    sizes = {}
    for prefix, sub in strategy.named_modules():
        if isinstance(sub, CheckpointSized):
            for name in sub.sized_by_checkpoint:
                sizes[f"{prefix}.{name}" if prefix else name] = list(getattr(sub, name).shape)
    return sizes


def _save_tokenizer(name: str, folder: Path) -> None:
    load_tokenizer(name).save_pretrained(folder)


def model_card(module, provenance: dict, classifier: bool) -> str:
    """README.md of an export: what it is, its parameters, where it came from, how to load it."""
    strategy = type(module.embedding).__name__
    auto = "AutoModelForSequenceClassification" if classifier else "AutoModel"
    if module.embedding.unlimited_vocabulary:
        inputs = ("inputs = model.encode_texts([\"a short text\"])  # words hashed to the strategy's codes "
                  "(lit-embed's word tokenization)")
    else:
        inputs = "inputs = AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)([\"a short text\"], return_tensors=\"pt\")"
    try:
        parameters = format_parameters(parameter_report(module))
    except ConfigError:  # an unlimited vocabulary without a dense baseline to compare against
        counts = module.parameter_counts()
        parameters = (f"total params {counts['total_params']:,}\nembedding params {counts['embedding_params']:,}\n"
                      f"(no dense baseline recorded: baseline_vocab_size was not set)")
    trained = provenance.get("trained_with") or {}
    made = provenance["exported_with"]
    return "\n".join([
        "---",
        "library_name: transformers",
        "tags: [lit-embed, custom_code]",
        "---",
        f"# lit-embed {strategy} model",
        "",
        f"A {'fine-tuned classifier' if classifier else 'pre-trained encoder'} whose token embedding is lit-embed's "
        f"`{strategy}` strategy, exported by `lit-embed export`.",
        "",
        "## Parameters",
        "",
        "```",
        parameters,
        "```",
        "",
        "## Where it came from",
        "",
        f"- checkpoint: `{provenance['source']}`",
        f"- run folder: `{provenance.get('run_dir')}`",
        f"- tokenizer: `{provenance.get('tokenizer')}`",
        f"- trained with: lit-embed {trained.get('lit_embed')}, torch {trained.get('torch')}, "
        f"transformers {trained.get('transformers')}",
        f"- exported with: lit-embed {made['lit_embed']}, torch {made['torch']}, transformers {made['transformers']}",
        "",
        "## Use",
        "",
        "The folder carries its own code (`modeling_lit_embed.py`, generated from lit-embed's source), so loading "
        "it needs `trust_remote_code=True`: that code runs on your machine. lit-embed need not be installed.",
        "",
        "```python",
        f"from transformers import {auto}, AutoTokenizer",
        f"model = {auto}.from_pretrained(DIR, trust_remote_code=True).eval()",
        inputs,
        "outputs = model(**inputs)",
        "```",
        "",
    ])


def check_replaceable(out: Path) -> None:
    """Refuse to replace ``out`` unless it is an earlier export (it holds :data:`MARKER`)."""
    try:
        earlier = "source" in json.loads((out / MARKER).read_text())
    except (OSError, ValueError, TypeError):
        earlier = False
    if not earlier:
        raise OutputExistsError(
            f"--out {str(out)!r} exists and is not a lit-embed export (no {MARKER}): --overwrite replaces only "
            f"earlier exports; choose another --out"
        )


