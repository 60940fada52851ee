"""DDP on the CPU (2 processes over gloo, ``configs/trainer/ddp_cpu.yaml``): real ``lit-embed`` runs.

Each DDP run is the user's command in a subprocess (``python -m lit_embed.commands fit ... --trainer
configs/trainer/ddp_cpu.yaml``): Lightning's ``ddp`` strategy then starts rank 1 the way it does on
GPUs, which ``ddp_spawn`` would not (it pickles the model into fresh processes instead). The
subprocess runs in its own process group with a time limit, and the whole group is killed when it
is exceeded, so a hung collective fails the test instead of hanging CI. The single-process runs
that each DDP run is compared with run in this process. ``tests/helpers/ddp_probe.py`` records what every
rank saw and holds.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_embed.commands import main
from lit_embed.embeddings import Assignment
from tests.helpers import CONFIGS, REPO
from tests.helpers.ddp_probe import load

DDP_CPU = str(CONFIGS / "trainer" / "ddp_cpu.yaml")
STEPS = 6
#: 8 blocks per optimiser step: one process takes all 8, each of 2 ranks takes 4.
GLOBAL_BATCH = ["--data.init_args.global_batch_size", "8", "--data.init_args.batch_size", "8"]
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
NO_DROPOUT = ["--model.init_args.encoder.init_args.dropout", "0.0", "--model.init_args.encoder.init_args.attention_dropout", "0.0"]


def run_ddp(args: list[str], cwd: Path, timeout: float = 240) -> str:
    """``lit-embed`` on 2 CPU processes; its output. Killed with its children past ``timeout``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "lit_embed.commands", *args, "--trainer", DDP_CPU]
    process = subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the DDP run did not finish in {timeout} s:\n{output[-3000:]}")
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # no rank outlives the test
        except ProcessLookupError:
            pass
    return output if process.returncode == 0 else f"exit {process.returncode}\n{output}"


def probe(out: Path, **init_args) -> dict:
    return {"class_path": "tests.helpers.ddp_probe.Probe", "init_args": {"out": str(out), **init_args}}


def checkpoints(every: int, dirpath: Path | None = None) -> dict:
    init_args = {"every_n_train_steps": every, "save_top_k": -1, "save_last": True, "filename": "{step}"}
    if dirpath is not None:
        init_args["dirpath"] = str(dirpath)
    return {"class_path": "pytorch_lightning.callbacks.ModelCheckpoint", "init_args": init_args}


def callbacks(*items: dict) -> list[str]:
    return ["--trainer.callbacks", json.dumps(list(items))]


def check_ranks_agree(ranks: list[dict]) -> None:
    """Two ranks, the same strategy state, the same weights after the same number of steps."""
    assert [r["world_size"] for r in ranks] == [2, 2]
    zero, one = ranks
    assert zero["buffers"].keys() == one["buffers"].keys()
    for name, value in zero["buffers"].items():
        assert torch.equal(value, one["buffers"][name]), name
    assert zero["weights"].keys() == one["weights"].keys()
    for name, value in zero["weights"].items():
        assert torch.equal(value, one["weights"][name]), name
    assert zero["global_step"] == one["global_step"] > 0


def check_like_one_process(ranks: list[dict], single: dict, tolerance: float) -> None:
    """Each global batch holds the same blocks as the single process's, and the losses agree."""
    if single["steps"][0]["index"] is not None:
        for step, (a, b, s) in enumerate(zip(ranks[0]["steps"], ranks[1]["steps"], single["steps"])):
            assert sorted(a["index"] + b["index"]) == sorted(s["index"]), f"step {step}"
    ddp_loss = np.mean([[r["steps"][i]["loss"] for r in ranks] for i in range(len(single["steps"]))], axis=1)
    one_loss = np.array([s["loss"] for s in single["steps"]])
    assert np.abs(ddp_loss - one_loss).max() < tolerance, (ddp_loss, one_loss)
    assert ranks[0]["estimated_steps"] == single["estimated_steps"]


# -- MLM with a cluster-assigned subspace strategy ----------------------------------------------------


@pytest.fixture(scope="session")
def clustered(tmp_path_factory) -> str:
    """A 3-sub-embedding whose codes cluster a (random) 30522 x 8 matrix: computed once, on rank 0."""
    matrix = tmp_path_factory.mktemp("matrix") / "matrix.npy"
    np.save(matrix, np.random.default_rng(0).standard_normal((30522, 8)).astype(np.float32))
    assignment = {"class_path": "lit_embed.embeddings.ClusterAssignment",
                  "init_args": {"source": str(matrix), "method": "kmeans", "max_iter": 3}}
    return json.dumps({"class_path": "lit_embed.embeddings.SubspaceEmbedding",
                       "init_args": {"num_tables": 3, "assignment": assignment}})


def mlm_args(root: Path, name: str, embedding: str) -> list[str]:
    return ["fit", "--config", str(CONFIGS / "demo.yaml"), "--model.init_args.embedding", embedding,
            "--trainer.default_root_dir", str(root), "--trainer.logger.init_args.save_dir", str(root),
            "--trainer.logger.init_args.name", name, "--trainer.max_steps", str(STEPS),
            "--trainer.val_check_interval", str(STEPS), "--data.init_args.val_size", "57",  # odd: the sampler pads
            *GLOBAL_BATCH, *NO_DROPOUT, *QUIET]


@pytest.fixture(scope="session")
def mlm_runs(tmp_path_factory, clustered) -> dict[str, Path]:
    """The MLM demo with clustered codes for 6 steps of 8 blocks, on one process and on 2 ranks.

    The DDP run saves last.ckpt every 2 steps (in its run folder, ddp/version_0/checkpoints), is killed
    (SIGKILL, both ranks) after step 5, and resumes with ``--ckpt_path last``, in the same run folder.
    """
    root = tmp_path_factory.mktemp("mlm")
    with pytest.MonkeyPatch.context() as monkeypatch:
        from tests.helpers import go_offline

        go_offline(monkeypatch, tmp_path_factory)
        args = mlm_args(root, "ddp", clustered)
        killed = run_ddp([*args, *callbacks(checkpoints(2), probe(root / "before", kill_at_step=5))], root)
        resumed = run_ddp([*args, "--ckpt_path", "last", *callbacks(checkpoints(2), probe(root / "after"))], root)
        monkeypatch.chdir(root)
        assert main([*mlm_args(root, "one", clustered), *callbacks(probe(root / "one"))]) == 0
    return {"root": root, "killed": killed, "resumed": resumed, "checkpoints": root / "ddp" / "version_0" / "checkpoints"}


def test_mlm_with_clustered_codes_agrees_across_ranks_and_with_one_process(mlm_runs):
    assert not mlm_runs["resumed"].startswith("exit"), mlm_runs["resumed"][-4000:]
    root = mlm_runs["root"]
    before, after, (single,) = load(root / "before"), load(root / "after"), load(root / "one")
    ranks = [{**a, "steps": b["steps"][:4] + a["steps"]} for a, b in zip(after, before)]  # steps 1-4, then 5-6
    check_ranks_agree(ranks)
    assert (ranks[0]["buffers"]["codes"] >= 0).all()  # computed (on rank 0) and shared
    assert torch.equal(ranks[0]["buffers"]["codes"], single["buffers"]["codes"])
    assert [r["accumulate"] for r in ranks] == [1, 1] and single["accumulate"] == 1
    check_like_one_process(ranks, single, tolerance=0.15)
    # Validation: each of the 57 blocks once (the sampler's padding dropped), the same on both ranks.
    assert ranks[0]["metrics"]["val/loss"] == ranks[1]["metrics"]["val/loss"]
    assert abs(ranks[0]["metrics"]["val/loss"] - single["metrics"]["val/loss"]) < 0.05


def test_a_killed_ddp_run_resumes_at_its_last_step_and_data_position(mlm_runs):
    """Killed after step 5 with last.ckpt at step 4: the resumed run trains steps 5 and 6 on exactly
    the blocks each rank would have had (the single process's global batch, every other block)."""
    assert mlm_runs["killed"].startswith("exit -9"), mlm_runs["killed"][-3000:]
    root = mlm_runs["root"]
    before, after, (single,) = load(root / "before"), load(root / "after"), load(root / "one")
    names = sorted(p.name for p in mlm_runs["checkpoints"].iterdir())
    assert names == ["last.ckpt", "step=2.ckpt", "step=4.ckpt", "step=6.ckpt"], names
    for rank in (0, 1):
        assert [s["step"] for s in before[rank]["steps"]] == [1, 2, 3, 4, 5]
        assert after[rank]["started_at"] == 4 and after[rank]["global_step"] == STEPS
        assert [s["step"] for s in after[rank]["steps"]] == [5, 6]
        seen = [s["index"] for s in before[rank]["steps"][:4] + after[rank]["steps"]]
        assert seen == [s["index"][rank::2] for s in single["steps"]]
        assert torch.equal(after[rank]["buffers"]["codes"], before[rank]["buffers"]["codes"])


def run_ddp_and_one_process(args: list[str], root: Path, monkeypatch) -> tuple[list[dict], dict]:
    """The probes of ``args`` run under 2-process DDP and in one process; the ranks checked to agree."""
    output = run_ddp([*args, *callbacks(probe(root / "ddp"))], root)
    assert not output.startswith("exit"), output[:3000] + "\n...\n" + output[-1500:]  # rank 0's error comes first
    monkeypatch.chdir(root)
    assert main([*args, *callbacks(probe(root / "one"))]) == 0
    ranks, (single,) = load(root / "ddp"), load(root / "one")
    check_ranks_agree(ranks)
    return ranks, single


# -- Shuffle+Random with HashFormer-LSH-Proj ----------------------------------------------------------


def test_shuffle_random_with_lsh_proj_agrees_across_ranks_and_with_one_process(tmp_path, monkeypatch):
    args = ["fit", "--config", str(CONFIGS / "demo_hashformer.yaml"),
            "--model.init_args.embedding", str(CONFIGS / "embedding" / "lsh_proj.yaml"),
            "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "false",
            "--trainer.max_steps", "4", "--trainer.val_check_interval", "4", "--trainer.limit_val_batches", "2",
            *GLOBAL_BATCH, *NO_DROPOUT, *QUIET]
    ranks, single = run_ddp_and_one_process(args, tmp_path, monkeypatch)
    assert ranks[0]["buffers"]["hasher.ngram_ends"].numel() > 1000  # fitted on rank 0, received by rank 1
    assert torch.equal(ranks[0]["buffers"]["hasher.ngram_bytes"], single["buffers"]["hasher.ngram_bytes"])
    assert ranks[0]["codes"] == ranks[1]["codes"] == single["codes"]  # hash codes match across processes
    assert (tmp_path / "lsh_ngrams.json").is_file()
    check_like_one_process(ranks, single, tolerance=0.1)


def test_a_loss_that_diverges_on_one_rank_stops_every_rank(tmp_path):
    """A NaN loss on rank 1 alone (its batch of step 2): both ranks stop, together, at the next read of the losses (before
    the validation of step 4), each naming step 2 (rank 0, whose own loss was finite, would otherwise wait for rank 1 in
    a collective), exit 3, the run is marked diverged and nothing is saved."""
    nan = {"class_path": "tests.helpers.probes.NonFiniteLoss", "init_args": {"steps": [2], "rank": 1}}
    args = ["fit", "--config", str(CONFIGS / "demo.yaml"), "--trainer.default_root_dir", str(tmp_path / "runs"),
            "--trainer.max_steps", "4", "--trainer.val_check_interval", "4", "--trainer.limit_val_batches", "2",
            *GLOBAL_BATCH, *QUIET, *callbacks({"class_path": "lit_embed.callbacks.ResultsWriter"}, nan)]
    output = run_ddp(args, tmp_path)
    assert output.startswith("exit 3\n"), output[-3000:]
    assert output.count("training diverged: the training loss was not finite on another rank at step 2") == 1  # rank 0
    assert output.count("training diverged: the training loss was nan at step 2") == 1  # rank 1
    results = json.loads((tmp_path / "runs/version_0/results.json").read_text())
    assert results["status"] == "diverged" and results["global_step"] == 4
    assert not list((tmp_path / "runs").rglob("*.ckpt"))


# -- fine-tuning ----------------------------------------------------------------------------------------


def test_finetuning_agrees_across_ranks_and_with_one_process(mlm_runs, clustered, tmp_path, monkeypatch):
    """Fine-tunes the DDP pre-training (its clustered codes come from the checkpoint, never recomputed)."""
    args = ["fit", "--config", str(CONFIGS / "demo_finetune.yaml"), "--model.init_args.embedding", clustered,
            "--model.init_args.checkpoint", str(mlm_runs["checkpoints"] / "last.ckpt"),
            "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "false", "--trainer.max_epochs", "1",
            "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2",
            *GLOBAL_BATCH, *NO_DROPOUT, *QUIET]
    ranks, single = run_ddp_and_one_process(args, tmp_path, monkeypatch)
    pretrained = load(mlm_runs["root"] / "after")[0]["buffers"]["codes"]
    assert torch.equal(ranks[1]["buffers"]["codes"], pretrained)
    check_like_one_process(ranks, single, tolerance=0.1)
    assert "test/accuracy" in ranks[0]["metrics"] and ranks[0]["metrics"]["test/accuracy"] == ranks[1]["metrics"]["test/accuracy"]


# -- in one process: what makes the runs above agree -----------------------------------------------------


class CountingAssignment(Assignment):
    """Radix codes, counting how often they are computed (an expensive assignment stands in for clustering)."""

    eager = False
    calls = 0

    def codes(self, num_tokens: int, num_tables: int, table_size: int):
        from lit_embed.embeddings.assignment import RadixAssignment

        CountingAssignment.calls += 1
        return RadixAssignment().codes(num_tokens, num_tables, table_size)


def test_only_rank_zero_computes_the_strategy_state_the_others_receive_it(monkeypatch):
    from types import SimpleNamespace

    from lit_embed.embeddings import SubspaceEmbedding
    from lit_embed.models import Encoder, MaskedLM

    def model():
        encoder = Encoder(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position_embeddings=66)
        return MaskedLM(encoder, vocab_size=500, embedding=lambda v, d: SubspaceEmbedding(v, d, assignment=CountingAssignment()))

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    sent = {}

    def broadcast(obj, src=0):
        if obj is not None:
            sent["state"] = obj
        return sent["state"]

    zero, one = model(), model()
    for rank, module in enumerate((zero, one)):
        module._trainer = SimpleNamespace(world_size=2, global_rank=rank, is_global_zero=rank == 0,
                                          strategy=SimpleNamespace(broadcast=broadcast))
        module.setup("fit")
    assert CountingAssignment.calls == 1  # rank 0 only
    assert torch.equal(zero.embedding.codes, one.embedding.codes) and (one.embedding.codes >= 0).all()
    assert one.embedding(torch.arange(500)).shape == (500, 32)  # usable: the received codes mark it prepared


def test_pretraining_freezes_the_pooler_it_does_not_use_and_still_counts_it():
    from lit_embed.models import Encoder, MaskedLM, SequenceClassifier

    def encoder():
        return Encoder(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position_embeddings=66)

    mlm = MaskedLM(encoder(), vocab_size=300)
    pooler = [p for n, p in mlm.named_parameters() if ".pooler." in n]
    assert pooler and not any(p.requires_grad for p in pooler)
    assert all(p.requires_grad for n, p in mlm.named_parameters() if ".pooler." not in n)
    classifier = SequenceClassifier("topics", encoder(), vocab_size=300)
    assert mlm.parameter_counts() == classifier.parameter_counts()  # the papers' counts include the pooler
    assert all(p.requires_grad for p in classifier.parameters())
    from lit_embed.models.optim import configure_adamw

    optimised = {id(p) for group in configure_adamw(mlm, mlm.optim, 100)["optimizer"].param_groups for p in group["params"]}
    assert not optimised & {id(p) for p in pooler}


@pytest.mark.parametrize("name", ["ddp", "ddp_multinode", "ddp_500k"])
def test_gpu_ddp_trainer_configs_build_with_nccl_settings(name, tmp_path, monkeypatch):
    """They build (on the CPU, the accelerator swapped) with the DDP settings, the run guard (atomic saves) and
    periodic checkpoints."""
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.strategies import DDPStrategy

    from lit_embed.callbacks import RunGuard
    from lit_embed.commands.lightning import LitEmbedCLI

    monkeypatch.chdir(tmp_path)
    cli = LitEmbedCLI(args=["--config", str(CONFIGS / "demo.yaml"), "--trainer", str(CONFIGS / "trainer" / f"{name}.yaml"),
                            "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.precision", "32-true"],
                      run=False)
    trainer = cli.trainer
    assert isinstance(trainer.strategy, DDPStrategy)
    assert trainer.strategy._ddp_kwargs["find_unused_parameters"] is False
    assert trainer.strategy._ddp_kwargs["broadcast_buffers"] is False
    assert any(isinstance(c, RunGuard) for c in trainer.callbacks)
    periodic = [c for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c._every_n_train_steps]
    assert len(periodic) == 1 and periodic[0]._every_n_train_steps == 5000 and periodic[0].save_last
    assert trainer.num_nodes == (2 if name == "ddp_multinode" else 1)


# -- the docs' scaling-out section stays true -----------------------------------------------------------

SCALING = "Scaling out: many GPUs, many nodes, resuming"


def test_docs_list_every_trainer_config():
    from tests.helpers.cli import section

    listed = re.findall(r"^\| `configs/trainer/(\w+)\.yaml` \|", section("sweeps-clusters", SCALING), flags=re.M)
    assert sorted(listed) == sorted(p.stem for p in (CONFIGS / "trainer").glob("*.yaml"))


def launch_commands() -> list[list[str]]:
    """The ``fit`` arguments of every launch command in the section (SLURM's, torchrun's, lit-embed's)."""
    from tests.helpers.cli import section

    blocks = re.findall(r"```bash\n(.*?)```", section("sweeps-clusters", SCALING), flags=re.S)
    commands = []
    for block in blocks:
        for command in block.replace("\\\n", " ").splitlines():
            words = shlex.split(command)
            if "fit" in words and ("lit-embed" in words or "lit_embed.commands" in words):
                commands.append(tuple(words[words.index("fit") + 1:]))
    return [list(c) for c in dict.fromkeys(commands)]  # SLURM's and torchrun's take the same arguments


@pytest.mark.parametrize("args", launch_commands(), ids=lambda a: " ".join(a)[-60:])
def test_docs_launch_commands_parse_and_build(args, tmp_path, monkeypatch):
    from lit_embed.commands.lightning import LitEmbedCLI

    monkeypatch.chdir(REPO)
    if "--ckpt_path" in args:  # a fit argument, not the config's
        at = args.index("--ckpt_path")
        args = args[:at] + args[at + 2:]
    on_cpu = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.precision", "32-true",
              "--model.init_args.encoder", str(CONFIGS / "backbone" / "tiny.yaml"),
              "--trainer.default_root_dir", str(tmp_path)]
    cli = LitEmbedCLI(args=[*args, *on_cpu], run=False)
    assert cli.trainer.world_size == 2 * cli.trainer.num_nodes


def test_predict_on_two_ranks_writes_every_row_once_from_rank_zero_where_one_process_would(tmp_path, monkeypatch):
    """Each rank predicts its share (a distributed sampler repeats a row to even out 5 texts); rank 0 gathers the
    records and writes them once, in the input's order, in the one folder beside the checkpoint: the rows one process
    writes. Rank 1 claims no folder of its own."""
    import yaml

    from tests.helpers.crafted import classifier_checkpoint

    monkeypatch.chdir(tmp_path)
    classifier_checkpoint(tmp_path / "model.ckpt")
    own = {"model": {"class_path": "lit_embed.models.SequenceClassifier", "init_args": {"task": "topics"}},
           "data": {"class_path": "lit_embed.data.TaskDataModule", "init_args": {"task": "topics", "batch_size": 2,
                                                                                   "max_length": 64}}}
    (tmp_path / "own.yaml").write_text(yaml.safe_dump(own))
    (tmp_path / "new.txt").write_text("".join(f"a text about topic number {i}\n" for i in range(5)))
    args = ["predict", "--config", "own.yaml", "--ckpt_path", "model.ckpt", "--data.init_args.predict_input", "new.txt", *QUIET]
    before = {p.name for p in tmp_path.iterdir()}
    output = run_ddp(args, tmp_path)
    assert not output.startswith("exit"), output[-3000:]
    assert {p.name for p in tmp_path.iterdir()} - before == {"model-predictions-new"}
    assert output.count("lit-embed: predict: predictions of 5 text(s)") == 1  # said by rank 0 alone
    assert main([*args, "--output", "one"]) == 0
    ddp, one = ([line.split(",") for line in (tmp_path / name / "predictions.csv").read_text().splitlines()]
                for name in ("model-predictions-new", "one"))
    assert [row[:2] for row in ddp] == [row[:2] for row in one] and len(ddp) == 6  # header, then each text once
    assert np.allclose(np.array([row[2:] for row in ddp[1:]], float), np.array([row[2:] for row in one[1:]], float), atol=1e-5)
