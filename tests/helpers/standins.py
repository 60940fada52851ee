"""Tiny local stand-ins for what a shipped sweep's runs need from the hub and a cluster, so that every stage of
every sweep file runs a step or two in CI: the command a run would execute, with override arguments composed
after it. What makes a run what it is stays (its configs and keys, the model class, the strategy, the data's length
and protocol); only sizes and sources change (a one-layer backbone with the positions the data's length is checked
against, the packaged MiniLM for hub encoders and tokenizers, the shipped corpus, local task files, a CPU).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml

from lit_embed.data.tasks import TASKS, XNLI_LANGUAGES
from tests.helpers.tasks import write_split, write_task

#: The backbone's width, depth and heads: the smallest that runs every strategy (hash Pool's 13 chunks included).
SMALL_ENCODER = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
#: google/canine-c's shape, small: a one-layer CANINE of CANINE-C's 2048-character input (canine_c.yaml's length).
SMALL_CANINE = json.dumps({"class_path": "lit_embed.models.Encoder", "init_args": {
    "arch": "canine", **SMALL_ENCODER, "max_position_embeddings": 2048, "pretrained": None}})
#: One CPU, full precision, two optimiser steps, one validation (at the end) and one test batch.
TRAINER = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.num_nodes", "1", "--trainer.strategy", "auto",
           "--trainer.precision", "32-true", "--trainer.max_steps", "2", "--trainer.max_epochs", "1",
           "--trainer.val_check_interval", "2", "--trainer.check_val_every_n_epoch", "null",
           "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1", "--trainer.log_every_n_steps", "1",
           "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
#: ``lit-embed compress`` on a CPU, validating on one batch; additive quantization trained, a strategy fitted, two steps.
COMPRESS = ["--accelerator", "cpu", "--limit_val_batches", "1"]
STEPS = ["--max_steps", "2"]
LOCAL_TOKENIZER = "all-MiniLM-L6-v2"
MINILM_VOCABULARY = "30522"


def write_task_data(root: Path) -> Path:
    """Every hub task the sweeps fine-tune on (GLUE, JGLUE, each XNLI language), in the hub's layout under ``root``."""
    for task in TASKS.values():
        if task.benchmark in ("glue", "jglue"):
            write_task(root, task, "parquet")
    for number, language in enumerate(XNLI_LANGUAGES):
        for split in ("train", "validation", "test"):
            write_split(root / language, TASKS["xnli"], split, "parquet", seed=number)
    return root


def composed(argv: list[str]) -> dict:
    """The config ``lit-embed`` composes from ``argv`` (a ``fit`` command line), as ``--print_config`` prints it."""
    from lit_embed.commands import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit) as stop:
        main([*argv, "--print_config"])
    assert stop.value.code in (0, None), f"{' '.join(argv)} does not parse"
    return yaml.safe_load(printed.getvalue())


def fit_overrides(config: dict, task_data: Path, minilm: str) -> list[str]:
    """The arguments that make the run of ``config`` (a composed ``fit`` config) small and local."""
    model, data = config["model"]["init_args"], config["data"]["init_args"]
    args = list(TRAINER)
    encoder = (model.get("encoder") or {}).get("init_args")  # None: the checkpoint it starts from has its own
    if encoder is not None:
        if "canine" in str(encoder.get("pretrained")):
            args += ["--model.init_args.encoder", SMALL_CANINE]
        elif encoder.get("pretrained"):
            args += ["--model.init_args.encoder.init_args.pretrained", minilm, "--model.init_args.vocab_size", MINILM_VOCABULARY]
        else:  # a shape: the same positions (the data's length is checked against them), smaller otherwise
            args += [a for key, value in SMALL_ENCODER.items() for a in (f"--model.init_args.encoder.init_args.{key}", str(value))]
            budget = ((model.get("embedding") or {}).get("init_args") or {}).get("budget")
            if isinstance(budget, int) and not isinstance(budget, bool):  # a count for the full width: the same share
                width = SMALL_ENCODER["hidden_size"] / encoder["hidden_size"]
                args += ["--model.init_args.embedding.init_args.budget", str(round(budget * width))]
    assignment = (((model.get("embedding") or {}).get("init_args") or {}).get("assignment") or {}).get("init_args") or {}
    if assignment.get("source"):  # clusters a hub model's matrix: the packaged MiniLM's, with its vocabulary
        args += ["--model.init_args.embedding.init_args.assignment.init_args.source", LOCAL_TOKENIZER,
                 "--model.init_args.embedding.init_args.assignment.init_args.max_iter", "2",
                 "--model.init_args.vocab_size", MINILM_VOCABULARY]
    if data.get("tokenizer"):  # null: the model's own, the packaged MiniLM or the checkpoint's
        args += ["--data.init_args.tokenizer", LOCAL_TOKENIZER]
    args += ["--data.init_args.batch_size", "2", "--data.init_args.num_workers", "0"]
    if "files" in data:  # a corpus: the shipped one, read whole, a few validation texts
        args += ["--data.init_args.datasets", "null", "--data.init_args.files", "[sample-corpus]",
                 "--data.init_args.global_batch_size", "null", "--data.init_args.streaming", "false",
                 "--data.init_args.max_texts", "200", "--data.init_args.val_size", "4"]
        if "token_budgets" in data:  # a budget reads each file's start as it streams: the stand-in is read whole
            args += ["--data.init_args.token_budgets", "null"]
    elif TASKS[str(data.get("task") or "xnli")].benchmark != "sample":  # a hub task: its local stand-in
        args += ["--data.init_args.data_dir", str(task_data)]
        if data.get("trust_remote_code"):
            args += ["--data.init_args.trust_remote_code", "false"]
    return args


def compress_overrides(argv: list[str]) -> list[str]:
    """The arguments that make ``argv`` (a ``compress`` command line) quick; none for the ``test`` after it (the
    compressed model's config is its fine-tuning's, small and local already)."""
    if argv[0] != "compress":
        return []
    files = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--config"]
    methods = [(yaml.safe_load(Path(f).read_text()) or {}).get("method") for f in files]
    return COMPRESS + (STEPS if {"aq", "fit"} & set(methods) else [])
