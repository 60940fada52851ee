"""``lit-embed compress``: post-hoc compression of a fine-tuned model's embedding.

    lit-embed compress --ckpt RUN_FOLDER --method sparse_coding --retention 0.5 --k 3 --out DIR
    lit-embed compress --config configs/compress/sparse_coding.yaml --ckpt CKPT --out DIR
    lit-embed compress --ckpt RUN_FOLDER --method svd --rank 64 --out DIR

The command is generic: each method declares its own options (:attr:`CompressionMethod.Options
<lit_embed.compress.methods.CompressionMethod.Options>`), offered as ``--OPTION`` (and keys of a compress config)
once ``--method NAME`` (or a config's ``method:``) names it; ``lit-embed compress --method NAME --help`` lists them.
"""

from __future__ import annotations

import inspect
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NoReturn

import datasets
import pytorch_lightning as pl
import torch
import yaml
from jsonargparse import ActionConfigFile, ActionYesNo, ArgumentParser
from torch import Tensor

from lit_embed._compat import instantiate
from lit_embed.checkpoints.format import build_from_config
from lit_embed.checkpoints.recorded import name_user_classes
from lit_embed.commands.lightning import ModelOnlyCLI
from lit_embed.commands.parsing import UNKNOWN_OPTION, ConciseErrors, named_method
from lit_embed.compress.methods import CompressionMethod, Job, method_class, method_named
from lit_embed.compress.model_io import (
    Source,
    check_replaceable,
    classifier_for,
    load_source,
    write_huggingface,
    write_model,
)
from lit_embed.compress.summary import counts, format_summary, rebuilt_cosines, rebuilt_errors
from lit_embed.compress.vocabulary import check_retention, coverage, split_vocabulary
from lit_embed.data.frequencies import count_tokens
from lit_embed.data.sources import load_files, resolve_file
from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.embeddings.mixed_dimension import read_counts
from lit_embed.embeddings.sparse_coded import PartialEmbedding
from lit_embed.embeddings.state import public_class_path
from lit_embed.embeddings.text import VocabTextEncoder
from lit_embed.errors import ConfigError, MissingFileError
from lit_embed.hub import trusting_remote_code
from lit_embed.interfaces import TaskData, TaskModel, provides, wire
from lit_embed.progress import Progress
from lit_embed.runs.folders import checkpoints_taken
from lit_embed.runs.results import load_average, load_over
from lit_embed.storage.files import atomic_folder, check_output, write_atomic, write_json_atomic

CONFIG_SUFFIXES = (".yaml", ".yml")
#: jsonargparse's error for a config file's key that is no argument.
UNKNOWN_KEY = re.compile(r"Option '([\w.]+)' is not accepted")
#: How compress lets a tokenizer run the code it ships.
TRUST_FLAG = "--trust_remote_code"


@dataclass
class Data:
    """The texts whose token frequencies split the vocabulary, and the task data module if there is one."""

    label: str
    module: pl.LightningDataModule | None = None
    config: dict | None = None
    trust_remote_code: bool = False
    files: list[str] = field(default_factory=list)

    def stream(self) -> Iterator[str]:
        if self.module is not None:
            return self.module.train_texts()
        return _file_texts(self.files)


def compress(
    ckpt: str,
    out: str,
    method: str = "sparse_coding",
    data: str | list[str] | dict | None = None,
    retention: float = 1.0,
    options: dict | None = None,
    model_config: str | None = None,
    untie: bool = False,
    seed: int = 0,
    accelerator: str = "auto",
    limit_val_batches: int | None = None,
    overwrite: bool = False,
    trust_remote_code: bool = False,
    frequencies: str | None = None,
) -> dict:
    """Compress the input embedding of a fine-tuned model (frequency-aware partial sparse coding or a baseline).

    Args:
        ckpt: a lit-embed checkpoint written by ``lit-embed fit`` (with a dense embedding), or a HuggingFace
            model name or folder (``all-MiniLM-L6-v2`` is packaged offline).
        out: the output folder (written atomically: complete, or absent on error).
        method: ``sparse_coding`` (the paper's), or a baseline: ``unk`` (rare tokens take ``<unk>``'s row),
            ``pca`` (rare tokens from k principal components of the common rows), ``aq`` (additive
            quantization of the whole table, M=32 codebooks of K=16); post hoc, the whole table: ``svd`` (low rank),
            ``int8`` / ``int4`` (per-row scalar quantisation), ``pq`` (product quantisation), ``fit`` (any
            vocabulary strategy, ``--strategy YAML``, fitted to the table by gradient descent); ``dense`` (the table as it
            is: the uncompressed reference of a comparison); or the name of any
            :class:`~lit_embed.compress.methods.CompressionMethod` (a plugin's). Its options:
            ``lit-embed compress --method NAME --help``.
        data: the fine-tuning data whose token frequencies split the vocabulary: a task data config (a
            YAML file holding a ``class_path``/``init_args`` data module, or a full lit-embed config with a
            ``data:`` section, or the same inline), or text files (one text per line; csv/tsv/jsonl/parquet:
            every string column). Default: the data the checkpoint was fine-tuned on.
        retention: r(V_C), the share of the tokens seen in the data that stay common (0 < r <= 1).
        options: the method's own options by name (``{"k": [1, 2, 3]}``; on the command line ``--k [1,2,3]``).
        model_config: the config the checkpoint was trained with, for checkpoints that do not record it.
        untie: give a tied output layer its own copy of the table so the input embedding can be compressed.
        seed: seeds what a method learns (AQ's training) and the task head given to a HuggingFace model.
        accelerator: where validation (choosing k) and a method's training run: ``auto``, ``cpu``, ``gpu``.
        limit_val_batches: validate on at most this many batches when choosing k (quick runs).
        overwrite: replace an existing output folder, if it is an earlier output of this command (nothing else).
        trust_remote_code: let the tokenizer run the code it ships (LINE's Japanese tokenizer); a checkpoint's
            recorded data never grants it, only this flag or a --data config of your own.
        frequencies: a count file (one count per line, line i for id i) to rank tokens by, in place of counting
            them in the data (the split's common tokens, a budget's most frequent, fit's frequency weights).
    """
    started, load_start = time.perf_counter(), load_average()
    compression = method_named(method, options)
    check_retention(retention)
    target = Path(out).expanduser()
    given = [ckpt, model_config, frequencies, *_strings(data)]
    check_output(target, overwrite, check_replaceable, given)  # before the work: refuse what could not be replaced

    name_user_classes(given_data_config(data))  # the checkpoint may name the classes of your own --data config
    source = load_source(ckpt, None if model_config is None else _config_file_model(model_config), untie)
    chosen = resolve_data(data, source, trust_remote_code)
    # everything read: the checkpoint or model folder, its tokenizer, the data's files and folders
    inputs = [*given, source.name, source.tokenizer, source.hf_folder, *chosen.files,
              *_strings(chosen.config), *_strings(source.model_config)]
    if compression.tries > 1:
        check_k_choosable(source, chosen)
    vocab, hidden = source.weight.shape
    with trusting_remote_code(chosen.trust_remote_code, TRUST_FLAG):
        encoder = VocabTextEncoder(source.tokenizer, max_vocab_size=vocab)
    token_counts = count_tokens(chosen.stream(), encoder, vocab).counts if frequencies is None else read_counts(frequencies, vocab)
    split = split_vocabulary(token_counts, retention, encoder.tokenizer.all_special_ids)
    task = chosen.module.task if chosen.module is not None else None
    if source.module is None and task is not None:
        classifier_for(source, task.name, seed)

    device = "cuda" if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available() else "cpu"
    job = Job(source.weight, split.common_ids, encoder.tokenizer.unk_token_id, torch.as_tensor(token_counts), seed, device)
    compression.check(job)
    candidates = compression.fit(job)
    best, validation = next(iter(candidates)), None
    if len(candidates) > 1:
        best, validation = choose_k(source, candidates, chosen, accelerator, limit_val_batches)
    strategy = candidates[best].for_inference()  # what inference reads: DPQ's queries are neither counted nor saved
    cosines = {k: rebuilt_cosines(source.weight, s, common_of(s, split.common_ids)) for k, s in candidates.items()}
    common_ids = common_of(strategy, split.common_ids)  # a budget may have chosen them in place of the split

    report = {
        "source": source.name,
        "method": method,
        "options": asdict(compression.options),
        "details": compression.details,
        "data": chosen.label,
        "frequencies": frequencies or "counted in the data",
        "task": task.name if task is not None else None,
        "retention": retention,
        "k": best,
        "vocabulary": {"size": vocab, "hidden": hidden, "seen": split.seen, "kept": split.kept,
                       "common": len(common_ids), "rare": vocab - len(common_ids),
                       "partial": isinstance(strategy, PartialEmbedding),
                       "special_ids": list(split.special_ids)},
        **counts(source.weight, strategy, source.module if source.module is not None else source.hf_model),
        "cosine": cosines[best],
        "mse": rebuilt_errors(source.weight, strategy, common_ids),
        "cosine_by_k": {str(k): c for k, c in cosines.items() if k is not None},  # one output gives Table 9's k=1 to 5
        "coverage": None if chosen.module is None else coverage(chosen.module.test_examples(), encoder, common_ids),
        "validation": validation,
        "checkpoints_taken": checkpoints_taken(),  # which file a run or experiment folder gave, and why
    }

    def fill(folder: Path) -> None:
        if source.module is not None:
            source.module.embedding = strategy
            write_model(folder, source, strategy, chosen.config or source.data_config, out=target.absolute(),
                        trusted=chosen.trust_remote_code)
        if source.hf_model is not None:
            write_huggingface(folder / "hf", source, strategy)
        report["seconds"] = round(time.perf_counter() - started, 2)
        report["load"] = load_over(load_start)  # what every time in the report ran beside
        report["files"] = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))
                           if p.is_file() and p.name in ("model.ckpt", "model.safetensors", "compressed_embedding.safetensors")}
        write_json_atomic(folder / "report.json", report)
        write_atomic(folder / "report.md", format_summary(report))

    with trusting_remote_code(chosen.trust_remote_code, TRUST_FLAG):  # the HuggingFace folder saves the tokenizer too
        atomic_folder(target, overwrite, fill, replaceable=check_replaceable, inputs=inputs)
    print(format_summary(report), end="")
    print(f"Wrote {target}/")
    return report


def common_of(strategy: EmbeddingStrategy, split: Tensor) -> Tensor:
    """The common ids a partial strategy keeps (the split's, or those its budget chose); the split's for the others."""
    return strategy.common_ids() if isinstance(strategy, PartialEmbedding) else split


def choose_k(source: Source, candidates: dict, data: Data, accelerator: str, limit_val_batches: int | None) -> tuple[int, dict]:
    """Validate the model with each candidate embedding and keep the best ``val/score`` (ties: the smaller k);
    the scores, and the original model's, go to the report."""
    module = source.module
    original = module.embedding

    def score(embedding) -> float:
        module.embedding = embedding
        trainer = pl.Trainer(accelerator=accelerator, devices=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, limit_val_batches=limit_val_batches)
        wire(module, data.module)
        trainer.validate(module, datamodule=data.module, verbose=False)
        return float(trainer.callback_metrics["val/score"])

    progress, scores = Progress("choosing k,", "validation", len(candidates) + 1), {}
    try:
        for k, strategy in candidates.items():
            scores[k] = score(strategy)
            progress.update(len(scores), {"k": k, "val/score": scores[k]})
        baseline = score(original)
        progress.update(len(scores) + 1, {"original model's val/score": baseline}, final=True)
    finally:
        module.embedding = original
    best = max(scores, key=lambda k: (scores[k], -k))
    selection = module.task.selection(data.module.paper)  # what val/score is under the data's paper
    metric = selection.metric + (", the validation sets pooled" if selection.pooled else "")
    return best, {"metric": f"val/score ({metric})", "original": baseline, "scores": scores}


def check_k_choosable(source: Source, data: Data) -> None:
    if source.hf_model is not None or not provides(source.module, TaskModel):
        raise ConfigError("choosing k on the validation split needs a fine-tuned lit-embed classifier checkpoint "
                         "(a HuggingFace model has no trained task head): give a single --k")
    if data.module is None:
        raise ConfigError("choosing k on the validation split needs task data (--data: a task data config), "
                         "not text files: give a single --k")


def resolve_data(data, source: Source, trust_remote_code: bool = False) -> Data:
    """The data as a task data module (from a config) or text files; default the checkpoint's own (as it records it:
    :mod:`lit_embed.checkpoints.recorded`). ``trust_remote_code``: the user's flag, which the data's tokenizer takes too."""
    if data is None:
        if source.data_config is None:
            raise ConfigError(f"{source.name!r} records no fine-tuning data: pass --data (a task data config or text files)")
        return _task_data(source.data_config, "the checkpoint's fine-tuning data", trust_remote_code)
    config = given_data_config(data)
    if isinstance(data, dict):
        return _task_data(config, "inline data config", trust_remote_code)
    files = [data] if isinstance(data, str) else list(data)
    if config is not None:
        return _task_data(config, files[0], trust_remote_code)
    for name in files:
        resolve_file(name)  # a missing or unsupported file fails here, naming it
    return Data(label="files: " + ", ".join(files), files=files, trust_remote_code=trust_remote_code)


def given_data_config(data) -> dict | None:
    """The data module config ``--data`` gives (inline, or in a YAML file), ``None`` where it gives text files."""
    if isinstance(data, dict):
        return data.get("data", data)
    files = [data] if isinstance(data, str) else list(data or [])
    if len(files) != 1 or Path(files[0]).suffix not in CONFIG_SUFFIXES:
        return None
    path = Path(files[0]).expanduser()
    if not path.is_file():
        raise MissingFileError(f"data config {files[0]!r} does not exist: check the path")
    config = yaml.safe_load(path.read_text()) or {}
    config = config.get("data", config) if isinstance(config, dict) else config
    if isinstance(config, str):  # a full config naming its data piece, relative to itself
        piece = path.parent / config
        config = yaml.safe_load(piece.read_text())
    if not isinstance(config, dict) or "class_path" not in config:
        raise ConfigError(f"{files[0]!r} is not a data config: it needs a class_path (e.g. lit_embed.data.TaskDataModule) "
                         f"and init_args, or a data: section holding them")
    return config


def _task_data(config: dict, label: str, trust_remote_code: bool) -> Data:
    config = {"class_path": config["class_path"], "init_args": dict(config.get("init_args") or {})}
    module = build_from_config(pl.LightningDataModule, config, "data")
    if not provides(module, TaskData):
        raise ConfigError(f"data module {config['class_path']} is not task data (lit_embed.interfaces.TaskData): pass "
                         f"--data text files or a task data config (lit_embed.data.TaskDataModule)")
    module.trust_remote_code = module.trust_remote_code or trust_remote_code
    config["class_path"] = public_class_path(type(module))  # recorded in full, as every recorded class is
    task = module.task.name
    return Data(label=f"{label} (task {task})" if task else label, module=module, config=config,
                trust_remote_code=module.trust_remote_code)


def _strings(value) -> list[str]:
    """Every string in an argument or config (mappings and lists walked): the paths among them are what it reads."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in _strings(item)]
    return []


def _file_texts(files: list[str]) -> Iterator[str]:
    rows = load_files(files)
    columns = [name for name, feature in rows.features.items()
               if isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")]
    for batch in rows.select_columns(columns).iter(batch_size=1000):
        for column in columns:
            yield from (t for t in batch[column] if isinstance(t, str))


class CompressParser(ConciseErrors, ArgumentParser):
    """jsonargparse's parser with the commands' concise errors; an unknown option is also said to be none of the chosen
    method's (naming its options, and the method it belongs to where it is another's)."""

    method: str = ""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        unknown = UNKNOWN_OPTION.search(message) or UNKNOWN_KEY.search(message)
        if unknown and self.method and self.exit_on_error:
            option = "--" + unknown.group(1).split("=")[0].lstrip("-")
            taken = {name: set(cls.option_names()) for name, cls in CompressionMethod.registry.items()}
            # Every one of lit-embed's own methods takes these (--budget): as good as the command's own. A plugin's
            # method that lacks one does not make it a method's own (the early check reads lit-embed's copies alike).
            common = set.intersection(*(taken[name] for name, cls in CompressionMethod.registry.items()
                                        if cls.__module__.startswith("lit_embed.")))
            own = [o for o in method_class(self.method).option_names() if o not in common]
            owners = [name for name, options in sorted(taken.items()) if option[2:] in options - common]
            where = f"; {option} is an option of --method {', '.join(owners)}" if owners else ""
            message = (f"{message.strip()} (method {self.method!r} takes "
                       f"{', '.join('--' + o for o in own) if own else 'no options'}{where})")
        super().error(message, ex)


GENERIC_FLAGS = ("untie", "overwrite", "trust_remote_code")


def parser(method: str | None = None):
    """The command's arguments (those of :func:`compress`, and the options of ``method``, the default one unless
    named), with ``--config FILE`` and ``--print_config``."""
    method = method or inspect.signature(compress).parameters["method"].default
    cls = method_class(method)
    parsing = CompressParser(prog="lit-embed compress", allow_abbrev=False, description=(compress.__doc__ or "").split("\n")[0])
    parsing.method = method
    parsing.add_argument("--config", action=ActionConfigFile, help="a YAML file of these arguments")
    parsing.add_function_arguments(compress, as_group=False, skip={*GENERIC_FLAGS, "options"})
    for flag in GENERIC_FLAGS:  # flags: --untie, --untie true (a sweep's set), --no_untie
        parsing.add_argument(f"--{flag}", action=ActionYesNo, nargs="?", default=False, help=_argument_help(flag))
    clashes = set(cls.option_names()) & set(inspect.signature(compress).parameters)
    if clashes:
        raise ConfigError(f"compression method {method!r} ({cls.__module__}) names options {sorted(clashes)} as the "
                          f"command's own arguments: rename them")
    if cls.option_names():
        group = parsing.add_argument_group(f"options of --method {method} ({cls.Options.__name__})")
        group.add_class_arguments(cls.Options, nested_key=None, as_group=False)
    return parsing


def _argument_help(name: str) -> str:
    """The ``Args:`` line of :func:`compress` for ``name``."""
    lines = (compress.__doc__ or "").splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{name}:"))
    text = [lines[start].strip().removeprefix(f"{name}:").strip()]
    for line in lines[start + 1:]:
        if not line.startswith(" " * 12):
            break
        text.append(line.strip())
    return " ".join(text)


def main(argv: list[str]) -> int:
    """Shrink a model's embedding post hoc: partial sparse coding and its baselines, svd, int8/int4, pq, or --method fit.
    """
    parsing = parser(named_method(argv))
    arguments = vars(instantiate(parsing, parsing.parse_args(argv)))
    own = method_class(arguments["method"]).option_names()
    options = {key: arguments[key] for key in own if key in arguments}
    compress(**{k: v for k, v in arguments.items() if k in inspect.signature(compress).parameters}, options=options)
    return 0


def _config_file_model(model_config: str) -> dict:
    """The model's ``{"class_path", "init_args"}`` in a lit-embed config file (``--model_config``)."""
    cli = ModelOnlyCLI(args=["--config", model_config], run=False)
    return yaml.safe_load(cli.parser.dump(cli.config, skip_none=False))["model"]
