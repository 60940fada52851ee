"""``lit-embed export``: a checkpoint as a folder that ``transformers`` loads without lit-embed.

    lit-embed export --ckpt CKPT_OR_RUN_FOLDER --out DIR [--overwrite] [--tokenizer NAME] [--materialise]

A dense strategy (and, with ``materialise``, any strategy of a finite vocabulary, its table written out in full)
exports as the backbone's own transformers architecture (``BertModel``, ``BertForSequenceClassification``, ...):
``config.json`` and ``model.safetensors`` as transformers writes them, no code, so
``AutoModelForSequenceClassification.from_pretrained(DIR)`` and ``pipeline(..., model=DIR)`` load it as any model
of the hub. A compact strategy keeps its own form: ``config.json`` (the encoder's config, the strategy's config,
``auto_map``), the weights, and the code that defines them (``modeling_lit_embed.py``, generated from lit-embed's
own source by :mod:`lit_embed.export.vendor`; ``configuration_lit_embed.py``), loaded with
``trust_remote_code=True`` (the folder's own code runs). Both hold the tokenizer where the strategy reads tokenizer
ids, the task's label names (``id2label``), and a model card (``README.md``: parameters, provenance, usage) that
names no local path; ``lit_embed_export.json`` keeps the full local provenance and is not meant for upload.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from lit_embed._compat import auto_model_class, hub_client_errors
from lit_embed.checkpoints.format import load_model, recorded_tokenizer
from lit_embed.checkpoints.recorded import class_paths
from lit_embed.embeddings.state import CheckpointSized
from lit_embed.errors import CheckpointError, ConfigError, HubError, OutputExistsError
from lit_embed.export.configuration_lit_embed import LitEmbedConfig
from lit_embed.export.vendor import module_source
from lit_embed.hub import hub_endpoint, load_tokenizer, offline, offline_cause, trusting_remote_code
from lit_embed.interfaces import TaskModel, provides
from lit_embed.measures.accounting import format_parameters, parameter_report
from lit_embed.runs.folders import checkpoints_taken, start_checkpoint
from lit_embed.runs.results import versions
from lit_embed.storage.files import atomic_folder, check_output, write_atomic, write_json_atomic

log = logging.getLogger(__name__)

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


#: Backbones whose own ``...ForSequenceClassification`` head computes lit-embed's (a dense layer and tanh on the first
#: token, then the labels' linear layer), and where that dense layer sits in it: the encoder's ``pooler`` (BERT) or
#: ``classifier.dense`` (RoBERTa, XLM-R). lit-embed's dense layer is the encoder's pooler or its pre_classifier.
NATIVE_HEADS = {"bert": "pooler", "roberta": "classifier.dense", "xlm-roberta": "classifier.dense"}


def export(ckpt: str, out: str, overwrite: bool = False, tokenizer: str | None = None,
           trust_remote_code: bool = False, materialise: bool = False) -> Path:
    """Write the export of ``ckpt`` (a .ckpt, a run folder or an experiment folder) to ``out``, atomically.
    ``trust_remote_code``: let the tokenizer run the code it ships (never taken from what the checkpoint records).
    ``materialise``: export a compact strategy's full table as the backbone's own architecture (no custom code)."""
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
    classifier = provides(module, TaskModel)
    native = name == "DenseEmbedding" or materialise
    if native:
        why_not = _not_native(module, classifier)
        if why_not:
            if materialise:
                raise ConfigError(f"checkpoint {str(path)!r} cannot be exported as its backbone's own architecture: "
                                  f"{why_not}; export it without --materialise (lit-embed's own code)")
            native = False
            log.warning("exported with lit-embed's own code (trust_remote_code=True to load): %s", why_not)
    fill = _fill_native if native else _fill_custom
    with trusting_remote_code(trust_remote_code, "--trust_remote_code"):
        atomic_folder(Path(out), overwrite, lambda folder: _fill(folder, module, checkpoint, path, tokenizer, fill),
                      replaceable=check_replaceable, inputs=[ckpt, path, tokenizer])
    return Path(out)


def _not_native(module, classifier: bool) -> str | None:
    """Why ``module`` cannot be written as its backbone's own transformers model (``None``: it can)."""
    strategy = module.embedding
    if strategy.vocab_size is None:
        return f"{type(strategy).__name__} has no finite vocabulary to write out as a table"
    model_type = module.encoder.config.model_type
    if classifier and model_type not in NATIVE_HEADS:
        return (f"transformers' {model_type} classifier head is not lit-embed's (a dense layer and tanh on the first "
                f"token, then a linear layer); the backbones whose head is: {', '.join(NATIVE_HEADS)}")
    return None


def _fill(folder: Path, module, checkpoint: dict, path: Path, tokenizer: str | None, fill) -> None:
    classifier = provides(module, TaskModel)
    fill(folder, module, classifier)
    if tokenizer is not None:
        _save_tokenizer(tokenizer, folder)
    recorded = checkpoint.get("lit_embed") or {}
    provenance = {"format": 1, "source": str(path.absolute()), "run_dir": recorded.get("run_dir"),
                  "trained_with": recorded.get("versions"), "exported_with": versions(), "tokenizer": tokenizer,
                  "checkpoints_taken": checkpoints_taken()}
    write_json_atomic(folder / MARKER, provenance)
    write_atomic(folder / "README.md", model_card(module, provenance, classifier, custom_code=fill is _fill_custom))


def _labels(module) -> dict:
    """The task's label names, as a transformers config holds them (none for regression)."""
    task = module.task
    if task.regression:
        return {"num_labels": 1, "problem_type": "regression"}
    return {"num_labels": task.num_outputs, "id2label": dict(enumerate(task.labels)),
            "label2id": {label: i for i, label in enumerate(task.labels)}, "problem_type": "single_label_classification"}


def _fill_native(folder: Path, module, classifier: bool) -> None:
    """The backbone's own transformers model, its word-embedding table the strategy's (in full), saved by transformers.
    A classifier's head computes lit-embed's at inference (dropout, active only in training, may sit elsewhere)."""
    import transformers

    config = copy.deepcopy(module.encoder.config)
    table = module.embedding.full_weight().detach().float().cpu()
    config.vocab_size = table.shape[0]
    config._name_or_path = ""  # the folder it was read from is the exporting machine's
    state = {key.removeprefix("encoder.model."): value for key, value in module.state_dict().items()
             if key.startswith("encoder.model.")}
    state["embeddings.word_embeddings.weight"] = table
    if not classifier:
        accepts_pooler = "add_pooling_layer" in inspect.signature(auto_model_class(config).__init__).parameters
        model = transformers.AutoModel.from_config(
            config, **({"add_pooling_layer": module.encoder.has_pooler} if accepts_pooler else {}))
        model.load_state_dict(state, strict=True)
        model.save_pretrained(folder)
        return
    for key, value in _labels(module).items():
        setattr(config, key, value)
    config.classifier_dropout = module.classifier[0].p
    model = transformers.AutoModelForSequenceClassification.from_config(config)
    first = module.encoder.model.pooler.dense if module.pre_classifier is None else module.pre_classifier[1]
    state = {key: value for key, value in state.items() if not key.startswith("pooler.")}
    if NATIVE_HEADS[config.model_type] == "pooler":
        state.update({f"pooler.dense.{key}": value for key, value in first.state_dict().items()})
        model.classifier.load_state_dict(module.classifier[1].state_dict())
    else:
        model.classifier.dense.load_state_dict(first.state_dict())
        model.classifier.out_proj.load_state_dict(module.classifier[1].state_dict())
    model.base_model.load_state_dict(state, strict=True)
    model.save_pretrained(folder)


def _fill_custom(folder: Path, module, classifier: bool) -> None:
    """lit-embed's strategy and encoder, with the code that defines them (loaded with ``trust_remote_code=True``)."""
    strategy = module.embedding
    backbone = {k: v for k, v in module.encoder.config.to_dict().items()
                if k not in ("architectures", "_name_or_path", "transformers_version", "auto_map")}
    extra: dict = {}
    if classifier:
        task = module.task
        extra["classifier"] = {"pre_classifier": module.pre_classifier is not None, "regression": task.regression,
                               "dropout": module.classifier[0].p}
        extra.update(_labels(module))
        backbone.update({k: v for k, v in extra.items() if k in ("id2label", "label2id")})  # its names, not LABEL_0
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


def shown(name: str | None) -> str | None:
    """``name`` as a model card may show it: a hub name or a relative path as it is, an absolute one by its last part
    (a card is published; the folders of the machine it was made on are not)."""
    if name is None or not (Path(name).is_absolute() or name.startswith("~")):
        return name
    return Path(name).name


def model_card(module, provenance: dict, classifier: bool, custom_code: bool = True) -> str:
    """README.md of an export: what it is, its parameters, where it came from (no local path), how to load it."""
    strategy = type(module.embedding).__name__
    auto = "AutoModelForSequenceClassification" if classifier else "AutoModel"
    trust = ", trust_remote_code=True" if custom_code else ""
    if module.embedding.unlimited_vocabulary:
        inputs = ("inputs = model.encode_texts([\"a short text\"])  # words hashed to the strategy's codes "
                  "(lit-embed's word tokenization)")
    else:
        inputs = f"inputs = AutoTokenizer.from_pretrained(DIR{trust})([\"a short text\"], return_tensors=\"pt\")"
    try:
        parameters = format_parameters(parameter_report(module))
    except ConfigError:  # an unlimited vocabulary without a dense baseline to compare against
        counts = module.parameter_counts()
        parameters = (f"total params {counts['total_params']:,}\nembedding params {counts['embedding_params']:,}\n"
                      f"(no dense baseline recorded: baseline_vocab_size was not set)")
    trained = provenance.get("trained_with") or {}
    made = provenance["exported_with"]
    run_dir = provenance.get("run_dir")
    header = ["library_name: transformers", f"tags: [lit-embed{', custom_code' if custom_code else ''}]"]
    if classifier:
        header.append("pipeline_tag: text-classification")
    if custom_code:
        form = ("The folder carries its own code (`modeling_lit_embed.py`, generated from lit-embed's source), so "
                "loading it needs `trust_remote_code=True`: that code runs on your machine. lit-embed need not be "
                "installed.")
    else:
        form = (f"The folder is a plain transformers `{module.encoder.config.model_type}` model (its token embedding "
                f"written out as a full table): no custom code, lit-embed need not be installed.")
    use = ["```python", f"from transformers import {auto}, AutoTokenizer",
           f"model = {auto}.from_pretrained(DIR{trust}).eval()", inputs, "outputs = model(**inputs)", "```", ""]
    if classifier and not custom_code:
        use += ["```python", "from transformers import pipeline",
                "pipeline(\"text-classification\", model=DIR)(\"a short text\")  # labels by name", "```", ""]
    return "\n".join([
        "---", *header, "---",
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
        f"- checkpoint: `{shown(provenance['source'])}`",
        f"- run folder: `{shown(run_dir)}`",
        f"- tokenizer: `{shown(provenance.get('tokenizer'))}`",
        f"- trained with: lit-embed {trained.get('lit_embed')}, torch {trained.get('torch')}, "
        f"transformers {trained.get('transformers')}",
        f"- exported with: lit-embed {made['lit_embed']}, torch {made['torch']}, transformers {made['transformers']}",
        "",
        "## Use",
        "",
        form,
        "",
        *use,
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




def check_push(repo: str) -> None:
    """Before the export's seconds: refuse a ``--push-to-hub`` that cannot work here (offline, a malformed name)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if offline():
        raise HubError(f"--push-to-hub {repo}: the hub is not used here ({offline_cause()}): export without it, and "
                       f"upload the folder where the hub is reachable (hf upload {repo} DIR --exclude {MARKER})")
    try:
        validate_repo_id(repo)
    except HFValidationError as error:
        raise ConfigError(f"--push-to-hub {repo!r} is not a repository name ({error}): give USER/NAME") from None
    if "/" not in repo:
        raise ConfigError(f"--push-to-hub {repo!r} names no owner: give USER/NAME (or ORGANISATION/NAME)")


def push(folder: Path, repo: str) -> str:
    """Upload ``folder`` (an export) to the hub's model repository ``repo``, creating it where missing, with the token
    huggingface_hub finds (``hf auth login``, ``HF_TOKEN``); :data:`MARKER`, which names local paths, stays here. The
    repository's address."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_endpoint())
    try:
        api.create_repo(repo, repo_type="model", exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo, repo_type="model", ignore_patterns=[MARKER],
                          commit_message=f"lit-embed export ({MARKER} left out)")
    except hub_client_errors() as error:
        raise HubError(f"could not push {folder} to {repo}: {str(error).splitlines()[0][:300]}. The export is complete "
                       f"in {folder}: check the name and your token (hf auth login, or HF_TOKEN), then push it again "
                       f"(hf upload {repo} {folder} --exclude {MARKER})") from error
    return f"{hub_endpoint()}/{repo}"
