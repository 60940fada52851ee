"""Faults through the real CLI: bad input and broken files exit 2 naming the culprit, keep what is on disk,
and show no traceback; signals save and exit 128 + N; runs started together never share a folder.

The matrix runs every case in one fresh process (``tests/helpers/cli_driver.py``: each command through
``lit_embed.commands.main`` as the console script runs it), so it costs seconds; signals, concurrency and a
bug's traceback run as separate ``lit-embed`` processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
import transformers

from lit_embed.errors import DiskFullError, OutputExistsError
from lit_embed.storage.files import atomic_writer, check_output
from tests.helpers import CONFIGS, REPO, go_offline
from tests.helpers.cli import drive
from tests.helpers.disk import BALLAST, fill, small_disk

QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
#: The demo, made short: a few steps, a little validation, no plots.
SHORT = [*QUIET, "--trainer.max_steps", "4", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "2",
         "--data.init_args.batch_size", "4",
         "--trainer.callbacks", json.dumps([{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint",
                                             "init_args": {"save_last": True}},
                                            {"class_path": "lit_embed.callbacks.ResultsWriter"}])]
DEMO = ["fit", "--config", str(CONFIGS / "demo.yaml")]
FINETUNE = ["fit", "--config", str(CONFIGS / "demo_finetune.yaml")]


class Evil:
    """Unpickling it runs a shell command that leaves a file: what a crafted checkpoint does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def env(tmp: Path) -> dict[str, str]:
    """Offline, with caches in ``tmp``, and ``tmp`` importable (where crafted files put a module of their own)."""
    cache = tmp / "cache"
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "HF_DATASETS_CACHE": str(cache / "datasets"), "LIT_EMBED_CACHE": str(cache / "lit_embed"),
            "HF_MODULES_CACHE": str(cache / "hf_modules"),
            "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A finished demo run, and broken files of every kind beside it."""
    from lit_embed.commands import main

    root = tmp_path_factory.mktemp("faults")
    with pytest.MonkeyPatch.context() as monkeypatch:  # the run is set-up, not what is tested: in this process
        go_offline(monkeypatch, tmp_path_factory)
        monkeypatch.chdir(root)
        assert main([*DEMO, *SHORT]) == 0
    good = root / "runs/demo/version_0/checkpoints/last.ckpt"
    data = good.read_bytes()
    (root / "empty.ckpt").write_bytes(b"")
    (root / "truncated.ckpt").write_bytes(data[: len(data) // 2])
    (root / "random.ckpt").write_bytes(os.urandom(4096))
    torch.save({"state_dict": {}, "hyper_parameters": {"x": Evil(root / "PWNED")}}, root / "evil.ckpt")
    torch.save({"something": torch.zeros(2)}, root / "nostate.ckpt")
    (root / "empty.txt").write_text("")
    (root / "blank.txt").write_text("\n  \n")
    for name, content in (("empty_csv", b""), ("binary_csv", os.urandom(3000))):
        folder = root / name
        folder.mkdir()
        (folder / "train.csv").write_bytes(content)
        for split in ("validation", "test"):
            (folder / f"{split}.csv").write_text("text,label\nthe sea is calm,sea\n")
    (root / "broken.yaml").write_text("trainer:\n  max_steps: [1, 2\n")
    bad_results = root / "bad_results" / "version_0"
    bad_results.mkdir(parents=True)
    (bad_results / "results.json").write_text(json.dumps({"format": 1, "metrics": {}}))
    user = root / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("a user's file")
    torch.save({"weight": Evil(root / "PWNED")}, root / "evil_matrix.pt")  # a cluster assignment's source
    np.save(root / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    tiny = transformers.BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32)
    transformers.BertModel(tiny).save_pretrained(root / "evil_hf")
    weights = safetensors.torch.load_file(root / "evil_hf" / "model.safetensors")
    (root / "evil_hf" / "model.safetensors").unlink()
    torch.save({**weights, "x": Evil(root / "PWNED")}, root / "evil_hf" / "pytorch_model.bin")
    (root / "not_a_model").mkdir()
    weights = torch.load(good, weights_only=True)
    torch.save({k: v for k, v in weights.items() if k not in ("optimizer_states", "lr_schedulers", "loops")},
               root / "weights.ckpt")
    (root / "empty_config.yaml").write_text("")
    craft_recorded(root)
    # earlier outputs that hold what a later command reads: --overwrite must not replace them
    compressed = root / "compressed"
    transformers.BertModel(tiny).save_pretrained(compressed / "hf")
    (compressed / "hf" / "texts.txt").write_text("the sea is calm\n")
    (compressed / "report.json").write_text(json.dumps({"source": "all-MiniLM-L6-v2", "method": "unk", "vocabulary": {}}))
    (root / "hf_link").symlink_to(compressed / "hf")
    exported = root / "prior_export"
    (exported / "tokenizer").mkdir(parents=True)
    (exported / "lit_embed_export.json").write_text(json.dumps({"format": 1, "source": str(good)}))
    (exported / "last.ckpt").write_bytes(data)
    prior = root / "prior_analysis"
    prior.mkdir()
    (prior / "analysis.json").write_text(json.dumps({"strategy": "SubspaceEmbedding"}))
    diverged = root / "runs/diverged/version_0"  # a run that diverged after saving checkpoints that look fine
    shutil.copytree(root / "runs/demo/version_0", diverged, ignore=shutil.ignore_patterns(".lock"))
    results = json.loads((diverged / "results.json").read_text())
    (diverged / "results.json").write_text(json.dumps({**results, "status": "diverged",
                                                       "detail": "the training loss was nan at step 3"}))
    craft_links(root, user / "notes.txt")
    poisoned = torch.load(good, weights_only=True)
    key = next(k for k, v in poisoned["state_dict"].items() if v.is_floating_point())
    poisoned["state_dict"][key][0] = float("nan")
    torch.save(poisoned, root / "nan.ckpt")
    (root / "blank_line.txt").write_text("The cat sat on the <mask>.\n  \nThe sea is <mask>.\n\n")
    (root / "not_utf8.txt").write_bytes(b"The cat sat on the <mask>.\nThe caf\xe9 is <mask>.\n")
    for name, value in (("nan", ".nan"), ("inf", ".inf")):
        (root / f"{name}_budget.yaml").write_text(f"class_path: lit_embed.embeddings.DPQEmbedding\ninit_args:\n  budget: {value}\n")
    killed = root / "runs/killed/version_0"  # killed between its step-4 save and last.ckpt's: a stale last, no results
    shutil.copytree(root / "runs/demo/version_0", killed, ignore=shutil.ignore_patterns(".lock", "results.json"))
    torch.save({**weights, "global_step": 2}, killed / "checkpoints/last.ckpt")
    return root


def craft_links(root: Path, target: Path) -> None:
    """Folders whose files lit-embed writes in place (locks, a run's hparams.yaml, a sweep run's log) are links to
    ``target``, a user's file, as a tarball of runs can carry them."""
    for name, link in (("linked_lock", ".lock"), ("linked_hparams", "hparams.yaml")):
        run = root / "runs" / name / "version_0"
        shutil.copytree(root / "runs/demo/version_0", run, ignore=shutil.ignore_patterns(".lock"))
        (run / link).unlink(missing_ok=True)
        (run / link).symlink_to(target)
    for name, link in (("lock", ".launch.lock"), ("log", "logs/fit/run/output.log")):
        sweep = {"folder": str(root / f"sweep_{name}"), "stages": {"fit": {"config": str(CONFIGS / "demo.yaml"), "set": {
            "trainer.max_steps": 2, "trainer.limit_val_batches": 1, "data.init_args.batch_size": 4}}}}
        (root / f"{name}.sweep.yaml").write_text(json.dumps(sweep))
        (root / f"sweep_{name}" / link).parent.mkdir(parents=True, exist_ok=True)
        (root / f"sweep_{name}" / link).symlink_to(target)


def craft_recorded(root: Path) -> None:
    """Files that record options lit-embed must not obey: checkpoints of a tiny classifier, a run's config.yaml, a
    compress output and an export that name code of their own (``evil_code``, importable from ``root``) or a tokenizer
    that ships code (``evil_tok``) and grant it trust; each leaves PWNED if its code runs."""
    import shutil

    import yaml

    from lit_embed.export.folder import export
    from tests.helpers.crafted import (
        classifier_checkpoint,
        code_module,
        code_tokenizer,
        marking,
        recording,
        trusting,
    )

    marker = root / "PWNED"
    code_module(root, "evil_code", marker)
    tokenizer = code_tokenizer(root / "evil_tok", marker)
    base = classifier_checkpoint(root / "classifier.ckpt")
    recording(base, root / "runs/trusting/version_0/checkpoints/last.ckpt", trusting(tokenizer))
    recording(base, root / "runs/foreign/version_0/checkpoints/last.ckpt",
              lambda raw, model: model["embedding"].update(class_path="evil_code.Evil"))
    for run in ("trusting", "foreign"):  # finished runs, as far as their folders say
        (root / f"runs/{run}/version_0/results.json").write_text(json.dumps({"format": 1, "status": "complete"}))
    for name, edit in (
        ("model", lambda raw, model: raw["hyper_parameters"].update(_class_path="evil_code.Evil")),
        ("data", lambda raw, model: raw["datamodule_hyper_parameters"].update(_class_path="evil_code.Evil")),
        ("strategy", lambda raw, model: raw["lit_embed"].update(strategy="evil_code.Evil")),
        ("encoder", lambda raw, model: model["encoder"].update(class_path="evil_code.Evil")),
        ("function", lambda raw, model: model.update(embedding="evil_code.make")),
        ("writer", lambda raw, model: model["embedding"].update(class_path="lit_embed.storage.files.write_atomic")),
    ):
        recording(base, root / f"class_{name}.ckpt", edit)

    data = base["datamodule_hyper_parameters"]
    own = {"model": {"class_path": "lit_embed.models.SequenceClassifier", "init_args": {"task": "topics"}},
           "data": {"class_path": data["_class_path"], "init_args": {"task": "topics", "batch_size": 4, "max_length": 64}},
           "trainer": {"enable_progress_bar": False, "enable_model_summary": False, "limit_test_batches": 1,
                       "limit_predict_batches": 1, "max_steps": 1, "default_root_dir": "runs/own"}}
    (root / "own.yaml").write_text(yaml.safe_dump(own))
    model = base["lit_embed"]["model"]
    given = {**own, "model": {**model, "init_args": {**model["init_args"], "trained_tokenizer": str(tokenizer)}},
             "data": {**own["data"], "init_args": {"task": "topics", "tokenizer": str(tokenizer), "trust_remote_code": True}}}
    for folder, document, beside in (
        ("runs/given/version_0", given, "hparams.yaml"),  # a run folder
        ("runs/given_foreign/version_0", {**own, "trainer": {"callbacks": [{"class_path": "evil_code.Evil"}]}}, ".lock"),
        ("given_compress", given, "report.json"),  # a compress output
    ):
        (root / folder).mkdir(parents=True)
        (root / folder / beside).write_text("{}")
        (root / folder / "config.yaml").write_text(yaml.safe_dump(document))
    shutil.copy(root / "runs/trusting/version_0/checkpoints/last.ckpt", root / "given_compress" / "model.ckpt")

    export(str(root / CKPT), str(root / "exported"))  # a compact strategy's: the export's own code (a dense one has none)
    for name in ("modeling_lit_embed.py", "configuration_lit_embed.py"):
        (root / "exported" / name).write_text(marking(marker) + (root / "exported" / name).read_text())


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file() and "cache" not in p.relative_to(root).parts and p.name != ".lock"}


CKPT = "runs/demo/version_0/checkpoints/last.ckpt"


def clustered(source: str) -> str:
    """A 3-sub-embedding whose cluster assignment reads ``source``."""
    return json.dumps({"class_path": "lit_embed.embeddings.SubspaceEmbedding", "init_args": {"num_tables": 3, "assignment": {
        "class_path": "lit_embed.embeddings.ClusterAssignment", "init_args": {"source": source, "method": "kmeans"}}}})
NOT_READABLE = r"is (truncated or corrupt|not a readable checkpoint)"
#: Every command that rebuilds a model or data from what a checkpoint records, on a checkpoint or run folder: its
#: arguments, and the flag that lets a tokenizer run its code there.
REBUILDERS = {
    "compress": (lambda ckpt: ["compress", "--ckpt", ckpt, "--out", "out_c"], "--trust_remote_code"),
    "export": (lambda ckpt: ["export", "--ckpt", ckpt, "--out", "out_c"], "--trust_remote_code"),
    "analyze": (lambda ckpt: ["analyze", "--ckpt", ckpt, "--out", "out_c", "--max-texts", "2"], "--trust_remote_code"),
    "test": (lambda ckpt: ["test", "--config", "own.yaml", "--ckpt_path", ckpt], "--data\\.init_args\\.trust_remote_code true"),
    "predict": (lambda ckpt: ["predict", "--config", "own.yaml", "--ckpt_path", ckpt],
                "--data\\.init_args\\.trust_remote_code true"),
    "fine-tuning": (lambda ckpt: ["fit", "--config", "own.yaml", "--model.init_args.checkpoint", ckpt],
                    "--data\\.init_args\\.trust_remote_code true"),
}
TRUST_REFUSED = r"tokenizer '[^']*evil_tok' runs code it ships .* pass "


def recorded(key: str, value: str) -> str:
    """The refusal of a class path ``value`` a file records under ``key``."""
    import re

    return f"records {re.escape(key)}={re.escape(repr(value))}, a class outside lit-embed, Lightning and the installed plugins"

def readers(ckpt: str) -> list[tuple[str, list[str]]]:
    """Every command that reads ``ckpt`` (a file or a run folder) as a model, with the arguments that make it do so."""
    return [
        ("export", ["export", "--ckpt", ckpt, "--out", "out_c"]),
        ("compress", ["compress", "--ckpt", ckpt, "--data", "sample-corpus", "--out", "out_c"]),
        ("analyze", ["analyze", "--ckpt", ckpt]),
        ("validate", ["validate", "--config", str(CONFIGS / "demo.yaml"), "--ckpt_path", ckpt]),
        ("test", ["test", "--config", str(CONFIGS / "demo_finetune.yaml"), "--ckpt_path", ckpt]),
        ("predict", ["predict", "--config", str(CONFIGS / "demo.yaml"), "--ckpt_path", ckpt]),
        ("fit --ckpt_path", [*DEMO, *SHORT, "--ckpt_path", ckpt]),
        ("fine-tuning", [*FINETUNE, *SHORT, "--model.init_args.checkpoint", ckpt])]


DIVERGED_RUN = r"'runs/diverged/version_0' is a run that diverged \(the training loss was nan at step 3\): it has no trained model"
#: id, command, exit status, what the message must say (a regex).
CASES = [
    ("empty corpus file", [*DEMO, *SHORT, "--data.init_args.files", "[empty.txt]"], 2, r"empty\.txt"),
    ("blank corpus file", [*DEMO, *SHORT, "--data.init_args.files", "[blank.txt]"], 2, r"blank\.txt"),
    ("0-byte train.csv", [*FINETUNE, *SHORT, "--model.init_args.checkpoint", "null", "--data.init_args.tokenizer",
                          "all-MiniLM-L6-v2", "--data.init_args.data_dir", "empty_csv"], 2, r"empty_csv/train\.csv"),
    ("binary train.csv", [*FINETUNE, *SHORT, "--model.init_args.checkpoint", "null", "--data.init_args.tokenizer",
                          "all-MiniLM-L6-v2", "--data.init_args.data_dir", "binary_csv"], 2, r"binary_csv/train\.csv"),
    ("0-byte --ckpt_path", [*DEMO, *SHORT, "--ckpt_path", "empty.ckpt"], 2, r"empty\.ckpt' is empty \(0 bytes\)"),
    ("truncated --ckpt_path", [*DEMO, *SHORT, "--ckpt_path", "truncated.ckpt"], 2, r"truncated\.ckpt' " + NOT_READABLE),
    ("random --ckpt_path", [*DEMO, *SHORT, "--ckpt_path", "random.ckpt"], 2, r"random\.ckpt' " + NOT_READABLE),
    ("no state_dict", [*DEMO, *SHORT, "--ckpt_path", "nostate.ckpt"], 2, r"nostate\.ckpt' holds no state_dict"),
    ("truncated pre-training checkpoint", [*FINETUNE, *SHORT, "--model.init_args.checkpoint", "truncated.ckpt"], 2,
     r"truncated\.ckpt' " + NOT_READABLE),
    ("0-byte compress --ckpt", ["compress", "--ckpt", "empty.ckpt", "--data", "sample-corpus", "--out", "out_c"], 2,
     r"empty\.ckpt' is empty"),
    ("random analyze --ckpt", ["analyze", "--ckpt", "random.ckpt"], 2, r"random\.ckpt' " + NOT_READABLE),
    ("crafted --ckpt_path", [*DEMO, *SHORT, "--ckpt_path", "evil.ckpt"], 2, r"evil\.ckpt' holds a Python object of type posix\.system"),
    ("crafted pre-training checkpoint", [*FINETUNE, *SHORT, "--model.init_args.checkpoint", "evil.ckpt"], 2, r"posix\.system"),
    ("crafted compress --ckpt", ["compress", "--ckpt", "evil.ckpt", "--data", "sample-corpus", "--out", "out_c"], 2, r"posix\.system"),
    ("crafted analyze --ckpt", ["analyze", "--ckpt", "evil.ckpt"], 2, r"posix\.system"),
    ("crafted test --ckpt_path", ["test", "--config", str(CONFIGS / "demo_finetune.yaml"), "--ckpt_path", "evil.ckpt"], 2,
     r"posix\.system"),
    ("analyze --text empty", ["analyze", "--ckpt", CKPT, "--text", "empty.txt"], 2, r"empty\.txt.* is empty"),
    ("another model's checkpoint", [*DEMO, *SHORT, "--model.init_args.embedding", str(CONFIGS / "embedding/dense.yaml"),
                                    "--ckpt_path", CKPT], 2,
     r"checkpoint of another model.*model\.embedding\.class_path: checkpoint 'lit_embed\.embeddings\.SubspaceEmbedding'"),
    ("max_steps -5", [*DEMO, *QUIET, "--trainer.max_steps", "-5"], 2, r"max_steps.*-5"),
    ("GPU without one", [*DEMO, *QUIET, "--trainer.accelerator", "gpu"], 2, r"--trainer\.accelerator cpu"),
    ("table_size 0", [*DEMO, *SHORT, "--model.init_args.embedding.init_args.table_size", "0"], 2, r"table_size=0"),
    ("table_size -3", [*DEMO, *SHORT, "--model.init_args.embedding.init_args.table_size", "-3"], 2, r"table_size=-3"),
    ("batch_size 0", [*DEMO, *SHORT, "--data.init_args.batch_size", "0"], 2, r"batch_size=0 must be at least 1"),
    ("an abbreviated option", [*DEMO, *QUIET, "--trainer.max_step", "5"], 2, r"unrecognized arguments: --trainer\.max_step"),
    ("a YAML error", ["fit", "--config", "broken.yaml"], 2, r"broken\.yaml"),
    ("results.json without its keys", ["report", "bad_results"], 2, r"bad_results/version_0/results\.json.*label"),
    ("compress --overwrite of a user's folder", ["compress", "--ckpt", "all-MiniLM-L6-v2", "--data", "sample-corpus",
                                                 "--out", "mine", "--overwrite"], 2, r"not a lit-embed compress output"),
    ("compress --overwrite of a run folder", ["compress", "--ckpt", "all-MiniLM-L6-v2", "--data", "sample-corpus",
                                              "--out", "runs/demo", "--overwrite"], 2, r"not a lit-embed compress output"),
    ("a missing checkpoint", [*FINETUNE, *SHORT, "--model.init_args.checkpoint", "nowhere.ckpt"], 2, r"nowhere\.ckpt"),
    ("crafted cluster matrix", ["params", "--config", str(CONFIGS / "demo.yaml"), "--model.init_args.embedding",
                                clustered("evil_matrix.pt")], 2, r"evil_matrix\.pt' holds a Python object of type posix\.system"),
    ("object-array cluster matrix", ["params", "--config", str(CONFIGS / "demo.yaml"), "--model.init_args.embedding",
                                     clustered("objects.npy")], 2, r"objects\.npy' cannot be read"),
    ("crafted HF weights as the encoder", [*FINETUNE, *SHORT, "--model.init_args.checkpoint", "null",
                                           "--model.init_args.encoder.init_args.pretrained", "evil_hf"], 2,
     r"evil_hf' has weights holding a Python object of type posix\.system"),
    ("crafted HF weights to compress", ["compress", "--ckpt", "evil_hf", "--data", "sample-corpus", "--out", "out_c"], 2,
     r"evil_hf' has weights holding a Python object"),
    ("an encoder folder without a model", [*FINETUNE, *SHORT, "--model.init_args.checkpoint", "null",
                                           "--model.init_args.encoder.init_args.pretrained", "not_a_model"], 2,
     r"not_a_model' is not a model transformers can read"),
    ("a folder as the corpus", [*DEMO, *SHORT, "--data.init_args.files", "[mine]"], 2, r"'mine' is a folder"),
    ("an abbreviated option of report", ["report", "--form", "csv", "runs"], 2, r"unrecognized arguments: --form"),
    ("resuming from weights only", [*DEMO, *SHORT, "--ckpt_path", "weights.ckpt"], 2,
     r"weights\.ckpt holds weights only .* model\.init_args\.checkpoint"),
    ("test --ckpt_path last without a checkpoint", ["test", "--config", str(CONFIGS / "demo_finetune.yaml"), "--ckpt_path",
                                                    "last"], 2, r"--ckpt_path last: no checkpoint under runs/demo_finetune"),
    ("test --ckpt_path best", ["test", "--config", str(CONFIGS / "demo_finetune.yaml"), "--ckpt_path", "best"], 2,
     r"--ckpt_path best names a checkpoint of a fit in this process"),
    ("val_check_interval 0", [*DEMO, *QUIET, "--trainer.val_check_interval", "0"], 2, r"val_check_interval=0 must be positive"),
    ("an empty config file", ["fit", "--config", "empty_config.yaml"], 2, r"empty_config\.yaml is empty"),
    ("a TPU without torch_xla", [*DEMO, *QUIET, "--trainer.accelerator", "tpu"], 2, r"torch_xla"),
    ("an abbreviated option of compress", ["compress", "--ckpt", CKPT, "--out", "out_c", "--over"], 2,
     r"unrecognized arguments: --over"),
    *[(f"{command}: trust recorded in a checkpoint", [*argv("runs/trusting")], 2, TRUST_REFUSED + flag)
      for command, (argv, flag) in REBUILDERS.items()],
    *[(f"{command}: a foreign class recorded in a checkpoint", [*argv("runs/foreign")], 2,
       recorded("model.init_args.embedding.class_path", "evil_code.Evil")) for command, (argv, _) in REBUILDERS.items()],
    ("resume: a foreign class recorded in a checkpoint", ["fit", "--config", "own.yaml", "--ckpt_path", "runs/foreign"], 2,
     recorded("model.init_args.embedding.class_path", "evil_code.Evil")),
    *[(f"a foreign {what} recorded in a checkpoint", ["analyze", "--ckpt", f"class_{name}.ckpt", "--out", "out_c"], 2,
       recorded(key, value)) for what, name, key, value in (
        ("model class", "model", "model.class_path", "evil_code.Evil"),
        ("data class", "data", "data.class_path", "evil_code.Evil"),
        ("strategy in the facts", "strategy", "model.init_args.embedding.class_path", "evil_code.Evil"),
        ("encoder class", "encoder", "model.init_args.encoder.class_path", "evil_code.Evil"),
        ("function given for a strategy", "function", "model.init_args.embedding", "evil_code.make"))],
    ("a lit-embed function recorded as a class", ["analyze", "--ckpt", "class_writer.ckpt", "--out", "out_c"], 2,
     r"records model\.init_args\.embedding\.class_path='lit_embed\.storage\.files\.write_atomic', which is not a class"),
    ("trust recorded in a run's config.yaml", ["test", "--config", "runs/given/version_0/config.yaml", "--ckpt_path",
                                              "runs/trusting"], 2, TRUST_REFUSED + "--data\\.init_args\\.trust_remote_code true"),
    ("a foreign class recorded in a run's config.yaml", ["test", "--config", "runs/given_foreign/version_0/config.yaml",
                                                        "--ckpt_path", "classifier.ckpt"], 2,
     recorded("trainer.callbacks[0].class_path", "evil_code.Evil")),
    ("trust recorded in a compress output's config.yaml", ["test", "--config", "given_compress/config.yaml", "--ckpt_path",
                                                          "given_compress/model.ckpt"], 2,
     TRUST_REFUSED + "--data\\.init_args\\.trust_remote_code true"),
    ("an export's config.json to compress", ["compress", "--ckpt", "exported", "--data", "sample-corpus", "--out", "out_c"], 2,
     r"'exported' is not a model transformers can read \(.*custom code"),
    ("an export's config.json as the encoder", [*FINETUNE, *SHORT, "--model.init_args.checkpoint", "null",
                                               "--model.init_args.encoder.init_args.pretrained", "exported"], 2,
     r"'exported' is not a model transformers can read \(.*custom code"),
    # what a command reads is never inside the --out it replaces (symlinks followed), nor that folder itself
    ("compress --overwrite of the output its --ckpt is in", ["compress", "--ckpt", "compressed/hf", "--data", "sample-corpus",
                                                             "--out", "compressed", "--overwrite"], 2,
     r"--out '\S*/compressed' holds 'compressed/hf', which this command reads"),
    ("compress --overwrite of the output a symlinked --ckpt points into", [
        "compress", "--ckpt", "hf_link", "--data", "sample-corpus", "--out", "compressed", "--overwrite"], 2,
     r"--out '\S*/compressed' holds 'hf_link'"),
    ("compress --overwrite of the output its --data is in", ["compress", "--ckpt", "all-MiniLM-L6-v2", "--data",
                                                             "compressed/hf/texts.txt", "--out", "compressed", "--overwrite"], 2,
     r"holds 'compressed/hf/texts\.txt'"),
    ("compress --overwrite of its --ckpt itself", ["compress", "--ckpt", "compressed", "--data", "sample-corpus", "--out",
                                                   "compressed", "--overwrite"], 2, r"--out '\S*/compressed' is 'compressed'"),
    ("export --overwrite of the export its --ckpt is in", ["export", "--ckpt", "prior_export/last.ckpt", "--out", "prior_export",
                                                           "--overwrite"], 2, r"--out '\S*/prior_export' holds 'prior_export/last\.ckpt'"),
    ("export --overwrite of the export its --tokenizer is in", ["export", "--ckpt", CKPT, "--tokenizer", "prior_export/tokenizer",
                                                                "--out", "prior_export", "--overwrite"], 2,
     r"holds 'prior_export/tokenizer'"),
    ("analyze --out holding its --text", ["analyze", "--ckpt", CKPT, "--text", "prior_analysis/analysis.json", "--out",
                                          "prior_analysis"], 2, r"--out '\S*prior_analysis' holds 'prior_analysis/analysis\.json'"),
    ("analyze --out its own run folder", ["analyze", "--ckpt", "runs/demo/version_0", "--out", "runs/demo/version_0"], 2,
     r"--out '\S*/runs/demo/version_0' is 'runs/demo/version_0'"),
    *[(f"{command} of a run that diverged", argv, 2, DIVERGED_RUN) for command, argv in readers("runs/diverged/version_0")],
    ("fine-tuning from an experiment whose run diverged", [*FINETUNE, *SHORT, "--model.init_args.checkpoint",
                                                           "runs/diverged"], 2,
     r"'runs/diverged' holds no finished run with a checkpoint \(runs: version_0 \(diverged\)\)"),
    # a file written in place (a lock, hparams.yaml, a log) that is a link is refused, and what it points to kept
    *[(f"a symlinked {what}", argv, 2, rf"{what} \S*/{re.escape(name)} is a symbolic link \(to \S*mine/notes\.txt\): "
       rf"lit-embed writes no file in place through it") for what, name, argv in (
        ("run folder's lock", "runs/linked_lock/version_0/.lock",
         [*DEMO, *SHORT, "--trainer.default_root_dir", "runs/linked_lock", "--ckpt_path", "last"]),
        ("run folder's hyperparameters", "runs/linked_hparams/version_0/hparams.yaml",
         [*DEMO, *SHORT, "--trainer.default_root_dir", "runs/linked_hparams", "--ckpt_path", "last"]),
        ("sweep folder's lock", "sweep_lock/.launch.lock", ["sweep", "--config", "lock.sweep.yaml"]),
        ("sweep run's log", "sweep_log/logs/fit/run/output.log", ["sweep", "--config", "log.sweep.yaml", "--launcher",
                                                                   "inline"]))],
    *[(f"{command}: the newest run was killed before its results", [*argv("runs/killed")], 2,
       r"'runs/killed' holds no finished run with a checkpoint \(runs: version_0 \(has no results: killed")
      for command, (argv, _) in REBUILDERS.items()],
    *[(f"{command} of weights holding NaN", argv, 2,
       r"nan\.ckpt' holds non-finite weights: \S+ has 1 NaN value\(s\) of \d+: it gives no usable model")
      for command, argv in readers("nan.ckpt")],
    *[(f"a budget of {value}", argv, 2, rf"budget={shown} is not a finite number: give a fraction in \(0, 1\]")
      for value, shown, argv in (
        ("NaN", "nan", ["params", "--config", str(CONFIGS / "demo.yaml"), "--model.init_args.embedding", "nan_budget.yaml"]),
        ("inf", "inf", [*DEMO, *SHORT, "--model.init_args.embedding", "inf_budget.yaml"]),
        ("1e400", "inf", ["compress", "--ckpt", "all-MiniLM-L6-v2", "--data", "sample-corpus", "--method", "svd", "--budget", "1e400",
                          "--out", "out_c"]))],
    # every line of predict's input gets its row of output, or the command names the line that would not
    *[(f"predict ({model}): {what}", [*argv, "--data.init_args.predict_input", name], 2, message)
      for model, argv in (("MaskedLM", ["predict", "--config", str(CONFIGS / "demo.yaml"), "--ckpt_path", CKPT]),
                          ("classifier", ["predict", "--config", "own.yaml", "--ckpt_path", "classifier.ckpt"]))
      for what, name, message in (
        ("a blank line", "blank_line.txt", r"predict_input \S*blank_line\.txt:2: the line is blank"),
        ("a line not UTF-8", "not_utf8.txt", r"\S*not_utf8\.txt:2: not valid UTF-8"))],
    # a file written is never what the command reads, nor a file there already unless --overwrite, nor a folder
    ("convert OUT = IN, even with --overwrite", ["convert", "--trust", "weights.ckpt", "weights.ckpt", "--overwrite"], 2,
     r"OUT 'weights\.ckpt' is 'weights\.ckpt', which this command reads"),
    ("convert over a user's file", ["convert", "--trust", "weights.ckpt", "mine/notes.txt"], 2,
     r"OUT 'mine/notes\.txt' exists: choose another OUT or pass --overwrite"),
    ("convert into a folder", ["convert", "--trust", "weights.ckpt", "mine", "--overwrite"], 2,
     r"OUT 'mine' is a folder: give the name of a file"),
    ("report over a user's file", ["report", "runs/demo", "-o", "mine/notes.txt"], 2,
     r"--output 'mine/notes\.txt' exists: choose another --output or pass --overwrite"),
    ("report into a folder", ["report", "runs/demo", "-o", "mine", "--overwrite"], 2, r"--output 'mine' is a folder"),
    ("convert a missing file", ["convert", "--trust", "nowhere.ckpt", "out_c"], 2, r"IN 'nowhere\.ckpt' does not exist"),
    ("convert a file that is no checkpoint", ["convert", "--trust", "random.ckpt", "out_c"], 2,
     r"IN 'random\.ckpt' is not a readable checkpoint"),
    ("--ckpt_path last of a run that diverged", [*DEMO, *SHORT, "--trainer.default_root_dir", "runs/diverged",
                                                 "--ckpt_path", "last"], 2,
     r"--ckpt_path last: the newest checkpoint under runs/diverged is .*, which diverged \(the training loss was nan at "
     r"step 3\): .*Start a new run"),
]


@pytest.fixture(scope="module")
def matrix(workspace) -> dict[str, dict]:
    """Every case of :data:`CASES`, run once in a fresh process; the files before and after."""
    before, runs = snapshot(workspace), run_folders(workspace)
    results = drive([(case, argv) for case, argv, _, _ in CASES], workspace, env(workspace), workspace / "cases.json")
    (workspace / "cases.json").unlink()
    return {"results": results, "before": before, "after": snapshot(workspace), "runs": (runs, run_folders(workspace))}


def run_folders(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("version_*") if p.is_dir())


@pytest.mark.parametrize(("case", "argv", "status", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_fault_exits_with_a_message_naming_it(case, argv, status, message, matrix):
    import re

    if case == "GPU without one" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = matrix["results"][case]
    assert result["status"] == status, result["stderr"][-3000:]
    assert "Traceback" not in result["stderr"], result["stderr"][-3000:]
    assert re.search(message, result["stderr"], flags=re.S), result["stderr"][-2000:]


def test_no_fault_loses_or_half_writes_anything(matrix, workspace):
    before, after = matrix["before"], matrix["after"]
    assert {k: v for k, v in after.items() if k in before} == before  # nothing changed or removed
    new = sorted(set(after) - set(before))
    assert not [p for p in new if p.endswith((".ckpt", "results.json", ".tmp"))], new
    assert not (workspace / "PWNED").exists()  # the crafted checkpoints ran nothing
    before_runs, after_runs = matrix["runs"]
    assert after_runs == before_runs  # a refused run leaves no version_N (with only its lock and config) behind
    assert not list(workspace.glob(".out_c*")) and not (workspace / "out_c").exists()


# -- real processes: a bug's traceback, signals, runs at once ----------------------------------------------------


def lit_embed(args: list[str], cwd: Path, path: Path | None = None) -> subprocess.Popen:
    """``lit-embed ARGS`` as its own process (``path``: a folder of the user's modules to import)."""
    environment = env(cwd)
    if path is not None:
        environment["PYTHONPATH"] = os.pathsep.join([str(path), environment["PYTHONPATH"]])
    return subprocess.Popen([sys.executable, "-m", "lit_embed.commands", *args], cwd=cwd, env=environment, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def finish(process: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
    try:
        _, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, err


def test_a_bug_keeps_its_traceback(tmp_path):
    """An error lit-embed did not foresee is not dressed up as a user error: exit 1, with the traceback."""
    (tmp_path / "buggy.py").write_text(
        "from lit_embed.embeddings import DenseEmbedding\n\n"
        "class Buggy(DenseEmbedding):\n"
        "    def forward(self, codes):\n"
        "        raise RuntimeError('a bug in a strategy')\n"
    )
    config = json.dumps({"class_path": "buggy.Buggy"})
    process = lit_embed([*DEMO, *SHORT, "--model.init_args.embedding", config], tmp_path, path=tmp_path)
    status, err = finish(process)
    assert status == 1 and "Traceback" in err and "RuntimeError: a bug in a strategy" in err, err[-2000:]


def wait_for(path_glob: str, root: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not list(root.glob(path_glob)):
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no {path_glob} after {timeout} s"
        time.sleep(0.2)


def wait_for_a_step(run: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    """Until ``run``'s TensorBoard events hold a training step's loss (``log_every_n_steps`` 1): a step was taken,
    however slow the machine."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run))
    deadline = time.monotonic() + timeout
    while "train/loss" not in events.Reload().Tags()["scalars"]:
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no step logged in {run} after {timeout} s"
        time.sleep(0.2)


LONG = [*QUIET, "--trainer.max_steps", "100000", "--trainer.val_check_interval", "100000", "--data.init_args.batch_size", "4"]


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_a_resumable_checkpoint_and_exits_non_zero(signum, status, tmp_path, monkeypatch):
    from lit_embed.commands import main

    process = lit_embed([*DEMO, *LONG, "--trainer.log_every_n_steps", "1"], tmp_path)
    wait_for("runs/demo/version_0/events.out.tfevents.*", tmp_path, process)
    wait_for_a_step(tmp_path / "runs/demo/version_0", process)
    os.kill(process.pid, signum)
    code, err = finish(process)
    assert code == status, err[-3000:]
    assert f"stopped by {signal.Signals(signum).name}" in err
    run = tmp_path / "runs/demo/version_0"
    saved = torch.load(run / "checkpoints/last.ckpt", weights_only=True)
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "interrupted" and results["global_step"] == saved["global_step"] > 0
    # resumed (in this process: the signal went to the other), it continues in its own folder from the step it stopped at
    monkeypatch.chdir(tmp_path)
    assert main([*DEMO, *QUIET, "--trainer.max_steps", str(saved["global_step"] + 2), "--trainer.limit_val_batches", "2",
                 "--data.init_args.batch_size", "4", "--ckpt_path", "last"]) == 0
    assert sorted(p.name for p in (tmp_path / "runs/demo").iterdir()) == ["version_0"]
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "complete" and results["global_step"] == saved["global_step"] + 2


def test_a_signal_during_validation_validates_again_when_the_run_resumes(tmp_path, monkeypatch):
    """Stopped between two validation batches, a resumed fit runs that validation again from its first batch: its
    metrics and the checkpoint chosen by them are not lost (Lightning would skip the rest of it). Both runs in this
    process (the probe signals the process it runs in, as the fits' tests below do)."""
    from lit_embed.commands import main

    monkeypatch.chdir(tmp_path)
    probe = {"class_path": "tests.helpers.probes.SignalAt",
             "init_args": {"marker": str(tmp_path / "sent"), "log": str(tmp_path / "validations.jsonl"), "batch": 1}}
    callbacks = [{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint", "init_args": {"save_last": True}},
                 {"class_path": "lit_embed.callbacks.ResultsWriter"}, probe]
    args = [*DEMO, *QUIET, "--trainer.max_steps", "4", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches",
            "3", "--data.init_args.batch_size", "4", "--trainer.callbacks", json.dumps(callbacks)]
    assert main(args) == 143 and (tmp_path / "sent").exists()
    assert not (tmp_path / "validations.jsonl").exists()  # the first validation never finished
    assert main([*args, "--ckpt_path", "last"]) == 0
    validations = [json.loads(line) for line in (tmp_path / "validations.jsonl").read_text().splitlines()]
    assert [(v["step"], v["batches"]) for v in validations] == [(2, 3), (4, 3)], validations
    assert "val/loss" in validations[0]["metrics"]
    results = json.loads((tmp_path / "runs/demo/version_0/results.json").read_text())
    assert results["status"] == "complete" and "val/loss" in results["metrics"]


def test_two_runs_started_together_keep_their_own_folders(tmp_path):
    every_step = json.dumps([{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint",
                              "init_args": {"every_n_train_steps": 1, "save_top_k": -1, "save_last": True}},
                             {"class_path": "lit_embed.callbacks.ResultsWriter"}])
    runs = [lit_embed([*DEMO, *SHORT, "--seed_everything", str(seed), "--trainer.callbacks", every_step], tmp_path)
            for seed in (1, 2)]
    for process in runs:
        code, err = finish(process)
        assert code == 0, err[-3000:]
    folders = sorted((tmp_path / "runs/demo").iterdir())
    assert [f.name for f in folders] == ["version_0", "version_1"]
    seeds = sorted(json.loads((f / "results.json").read_text())["seed"] for f in folders)
    assert seeds == [1, 2]
    for folder in folders:
        names = sorted(p.name for p in (folder / "checkpoints").iterdir() if not p.name.startswith("."))
        assert names[-1] == "last.ckpt" and len(names) == 5, names


def test_a_checkpoint_folder_held_by_a_live_run_is_refused(tmp_path):
    shared = tmp_path / "shared"
    callbacks = json.dumps([{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint",
                             "init_args": {"dirpath": str(shared), "every_n_train_steps": 1, "save_last": True}}])
    first = lit_embed([*DEMO, *LONG, "--trainer.callbacks", callbacks], tmp_path)
    try:
        wait_for("shared/last.ckpt", tmp_path, first)
        run = tmp_path / "runs/demo/version_0"
        config = (run / "config.yaml").read_bytes()
        # its checkpoint folder; a checkpoint folder inside its run folder; that folder as another run's (no logger):
        # each asked for in turn by one other process
        inside = json.dumps([{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint",
                              "init_args": {"dirpath": str(run / "mine"), "every_n_train_steps": 1}}])
        refused = drive([
            ("checkpoints", [*DEMO, *SHORT, "--trainer.callbacks", callbacks]),
            ("inside", [*DEMO, *SHORT, "--trainer.default_root_dir", "runs/other", "--trainer.callbacks", inside]),
            ("run folder", [*DEMO, *SHORT, "--trainer.logger", "false", "--trainer.default_root_dir", str(run)]),
        ], tmp_path, env(tmp_path), tmp_path / "cases.json")
        for case, message in (("checkpoints", f"checkpoint folder {shared} is in use by a live run"),
                              ("inside", f"inside {run}, which it holds"),
                              ("run folder", f"run folder {run} is in use by a live run")):
            assert refused[case]["status"] == 2 and message in refused[case]["stderr"], refused[case]["stderr"][-2000:]
        assert (run / "config.yaml").read_bytes() == config and not (run / "mine").exists()
        assert first.poll() is None  # the first run goes on
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()


def test_a_sweep_run_by_hand_while_a_launch_of_its_sweep_runs_is_refused(tmp_path):
    """The launch would run it too (two versions of one run, the later silently winning): ``sweep --run`` exits 2 while
    a live process holds the sweep's launch lock, and writes nothing; a run the launch started itself is let through."""
    import fcntl

    from lit_embed.runs.folders import LAUNCH_LOCK

    sweep = {"folder": str(tmp_path / "sweep"), "stages": {"fit": {"config": str(CONFIGS / "demo.yaml"), "set": {
        "trainer.max_steps": 2, "trainer.limit_val_batches": 1, "data.init_args.batch_size": 4}}}}
    (tmp_path / "s.sweep.yaml").write_text(json.dumps(sweep))
    (tmp_path / "sweep").mkdir()
    fd = os.open(tmp_path / "sweep" / LAUNCH_LOCK, os.O_WRONLY | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a launch, alive
        refused = drive([("by hand", ["sweep", "--config", "s.sweep.yaml", "--run", "fit/run"])], tmp_path, env(tmp_path),
                        tmp_path / "cases.json")["by hand"]
    finally:
        os.close(fd)
    assert refused["status"] == 2, refused["stderr"][-2000:]
    assert f"sweep folder {tmp_path / 'sweep'} is in use by a live `lit-embed sweep` launch, which runs fit/run itself" \
        in refused["stderr"]
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == [LAUNCH_LOCK]  # nothing written


@pytest.mark.parametrize(("given", "refused"), [
    ("out", "is"), ("out/hf", "holds"), ("out/hf/model.safetensors", "holds"), ("link_into_out", "holds"),
    ("link_to_out", "is"), ("sibling", None), (".", None), ("out_2", None), ("all-MiniLM-L6-v2", None), ("nowhere/x", None),
])
def test_an_output_is_never_what_the_command_reads_nor_holds_it(tmp_path, monkeypatch, given, refused):
    """What --overwrite (or analyze's --out) would replace: an input inside it, or the folder itself, is refused
    (symlinks followed); an --out beside or inside an input, and names that are no local path, are not."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out" / "hf").mkdir(parents=True)
    (tmp_path / "out" / "hf" / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "sibling").mkdir()
    (tmp_path / "out_2").mkdir()
    (tmp_path / "link_into_out").symlink_to(tmp_path / "out" / "hf")
    (tmp_path / "link_to_out").symlink_to(tmp_path / "out")
    accepted = []
    if refused is None:
        check_output(Path("out"), True, accepted.append, [given])
        assert accepted == [(tmp_path / "out").absolute()]
    else:
        with pytest.raises(OutputExistsError, match=rf"--out '{tmp_path}/out' {refused} '{given}', which this command reads"):
            check_output(Path("out"), True, accepted.append, [given])
        assert not accepted


@pytest.mark.parametrize("kind", ["link", "fifo", "folder"])
def test_a_file_written_in_place_is_never_written_through_what_stands_there(kind, tmp_path):
    """A lock or a log opened for writing: a link to a user's file, a FIFO (which would block the open) or a folder in
    its place is refused by name; the user's file keeps its bytes."""
    from lit_embed.errors import RedirectedWriteError
    from lit_embed.storage.files import open_in_place

    user = tmp_path / "notes.txt"
    user.write_text("a user's file")
    path = tmp_path / ".lock"
    {"link": lambda: path.symlink_to(user), "fifo": lambda: os.mkfifo(path), "folder": path.mkdir}[kind]()
    found = {"link": f"a symbolic link \\(to {user}\\)", "fifo": "not a regular file", "folder": "a folder"}[kind]
    with pytest.raises(RedirectedWriteError, match=f"the lock {path} is {found}: .* remove it"):
        os.close(open_in_place(path, "the lock", append=True))
    assert user.read_text() == "a user's file"
    os.close(open_in_place(tmp_path / "new.log", "the log", append=True))  # a new file, or a regular one, opens
    os.close(open_in_place(tmp_path / "new.log", "the log", append=True))


def test_every_line_of_a_text_input_is_a_row_or_named(tmp_path):
    """Blank lines at the end are no rows; every other line is one, and one without a text is refused by number."""
    from lit_embed.data.sources import text_lines
    from lit_embed.errors import ConfigError

    (tmp_path / "in.txt").write_text("a <mask>\n b\n\tc\td\n\n \n")
    assert text_lines(str(tmp_path / "in.txt")) == ["a <mask>", " b", "\tc\td"]
    (tmp_path / "in.txt").write_text("a\n\t\nb\n")
    with pytest.raises(ConfigError, match=r"in\.txt:2: the line is blank"):
        text_lines(str(tmp_path / "in.txt"))


@pytest.mark.parametrize(("reference", "refused"), [
    ("modeling_lit_embed.LitEmbedModel", False), ("someone/repo--modeling.Evil", True), ("../elsewhere/mod.Evil", True),
    ("linked.Evil", True), ("absent.Evil", True), ("a.b.Evil", True),
])
def test_an_exports_auto_map_names_only_code_it_holds(reference, refused, workspace, tmp_path):
    """What trust_remote_code=True would run: lit-embed's loaders of an export refuse an auto_map entry naming a hub
    repository's code, a path out of the folder, a module that is a link (here, to the user's own module) or absent."""
    from lit_embed.checkpoints.recorded import check_auto_map
    from lit_embed.errors import ConfigError

    folder = tmp_path / "export"
    shutil.copytree(workspace / "exported", folder)
    (folder / "linked.py").symlink_to(workspace / "evil_code.py")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": {**config["auto_map"], "AutoModel": reference}}))
    if not refused:
        check_auto_map(folder)
        return
    with pytest.raises(ConfigError, match=rf"has auto_map AutoModel={re.escape(repr(reference))}, which names code "
                                          rf"outside {folder}"):
        check_auto_map(folder)


def test_an_atomic_write_onto_a_folder_names_the_folder_and_leaves_nothing(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(OutputExistsError, match=rf"'{tmp_path}/out' is a folder: give the name of a file to write"):
        with atomic_writer(tmp_path / "out") as handle:
            handle.write(b"x")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and not list((tmp_path / "out").iterdir())


def test_a_full_disk_names_the_device_and_keeps_the_old_file(tmp_path):
    """A checkpoint save onto a full filesystem."""
    with small_disk(tmp_path / "disk", "1m") as disk:
        (disk / "last.ckpt").write_bytes(b"the previous checkpoint")
        with pytest.raises(DiskFullError, match=f"no space left on {disk} writing {disk}/last.ckpt"):
            with atomic_writer(disk / "last.ckpt") as handle:
                torch.save({"weights": torch.zeros(1_000_000)}, handle)
        assert (disk / "last.ckpt").read_bytes() == b"the previous checkpoint"
        assert [p.name for p in disk.iterdir()] == ["last.ckpt"]


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077], ids=lambda mask: f"umask {mask:03o}")
def test_every_file_written_gets_the_users_umask_whoever_created_it(umask, tmp_path):
    """What atomic_writer writes (through mkstemp, which makes files 0600) and what a library writes inside an
    atomic_folder (safetensors makes its files 0600 too; a subfolder) get the modes ``open`` and ``mkdir`` give."""
    from lit_embed.storage.files import atomic_folder, write_atomic

    def fill(folder: Path) -> None:
        safetensors.torch.save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
        (folder / "tokenizer").mkdir()
        write_atomic(folder / "tokenizer" / "vocab.txt", "a\n")

    before = os.umask(umask)
    try:
        write_atomic(tmp_path / "results.json", "{}")
        atomic_folder(tmp_path / "export", False, fill, replaceable=lambda out: None)
    finally:
        os.umask(before)
    modes = {p.relative_to(tmp_path).as_posix(): p.stat().st_mode & 0o777 for p in tmp_path.rglob("*")}
    file, folder = 0o666 & ~umask, 0o777 & ~umask
    assert modes == {"results.json": file, "export": folder, "export/model.safetensors": file,
                     "export/tokenizer": folder, "export/tokenizer/vocab.txt": file}


# -- every writer on a full disk ---------------------------------------------------------------------------------


def fill_at(hook: str) -> dict:
    return {"class_path": "tests.helpers.probes.FillDisk", "init_args": {"folder": "DISK", "at": hook}}


CHECKPOINT_LAST = {"class_path": "pytorch_lightning.callbacks.ModelCheckpoint", "init_args": {"save_last": True}}
RESULTS_WRITER = {"class_path": "lit_embed.callbacks.ResultsWriter"}
FOUR_STEPS = [*QUIET, "--trainer.max_steps", "4", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "2",
              "--data.init_args.batch_size", "4", "--trainer.default_root_dir", "DISK/runs"]
COMPRESS_MINILM = ["compress", "--ckpt", "all-MiniLM-L6-v2", "--data", "sample-corpus", "--method", "unk", "--out", "DISK/c"]
#: id, the bytes left free when the command starts (``None``: the run fills its disk itself, FillDisk), the command
#: (DISK: a filesystem of its own), the file its message must name (a regex, under DISK).
FULL_DISK = [
    ("export", 0, ["export", "--ckpt", CKPT, "--out", "DISK/export"], r"export"),
    ("analyze", 0, ["analyze", "--ckpt", CKPT, "--max-texts", "4", "--points", "50", "--no-tensorboard", "--out",
                    "DISK/analysis"], r"analysis"),
    ("compress, the model's own files on a nearly full disk", 200_000, COMPRESS_MINILM, r"c"),
    ("compress, the weights (safetensors) on a full disk", 3_000_000, COMPRESS_MINILM, r"c"),
    ("fit, a checkpoint", None, [*DEMO, *FOUR_STEPS, "--trainer.callbacks",
                                 json.dumps([fill_at("on_train_start"), CHECKPOINT_LAST, RESULTS_WRITER])],
     r"runs/version_0/checkpoints/\S+\.ckpt"),
    ("fit, results.json", None, [*DEMO, *FOUR_STEPS, "--trainer.callbacks",
                                 json.dumps([CHECKPOINT_LAST, fill_at("on_train_end"), RESULTS_WRITER])],
     r"runs/version_0/results\.json"),
    ("predict, predictions", None, ["predict", "--config", str(CONFIGS / "demo.yaml"), "--ckpt_path", CKPT, *QUIET,
                                    "--data.init_args.predict_input", "masks.txt", "--output", "DISK/predicted",
                                    "--trainer.callbacks", json.dumps([fill_at("on_predict_start")])],
     r"predicted/predictions\.jsonl"),
    ("sweep, a run's status", None, ["sweep", "--config", "DISK.sweep.yaml", "--run", "fit/run"],
     r"sweep/logs/fit/run/status\.json"),
]


@pytest.fixture(scope="module")
def full_disks(workspace, tmp_path_factory):
    """Every case of :data:`FULL_DISK` on a filesystem of its own, run once in a fresh process."""
    root = tmp_path_factory.mktemp("disks")
    cases, disks = [], {}
    with contextlib.ExitStack() as mounts:
        for number, (case, left, argv, _) in enumerate(FULL_DISK):
            disk = disks[case] = mounts.enter_context(small_disk(root / str(number), "16m"))
            if left is not None:
                fill(disk, leave=left)
            sweep = {"folder": f"{disk}/sweep", "stages": {"fit": {"config": str(CONFIGS / "demo.yaml"), "set": {
                "trainer.max_steps": 2, "trainer.limit_val_batches": 1, "trainer.enable_progress_bar": False,
                "data.init_args.batch_size": 4, "trainer.callbacks": [fill_at("on_train_start"), RESULTS_WRITER]}}}}
            (root / f"{number}.sweep.yaml").write_text(json.dumps(sweep).replace('"DISK"', json.dumps(str(disk))))
            argv = [a.replace("DISK.sweep.yaml", str(root / f"{number}.sweep.yaml")).replace("DISK", str(disk)) for a in argv]
            cases.append((case, argv))
        (workspace / "masks.txt").write_text("The cat sat on the <mask>.\n")
        results = drive(cases, workspace, env(workspace), root / "cases.json")
        left = {case: sorted(str(p.relative_to(disk)) for p in disk.rglob("*") if p.name != BALLAST)
                for case, disk in disks.items()}
        kept = {case: _whole(disk) for case, disk in disks.items()}
        yield {"results": results, "disks": disks, "left": left, "kept": kept}
    (workspace / "masks.txt").unlink()


def _whole(disk: Path) -> dict[str, bool]:
    """Whether each checkpoint and JSON file on ``disk`` reads whole."""
    whole = {}
    for path in disk.rglob("*"):
        if path.suffix == ".ckpt":
            whole[path.name] = bool(torch.load(path, weights_only=True).get("state_dict"))
        elif path.suffix == ".json":
            whole[path.name] = isinstance(json.loads(path.read_text()), dict)
    return whole


@pytest.mark.parametrize(("case", "left", "argv", "named"), FULL_DISK, ids=[c[0] for c in FULL_DISK])
def test_every_writer_on_a_full_disk_names_the_file_and_its_device_and_half_writes_nothing(case, left, argv, named,
                                                                                            full_disks):
    import re

    result, disk = full_disks["results"][case], full_disks["disks"][case]
    assert result["status"] == 2, result["stderr"][-3000:]
    assert "Traceback" not in result["stderr"], result["stderr"][-3000:]
    assert re.search(rf"error: no space left on {disk} writing {disk}/{named}: free space", result["stderr"]), \
        result["stderr"][-2000:]
    files = full_disks["left"][case]
    assert not [f for f in files if f.endswith(".tmp") or ".building-" in f], files  # no temporary file stays
    if left is not None:  # an output folder: absent, as before the command
        assert files == [], files
    assert all(full_disks["kept"][case].values()), full_disks["kept"][case]  # what was written is whole
    assert not [f for f in files if f.endswith(("results.json", "predictions.jsonl"))], files


@pytest.mark.parametrize(("case", "limit", "argv", "named"), [
    ("export, a folder", 200_000, ["export", "--ckpt", "CKPT", "--out", "export"], "export"),
    ("fit, a checkpoint", 1_500_000, [*DEMO, *QUIET, "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0",
                                      "--data.init_args.batch_size", "4"], r"runs/demo/version_0/checkpoints/\S+\.ckpt"),
], ids=["export", "fit"])
def test_a_file_size_limit_is_said_as_a_full_disk_is_and_half_writes_nothing(case, limit, argv, named, workspace,
                                                                           tmp_path):
    """EFBIG (ulimit -f: Python ignores SIGXFSZ, so the write fails) is one line naming the file and the limit, exit 2,
    as ENOSPC is; the output is absent, no temporary file stays. ``limit``, bytes: above the demo data's cache (1.2 MB),
    below its checkpoint (2.1 MB); the export's, below its tokenizer files (the largest 0.7 MB)."""
    import resource

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    args = [a.replace("CKPT", str(workspace / CKPT)) for a in argv]
    done = subprocess.run([sys.executable, "-m", "lit_embed.commands", *args], cwd=tmp_path, env=env(tmp_path),
                          capture_output=True, text=True, timeout=600, preexec_fn=limited)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert re.search(rf"error: file too large writing ({tmp_path}/)?{named} on \S+: it met a file-size limit \(the shell's "
                     r"ulimit -f", done.stderr), done.stderr[-2000:]
    left = [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if "cache" not in p.parts]
    assert not [f for f in left if f.endswith((".tmp", ".ckpt", "results.json")) or "building" in f], left
    assert not (tmp_path / "export").exists()


# -- a signal between fit's training and its test ---------------------------------------------------------------


def fine_tune_args(tmp_path: Path, *callbacks: dict, save_last: bool = True) -> list[str]:
    """A 4-step fine-tuning from scratch that tests its best checkpoint after fit, with ``callbacks``."""
    saved = [{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint",
              "init_args": {"monitor": "val/score", "mode": "max", "save_last": save_last}},
             {"class_path": "lit_embed.callbacks.ResultsWriter"}, *callbacks]
    return [*FINETUNE, *QUIET, "--model.init_args.checkpoint", "null", "--data.init_args.tokenizer", "all-MiniLM-L6-v2",
            "--trainer.max_steps", "4", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "2",
            "--trainer.limit_test_batches", "2", "--data.init_args.batch_size", "4", "--trainer.default_root_dir",
            str(tmp_path / "runs/ft"), "--trainer.callbacks", json.dumps(saved)]


@pytest.mark.parametrize("hook", ["last_train_batch", "last_validation", "on_train_end", "on_fit_end", "on_test_start",
                                  "first_test_batch"])
def test_a_signal_between_fits_training_and_its_test_leaves_the_run_to_finish_not_complete(hook, tmp_path, monkeypatch):
    """SIGTERM at each point from fit's last step to its test's first batch: exit 143 and results.json not complete
    (the run is not done); --ckpt_path last then trains nothing more and runs the test, which completes it."""
    from lit_embed.commands import main

    monkeypatch.chdir(tmp_path)
    signal_in = {"class_path": "tests.helpers.probes.SignalIn", "init_args": {"hook": hook, "marker": str(tmp_path / "sent")}}
    assert main(fine_tune_args(tmp_path, signal_in)) == 143
    run = tmp_path / "runs/ft/version_0"
    stopped = json.loads((run / "results.json").read_text())
    assert stopped["status"] in ("interrupted", "untested") and not any(m.startswith("test/") for m in stopped["metrics"])
    assert torch.load(run / "checkpoints/last.ckpt", weights_only=True)["global_step"] == 4  # the fit's end
    assert main([*fine_tune_args(tmp_path), "--ckpt_path", "last"]) == 0
    finished = json.loads((run / "results.json").read_text())
    assert finished["status"] == "complete" and finished["global_step"] == 4
    assert {"test/accuracy", "val/accuracy"} <= set(finished["metrics"])  # tested, its validation scores kept
    assert finished["checkpoint"]["best"] == stopped["checkpoint"]["best"]  # the model it tested: its best


@pytest.mark.parametrize("hook", ["on_fit_end", "first_test_batch"])
def test_a_signal_before_the_test_leaves_what_the_resume_needs_where_the_config_saves_no_last(hook, tmp_path,
                                                                                            monkeypatch):
    """The config keeps only its best checkpoint (no save_last): training's end still writes last.ckpt, since a test
    follows, so SIGTERM before the test leaves a run that --ckpt_path last tests without training again."""
    from lit_embed.commands import main

    monkeypatch.chdir(tmp_path)
    signal_in = {"class_path": "tests.helpers.probes.SignalIn", "init_args": {"hook": hook, "marker": str(tmp_path / "sent")}}
    assert main(fine_tune_args(tmp_path, signal_in, save_last=False)) == 143
    run = tmp_path / "runs/ft/version_0"
    assert json.loads((run / "results.json").read_text())["status"] in ("interrupted", "untested")
    assert torch.load(run / "checkpoints/last.ckpt", weights_only=True)["global_step"] == 4
    assert main([*fine_tune_args(tmp_path, save_last=False), "--ckpt_path", "last"]) == 0
    finished = json.loads((run / "results.json").read_text())
    assert finished["status"] == "complete" and finished["global_step"] == 4 and "test/accuracy" in finished["metrics"]
    assert sorted(p.name for p in (tmp_path / "runs/ft").iterdir()) == ["version_0"]  # resumed in place, not afresh


@pytest.mark.parametrize(("hook", "status"), [("on_train_end", 0), ("on_fit_end", 0), ("fit_teardown", 143)])
def test_a_fit_that_exits_on_a_signal_is_never_complete_and_one_that_finished_says_so(hook, status, tmp_path, monkeypatch,
                                                                                        capsys):
    """Pre-training (no test): a signal as the fit ends lets it finish (exit 0, complete); one that stops what is left
    of the command (past the trainer's loops) exits 143 and leaves the run interrupted, which --ckpt_path last
    completes without training."""
    from lit_embed.commands import main

    monkeypatch.chdir(tmp_path)
    signal_in = {"class_path": "tests.helpers.probes.SignalIn", "init_args": {"hook": hook, "marker": str(tmp_path / "sent")}}
    args = [*DEMO, *SHORT]
    assert main([*args, "--trainer.callbacks+", json.dumps(signal_in)]) == status
    err = capsys.readouterr().err
    run = tmp_path / "runs/demo/version_0"
    results = json.loads((run / "results.json").read_text())
    if status == 0:
        assert "SIGTERM arrived as the command finished; it finished" in err and results["status"] == "complete"
        return
    assert "stopped by SIGTERM" in err and results["status"] == "interrupted"
    assert main([*args, "--ckpt_path", "last"]) == 0
    finished = json.loads((run / "results.json").read_text())
    assert finished["status"] == "complete" and finished["global_step"] == 4
    assert finished["metrics"] == results["metrics"] and finished["efficiency"] == results["efficiency"]
