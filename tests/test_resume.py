"""Resuming and scaling, one process: data positions, streaming shards, atomic checkpoints, the global batch."""

from __future__ import annotations

import functools
import gc
import lzma
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lit_embed.checkpoints.atomic_io import AtomicCheckpointIO
from lit_embed.commands.lightning import LitEmbedCLI
from lit_embed.data.collate import MaskedLMCollator
from lit_embed.data.corpus import CorpusDataModule
from lit_embed.distributed import plan_global_batch
from lit_embed.models.metrics import BlockEvaluation
from tests.helpers import CONFIGS, REPO


def fake_trainer(rank: int = 0, world: int = 1, **extra) -> SimpleNamespace:
    """What the data modules read from a trainer, for driving them by hand (``consumed`` batches settable)."""
    progress = SimpleNamespace(ready=0)
    loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(current=progress)))
    return SimpleNamespace(world_size=world, global_rank=rank, is_global_zero=rank == 0, lightning_module=None,
                           current_epoch=0, logger=None, default_root_dir=".", fit_loop=loop, **extra)


def consume(loader, trainer, count: int, iterator=None):
    """``count`` batches as training consumes them (the fit loop's count follows); the iterator and the batches."""
    iterator = iterator or iter(loader)
    batches = []
    for _ in range(count):
        batches.append(next(iterator))
        trainer.fit_loop.epoch_loop.batch_progress.current.ready += 1
    return iterator, batches


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(torch.equal(x["codes"], y["codes"]) for x, y in zip(a, b))


# -- streaming: shards by rank and worker, validation texts held out, resumable -----------------------


@pytest.fixture
def shards(tmp_path) -> list[str]:
    """4 text files of 250 lines; only the first 100 lines of the stream say "zebra"."""
    files = []
    for shard in range(4):
        lines = [f"{'zebra' if shard == 0 and i < 100 else 'horse'} number {shard * 250 + i} runs over the hill ."
                 for i in range(250)]
        path = tmp_path / f"part{shard}.txt"
        path.write_text("\n".join(lines) + "\n")
        files.append(str(path))
    return files


def streaming(files, trainer, **extra) -> CorpusDataModule:
    dm = CorpusDataModule("all-MiniLM-L6-v2", files=files, max_length=32, batch_size=2, val_size=5, streaming=True,
                          **{"shuffle_buffer": 0, **extra})
    dm.trainer = trainer
    return dm


@pytest.mark.parametrize("world", [2, 3])  # 4 shards: split by shard over 2 ranks, by text over 3
def test_streamed_texts_are_split_between_ranks_without_the_validation_texts(shards, world):
    texts = []
    for rank in range(world):
        dm = streaming(shards, fake_trainer(rank, world))
        val, held_out = dm._held_out_blocks(dm.text_encoder_for())
        assert len(val) == 5
        texts.append([row["text"] for row in dm._train_texts(held_out)])
    everything = [line for f in shards for line in open(f).read().splitlines()]
    assert sorted(t for rank in texts for t in rank) == sorted(everything[100:])  # each text on one rank, once
    assert not any("zebra" in t for rank in texts for t in rank)  # the validation texts are held out


#: An extract of the shards: 4 + 5 + 3 + 2 blocks of 30 tokens a pass (``max_length`` 32).
BUDGETS = {"part0.txt": 120, "part1.txt": 150, "part2.txt": 61, "part3.txt": 60}


@pytest.mark.parametrize(("workers", "budgets"), [(0, None), (2, None), (2, BUDGETS)],
                         ids=["one process", "2 workers", "2 workers, an extract of 7 batches a pass"])
def test_a_stream_resumes_each_worker_where_training_stopped(shards, workers, budgets, monkeypatch):
    """Training consumed 6 batches while the loader had fetched a 7th (Lightning fetches ahead on streams)."""
    # datasets' streaming workers wait out this interval before they exit; keep the test short
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.2)
    trainer = fake_trainer()
    make = functools.partial(streaming, token_budgets=budgets)
    dm = make(shards, trainer, num_workers=workers)
    dm.setup("fit")
    loader = dm.train_dataloader()
    iterator, _ = consume(loader, trainer, 6)
    ahead = next(iterator)  # fetched, not trained on
    saved = dm.state_dict()
    _, expected = consume(loader, trainer, 4, iterator)
    restored_trainer = fake_trainer()
    again = make(shards, restored_trainer, num_workers=workers)
    again.setup("fit")
    again.load_state_dict(saved)
    _, resumed = consume(again.train_dataloader(), restored_trainer, 5)
    assert same(resumed, [ahead, *expected])
    del dm, again, loader, iterator
    gc.collect()  # the workers stop now, while the interval is short


def file_blocks(dm: CorpusDataModule, path: str, held_out) -> list[np.ndarray]:
    """The blocks ``path``'s training texts give alone, in order (each shard fits in one batch of texts)."""
    from lit_embed.data.corpus import BlockBuilder

    texts = [t for t in open(path).read().splitlines() if held_out({"text": [t]})[0]]
    return BlockBuilder(dm.text_encoder_for(), dm.max_length, "text")({"text": texts})["codes"]


@pytest.mark.parametrize("world", [1, 2, 3])  # 4 files: by file over 1 and 2 ranks, by block over 3
def test_token_budgets_train_on_the_first_blocks_of_each_file_on_any_number_of_ranks(shards, world):
    """The extract is the same texts every pass, every run, whatever the ranks: each file's first blocks until its
    budget (ceil(tokens / 30) blocks of 30 tokens), a file shorter than its budget whole."""
    budgets = {"part0.txt": 120, "part1.txt": 1500, "part2.txt": 61, "part3.txt": 10**9}  # 4, 50, 3 blocks; all
    passes = []
    for rank in range(world):
        trainer = fake_trainer(rank, world)
        dm = streaming(shards, trainer, token_budgets=budgets)
        dm.setup("fit")
        stream = [row["codes"] for row in dm.train_set]
        passes.append(stream)
        assert all(np.array_equal(a, b["codes"]) for a, b in zip(stream, dm.train_set, strict=True))  # the next pass
    held_out = dm._held_out_blocks(dm.text_encoder_for())[1]
    expected = [block for path, count in zip(shards, (4, 50, 3, None)) for block in file_blocks(dm, path, held_out)[:count]]
    assert len(expected) == 4 + 50 + 3 + len(file_blocks(dm, shards[3], held_out)) < sum(
        len(file_blocks(dm, path, held_out)) for path in shards)
    assert sorted(map(tuple, (b for rank in passes for b in rank))) == sorted(map(tuple, expected))
    again = streaming(shards, fake_trainer(0, world), token_budgets=budgets)
    again.setup("fit")
    assert all(np.array_equal(a, b["codes"]) for a, b in zip(passes[0], again.train_set, strict=True))


@pytest.mark.parametrize(("budgets", "extra", "message"), [
    ({**BUDGETS, "part9.txt": 100}, {}, "token_budgets names 'part9.txt', which is the name of no file of files"),
    ({**BUDGETS, "part0.txt": 0}, {}, "token_budgets['part0.txt']=0 must be a positive number of tokens"),
    ({**BUDGETS, "part0.txt": 2.5}, {}, "token_budgets['part0.txt']=2.5 must be a positive number of tokens"),
    ({"part0.txt": 100}, {"streaming": False, "val_size": 0.1}, "token_budgets read the start of each file as it streams"),
    ({"part0.txt": 100}, {}, "token_budgets gives no budget to ['part1.txt', 'part2.txt', 'part3.txt']"),
    ({"part0.txt": 100}, {"datasets": ["acme/wiki"]}, "token_budgets apply to local files, and the corpus also reads hub"),
], ids=["no such file", "zero", "not a count", "without streaming", "a file without one", "with a hub dataset"])
def test_bad_token_budgets_are_refused_naming_the_budget_and_the_fix(shards, budgets, extra, message):
    from lit_embed.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        CorpusDataModule("all-MiniLM-L6-v2", files=shards, token_budgets=budgets, **{"streaming": True, "val_size": 5, **extra})


def test_a_budget_on_a_name_two_files_share_is_refused(tmp_path):
    from lit_embed.errors import ConfigError

    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "en.txt").write_text("a text\n")
    files = [str(tmp_path / "a" / "en.txt"), str(tmp_path / "b" / "en.txt")]
    with pytest.raises(ConfigError, match="'en.txt', which is the name of 2 files"):
        CorpusDataModule("all-MiniLM-L6-v2", files=files, streaming=True, val_size=1, token_budgets={"en.txt": 10})


def test_the_xlmr_corpus_is_table_7s_extract_of_cc100_with_the_whole_stream_an_option(tmp_path, monkeypatch, capsys):
    import yaml

    from lit_embed.commands import main
    from tests.helpers.papers import TABLE_7

    cc100 = yaml.safe_load((CONFIGS / "data" / "cc100_xnli.yaml").read_text())["init_args"]
    budgets = cc100["token_budgets"]
    assert sorted(budgets) == sorted(path.split("/")[-1] for path in cc100["files"])
    assert {name.split(".")[0].replace("zh-Hans", "zh"): tokens for name, tokens in budgets.items()} == {
        lang: millions * 10**6 for lang, millions in TABLE_7.items()}
    assert sum(budgets.values()) == 3_985_000_000  # the paper's ~4.0B tokens
    assert cc100["streaming"] is True
    # The whole stream, on the command line; budgets that leave files out exit 2 with the fix.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "cc100").mkdir(parents=True)
    for name in budgets:
        (tmp_path / "data" / "cc100" / name).write_bytes(lzma.compress(b"a text\n"))
    args = ["fit", "--config", str(CONFIGS / "experiments" / "subspace" / "xlmr_s_3se.yaml"), "--print_config"]
    with pytest.raises(SystemExit):
        main([*args[:-1], "--data.init_args.token_budgets", "null", "--print_config"])
    assert yaml.safe_load(capsys.readouterr().out)["data"]["init_args"]["token_budgets"] is None
    bad = ["--data.init_args.token_budgets", "{fr.txt: 5}"]
    assert main([*args[:-1], *bad, "--trainer.fast_dev_run", "true"]) == 2
    assert "token_budgets gives no budget to ['ar.txt.xz', 'bg.txt.xz'," in capsys.readouterr().err


def test_a_stream_is_endless_and_reshuffled_every_pass(shards):
    trainer = fake_trainer()
    dm = streaming(shards, trainer, shuffle_buffer=50)
    dm.setup("fit")
    _, batches = consume(dm.train_dataloader(), trainer, 400)  # 800 blocks: more than one pass (~330 blocks)
    per_pass = [b["codes"] for b in batches[:100]], [b["codes"] for b in batches[200:300]]
    assert not all(torch.equal(a, b) for a, b in zip(*per_pass))


# -- map-style: the epoch's order is (seed, epoch), resumed mid-epoch and at its end ----------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(f"the fox number {i} crosses the river at night ." for i in range(400)) + "\n")
    return str(path)


def map_style(corpus, trainer, epoch: int = 0) -> CorpusDataModule:
    dm = CorpusDataModule("all-MiniLM-L6-v2", files=[corpus], max_length=16, batch_size=4, val_size=4, seed=3)
    dm.trainer = trainer
    trainer.current_epoch = epoch
    dm.setup("fit")
    return dm


def test_map_style_epochs_are_reproducible_and_resume_mid_epoch(corpus):
    trainer = fake_trainer()
    dm = map_style(corpus, trainer, epoch=2)
    loader = dm.train_dataloader()
    iterator, first = consume(loader, trainer, 3)
    saved = dm.state_dict()
    _, expected = consume(loader, trainer, 3, iterator)
    assert [r["epoch"] for r in saved["train_positions"]] == [2] and saved["train_positions"][0]["batches"] == 3
    assert same(first, consume(map_style(corpus, fake_trainer(), epoch=2).train_dataloader(), fake_trainer(), 3)[1])
    assert not same(first, consume(map_style(corpus, fake_trainer(), epoch=1).train_dataloader(), fake_trainer(), 3)[1])
    resumed_trainer = fake_trainer()
    again = map_style(corpus, resumed_trainer)  # built before the checkpoint's epoch is known, as Lightning does
    again.load_state_dict(saved)
    loader = again.train_dataloader()
    _, resumed = consume(loader, resumed_trainer, 3)
    assert same(resumed, expected)
    assert sum(1 for _ in loader) == len(loader)  # the next epoch is whole again


def test_a_position_saved_at_the_end_of_an_epoch_starts_the_next_one_afresh(corpus):
    trainer = fake_trainer()
    dm = map_style(corpus, trainer)
    loader = dm.train_dataloader()
    consume(loader, trainer, len(loader))
    saved = dm.state_dict()
    resumed_trainer = fake_trainer()
    again = map_style(corpus, resumed_trainer)
    again.load_state_dict(saved)
    loader = again.train_dataloader()
    loader.sampler.set_epoch(1)  # what Lightning does as the next epoch starts
    _, batches = consume(loader, resumed_trainer, len(loader))
    fresh = map_style(corpus, fake_trainer(), epoch=1)
    assert same(batches, consume(fresh.train_dataloader(), fake_trainer(), len(loader))[1])


def test_positions_of_another_number_of_ranks_restart_the_epoch(corpus, caplog):
    trainer = fake_trainer()
    dm = map_style(corpus, trainer)
    consume(dm.train_dataloader(), trainer, 2)
    saved = dm.state_dict()
    saved["train_positions"] *= 2  # as if written by 2 ranks
    again = map_style(corpus, fake_trainer())
    again.load_state_dict(saved)
    batches = consume(again.train_dataloader(), fake_trainer(), 2)[1]
    assert same(batches, consume(map_style(corpus, fake_trainer()).train_dataloader(), fake_trainer(), 2)[1])
    assert "positions are of 2 ranks, this run has 1" in caplog.text


# -- exact evaluation: each block once, its corruption a function of (seed, index) ------------------------


def test_block_evaluation_counts_a_block_the_sampler_repeats_once():
    evaluation = BlockEvaluation(("loss",))
    # rank 0: blocks 0, 2 (two tokens each); rank 1: block 1, then block 0 again as the sampler's padding
    evaluation.update(torch.tensor([0, 2]), torch.tensor([0, 0, 1, 1]), {"loss": torch.tensor([1.0, 3.0, 5.0, 7.0])})
    other = BlockEvaluation(("loss",))
    other.update(torch.tensor([1, 0]), torch.tensor([0, 1, 1]), {"loss": torch.tensor([2.0, 1.0, 3.0])})
    evaluation.merge_state(other)  # what the DDP gather hands to compute()
    result = evaluation.compute()
    assert float(result["loss"]) == pytest.approx((1 + 3 + 5 + 7 + 2) / 5)  # token-weighted, block 0 once
    assert int(result["blocks"]) == 3 and int(result["tokens"]) == 5


def test_evaluation_masking_depends_on_the_block_alone():
    from lit_embed.embeddings import VocabTextEncoder

    encoder = VocabTextEncoder("all-MiniLM-L6-v2")
    collate = MaskedLMCollator(encoder, functools.partial(torch.randint, 1000), seed=7)
    rng = np.random.default_rng(0)
    items = [{"codes": np.r_[101, rng.integers(1000, 2000, n), 102], "index": i} for i, n in enumerate([60, 30, 45])]
    together = collate(items)
    alone = collate([items[1]])
    with_others = collate([items[2], items[1]])
    for batch, row in ((alone, 0), (with_others, 1)):
        assert torch.equal(batch["codes"][row, :32], together["codes"][1, :32])
        assert torch.equal(batch["labels"][row, :32], together["labels"][1, :32])
    assert (together["labels"][1, 32:] == -100).all() and (together["attention_mask"][1, 32:] == 0).all()
    other_seed = MaskedLMCollator(encoder, functools.partial(torch.randint, 1000), seed=8)
    assert not torch.equal(other_seed([items[1]])["labels"], alone["labels"])


# -- atomic checkpoints --------------------------------------------------------------------------------


def test_a_kill_during_a_save_leaves_the_last_checkpoint_whole(tmp_path):
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 1, "weights": torch.ones(1000)}, path)
    killed_mid_write = f"""
import os, signal, torch
from lit_embed.checkpoints.atomic_io import AtomicCheckpointIO
def dying(obj, handle, *args, **kwargs):  # half a checkpoint on disk, then SIGKILL
    handle.write(b"PK" * 50_000); handle.flush(); os.kill(os.getpid(), signal.SIGKILL)
torch.save = dying
AtomicCheckpointIO().save_checkpoint({{"step": 2}}, {str(path)!r})
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", killed_mid_write], env=env, capture_output=True, timeout=120)
    assert done.returncode == -9
    assert AtomicCheckpointIO().load_checkpoint(path, weights_only=True)["step"] == 1  # the old one, whole
    assert len(list(tmp_path.glob(".last.ckpt.*.tmp"))) == 1  # the killed writer's half file, beside it
    AtomicCheckpointIO().save_checkpoint({"step": 3}, path)
    assert AtomicCheckpointIO().load_checkpoint(path, weights_only=True)["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # the next save cleans up


def test_a_failed_save_leaves_nothing_behind(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 1}, path)

    def failing(obj, handle, *args, **kwargs):
        handle.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing)
    with pytest.raises(OSError, match="disk full"):
        AtomicCheckpointIO().save_checkpoint({"step": 2}, path)
    monkeypatch.undo()
    assert AtomicCheckpointIO().load_checkpoint(path, weights_only=True)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


# -- the global batch ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("global_batch", "world", "most", "plan"),
    [(128, 8, 16, (16, 1)), (128, 4, 16, (16, 2)), (128, 1, 16, (16, 8)), (256, 8, 32, (32, 1)),
     (256, 3 * 2, 32, None), (128, 8, 12, (8, 2)), (96, 2, 20, (16, 3))],
)
def test_the_global_batch_splits_into_devices_and_accumulation(global_batch, world, most, plan):
    if plan is None:
        with pytest.raises(ValueError, match="global_batch_size=256 does not split over 6 devices"):
            plan_global_batch(global_batch, world, most)
        return
    per_device, accumulation = plan_global_batch(global_batch, world, most)
    assert (per_device, accumulation) == plan and per_device * accumulation * world == global_batch


def test_accumulation_from_the_global_batch_drives_the_schedule(tmp_path, monkeypatch):
    """Global batch 16 at most 4 per device on one process: 4 batches per optimiser step, and the
    learning-rate schedule (warm-up then linear decay) counts optimiser steps."""
    monkeypatch.chdir(tmp_path)
    cli = LitEmbedCLI(args=["--config", str(CONFIGS / "demo_finetune.yaml"), "--model.init_args.checkpoint", "null",
                            "--data.init_args.tokenizer", "all-MiniLM-L6-v2", "--data.init_args.global_batch_size", "16",
                            "--data.init_args.batch_size", "4", "--trainer.max_epochs", "2", "--trainer.logger", "false",
                            "--trainer.callbacks", "[]", "--trainer.enable_progress_bar", "false",
                            "--trainer.limit_train_batches", "10", "--trainer.limit_val_batches", "0"], run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    trainer = cli.trainer
    assert trainer.accumulate_grad_batches == 4 and cli.datamodule.train_batch_size == 4
    assert trainer.num_training_batches == 10
    assert trainer.estimated_stepping_batches == 2 * 3 == trainer.global_step  # ceil(10 / 4) steps per epoch
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.last_epoch == trainer.global_step  # stepped once per optimiser step, not per batch
    assert scheduler.get_last_lr()[0] == pytest.approx(0.0)  # linear decay to 0 at the last step
