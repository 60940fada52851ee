"""The papers' figures: formulas by hand, timing rules, results.json after a run, TensorBoard, bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_embed.callbacks import EfficiencyMonitor, ResultsWriter
from lit_embed.callbacks.efficiency import peak_rss_bytes, peak_tflops, reset_peak_rss
from lit_embed.measures.accounting import compression, performance_retention, speed_up
from lit_embed.models import MaskedLM
from lit_embed.runs.results import RESULTS_FILE, is_score, load_per_core, load_results
from lit_embed.storage.files import write_atomic, write_json_atomic
from tests.helpers import CONFIGS, tiny_encoder
from tests.helpers.cli import run_params


def test_figures_match_the_papers_hand_computations():
    # HashFormers Table 2/3, against BERT-MLM: CANINE-C's GLUE average 70.4 vs 79.5 is a PRR of 88.6%;
    # ProFormer's 15.1M of 124.6M parameters a PCR_All of 87.9%; Proj's 99.1K of 38.6M embedding
    # parameters a PCR_Emb of 99.7%; S+R's 11.6 ms against 24.9 ms a 2.1x pre-training speed-up.
    assert round(100 * performance_retention(70.4, 79.5), 1) == 88.6
    figures = compression(embedding=322_600, total=15_100_000, baseline_embedding=38_600_000, baseline_total=124_600_000)
    assert round(100 * figures["pcr_all"], 1) == 87.9
    assert round(100 * compression(99_100, 86_100_000, 38_600_000, 124_600_000)["pcr_emb"], 1) == 99.7
    assert round(100 * compression(99_100, 86_100_000, 38_600_000, 124_600_000)["poep"], 1) == 0.1
    assert round(speed_up(11.6, 24.9), 1) == 2.1
    assert performance_retention(0.5, 0.0) is None and speed_up(0.0, 3.0) is None
    assert is_score("test/matched/accuracy") and is_score("val/de/accuracy") and is_score("val/spearman")
    assert not is_score("val/loss") and not is_score("train/accuracy")


class TinyRegression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(count: int, batch_size: int) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(count, 4, generator=generator), torch.randn(count, 1, generator=generator))
    return DataLoader(data, batch_size=batch_size)


def test_timer_leaves_out_warm_up_and_sanity_steps_and_counts_samples(tmp_path):
    monitor = EfficiencyMonitor(warmup_steps=2)
    ticks = iter(range(0, 10_000, 1))
    monitor.clock = lambda: next(ticks) * 0.5  # every measured step lasts exactly one tick of 0.5 s
    trainer = pl.Trainer(max_steps=7, limit_val_batches=4, num_sanity_val_steps=2, callbacks=[monitor],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(TinyRegression(), loader(21, 3), loader(20, 5))
    summary = monitor.summary(trainer)
    assert summary["train"] == {"ms_per_sample": 1000 * 0.5 / 3, "measured_steps": 5, "samples": 15, "warmup_steps": 2,
                                "tokens_per_s": None, "mfu": None}  # no codes, no lit-embed model: no tokens, no FLOPs
    # 4 validation batches of 5 after the sanity check; the first 2 are warm-up.
    assert summary["infer"] == {"ms_per_sample": 1000 * 0.5 / 5, "measured_steps": 2, "samples": 10, "warmup_steps": 2,
                                "tokens_per_s": None}
    assert summary["mfu_basis"] == "no lit-embed model: FLOPs unknown"
    assert summary["world_size"] == 1 and summary["device"] == "cpu" and summary["peak_memory_mb"] > 10


def test_tokens_per_second_and_flops_of_a_lit_embed_model_and_its_device_s_peak():
    """Tokens are the positions of the batches' codes; the FLOPs the transformer's by formula; the MFU needs the
    device's peak, which no CPU has in the table."""
    model = MaskedLM(tiny_encoder(), vocab_size=100)
    monitor = EfficiencyMonitor(warmup_steps=1)
    ticks = iter(range(10))
    monitor.clock = lambda: next(ticks) * 0.25
    trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu"), all_gather=lambda t: t),
                              precision="32-true")
    monitor.setup(trainer, model, "fit")
    for _ in range(3):  # the first is warm-up
        monitor._start("train", {"codes": torch.zeros(4, 30, dtype=torch.long)})
        monitor._stop("train")
    summary = monitor.summary(trainer)
    assert summary["train"]["tokens_per_s"] == 2 * 4 * 30 / 0.5
    assert monitor.timers["train"].flops == 2 * 4 * 30 * model.encoder.training_flops_per_token(30)
    assert summary["train"]["mfu"] is None and summary["mfu_basis"] == "no peak known for cpu (lit_embed.callbacks.efficiency.PEAK_TFLOPS)"
    layers = 6 * sum(p.numel() for p in model.encoder.model.encoder.parameters())
    assert model.encoder.training_flops_per_token(30) == layers + 12 * 1 * 32 * 30  # one layer, hidden 32


def test_every_timing_records_the_machine_load_it_ran_at(monkeypatch):
    """The 1-minute load average at the run's setup (not again at a later stage's) and when the figures are read,
    beside the machine's cores: what ``report`` compares before it sets two timings side by side."""
    from lit_embed.runs import results as results_module

    readings = iter([3.5, 9.0, 7.25])
    monkeypatch.setattr(results_module.os, "getloadavg", lambda: (next(readings), 0.0, 0.0))
    monkeypatch.setattr(results_module.os, "cpu_count", lambda: 2)
    monitor = EfficiencyMonitor(warmup_steps=0)
    trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu"), all_gather=lambda t: t),
                              precision="32-true")
    monitor.setup(trainer, TinyRegression(), "fit")
    monitor.setup(trainer, TinyRegression(), "test")  # a fit's test: the start stays the fit's
    summary = monitor.summary(trainer)
    assert summary["load"] == {"load_1min": [3.5, 9.0], "cores": 2}
    assert results_module.load_per_core(summary["load"]) == (3.5 + 9.0) / 2 / 2


@pytest.mark.parametrize(("name", "peak"), [("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0),
                                            ("NVIDIA H200", 989.4), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L40", 181.0),
                                            ("NVIDIA L40S", 362.0), ("Tesla T4", 65.0), ("cpu", None), ("NVIDIA B999", None)])
def test_the_peak_of_a_device_comes_from_its_name(name, peak):
    assert peak_tflops(name) == peak


@pytest.mark.skipif(not reset_peak_rss(), reason="no Linux clear_refs to write: the peak counts from the process's start")
def test_a_run_s_peak_memory_is_its_own_not_that_of_a_run_before_it_in_the_process(tmp_path):
    """``lit-embed sweep --launcher inline`` runs many fits in one process: each reports the peak since its own setup."""
    big = torch.ones(64 * 2**20)  # 256 MiB held, then freed: an earlier run's peak
    del big
    monitor = EfficiencyMonitor(warmup_steps=0)
    trainer = pl.Trainer(max_steps=3, limit_val_batches=1, num_sanity_val_steps=0, callbacks=[monitor], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path)
    trainer.fit(TinyRegression(), loader(9, 3), loader(5, 5))
    summary = monitor.summary(trainer)
    assert summary["memory"] == "process_peak_rss"
    assert peak_rss_bytes() >= summary["peak_memory_mb"] * 2**20 > 0
    held = int(next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmRSS:")).split()[1])
    assert summary["peak_memory_mb"] * 2**20 < held * 1024 + 128 * 2**20  # not the 256 MiB peak from before the run


def test_a_run_too_short_to_measure_says_so(tmp_path):
    monitor = EfficiencyMonitor(warmup_steps=5)
    trainer = pl.Trainer(max_steps=2, limit_val_batches=1, num_sanity_val_steps=0, callbacks=[monitor],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(TinyRegression(), loader(6, 3), loader(5, 5))
    assert monitor.summary(trainer)["train"]["ms_per_sample"] is None
    with pytest.raises(ValueError, match="warmup_steps=-1"):
        EfficiencyMonitor(warmup_steps=-1)


def test_any_lightning_logger_gets_the_figures(tmp_path):
    from pytorch_lightning.loggers import CSVLogger

    logger = CSVLogger(tmp_path, name="csv")
    trainer = pl.Trainer(max_steps=4, limit_val_batches=2, num_sanity_val_steps=0, logger=logger,
                         callbacks=[EfficiencyMonitor(warmup_steps=1), ResultsWriter(label="tiny")],
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(TinyRegression(), loader(12, 3), loader(4, 2))
    header = (tmp_path / "csv" / "version_0" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"efficiency/train_ms_per_sample", "efficiency/infer_ms_per_sample", "val/loss"} <= set(header)
    assert "efficiency/train_ms_per_sample" in (tmp_path / "csv" / "version_0" / "hparams.yaml").read_text()
    results = load_results(tmp_path / "csv" / "version_0")
    assert results["label"] == "tiny" and results["parameters"] is None  # not an EmbeddingModule: no counts
    assert results["efficiency"]["train"]["measured_steps"] == 3 and "val/loss" in results["metrics"]


def test_demo_run_writes_complete_results(demo_runs):
    results = load_results(demo_runs["subspace"])
    baseline = load_results(demo_runs["dense"])
    assert results["label"] == "subspace" and results["seed"] == 0 and results["task"] is None
    assert set(results["versions"]) >= {"lit_embed", "torch", "pytorch_lightning", "transformers"}
    assert set(results["config"]) >= {"model", "data", "trainer", "seed_everything"}
    assert results["backbone"] == {"arch": "roberta", "layers": 2, "hidden": 64, "heads": 4, "ffn": 128}
    assert set(results["metrics"]) >= {"train/loss", "val/loss", "val/accuracy", "val/perplexity"}
    assert results["global_step"] == 10
    # the parameter figures are `lit-embed params`'s, here against the dense run (the same counts as dense)
    expected = run_params(CONFIGS / "demo.yaml")
    for key in ("total_params", "embedding_params", "baseline_total_params", "pcr_all", "pcr_emb", "poep"):
        assert results["parameters"][key] == pytest.approx(expected[key]), key
    assert results["parameters"]["baseline"] == str(demo_runs["dense"])
    assert baseline["parameters"]["baseline"] == "dense" and baseline["parameters"]["pcr_emb"] == 0.0
    train = results["efficiency"]["train"]
    assert (train["measured_steps"], train["samples"], train["warmup_steps"]) == (8, 32, 2)
    assert train["ms_per_sample"] > 0 and results["efficiency"]["infer"]["measured_steps"] == 5
    assert baseline["efficiency"]["train"]["measured_steps"] == 5  # the demo's own monitor: 5 warm-up steps
    comparison = results["baseline"]
    assert comparison["prr"] == {"val/accuracy": results["metrics"]["val/accuracy"] / baseline["metrics"]["val/accuracy"]}
    for kind in ("train", "infer"):
        assert comparison["speed_up"][kind] == pytest.approx(
            baseline["efficiency"][kind]["ms_per_sample"] / results["efficiency"][kind]["ms_per_sample"])
    loads = [load_per_core(run["efficiency"]["load"]) for run in (results, baseline)]  # what the speed-ups ran beside
    assert comparison["load_per_core"] == loads and comparison["loads_differ"] == (abs(loads[0] - loads[1]) > 0.5)
    assert not [p for p in os.listdir(demo_runs["subspace"]) if p.endswith(".tmp")]


def test_figures_reach_tensorboard_scalars_and_hparams_tab(demo_runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    events = EventAccumulator(str(demo_runs["subspace"]))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert events.Scalars("params/embedding")[0].value == 32 * 64  # Q=32 rows of the demo's 3 tables, d=64
    assert {"compression/pcr_emb", "efficiency/train_ms_per_sample", "speedup/train", "prr/val/accuracy"} <= set(scalars)
    experiment = metadata.parse_experiment_plugin_data(events.SummaryMetadata(metadata.EXPERIMENT_TAG).plugin_data.content)
    columns = {m.name.tag for m in experiment.metric_infos}
    assert {"compression/pcr_all", "compression/poep", "efficiency/peak_memory_mb", "val/loss", "prr/val/accuracy"} <= columns
    assert columns <= set(scalars)  # every HPARAMS column is a logged scalar
    assert {"label", "seed", "strategy", "model/embedding/num_tables"} <= {h.name for h in experiment.hparam_infos}
    assert "hp_metric" not in scalars  # Lightning's placeholder would have hidden ours


def test_results_writer_refuses_a_baseline_of_another_backbone(tmp_path):
    from lit_embed.models import Encoder, MaskedLM

    model = MaskedLM(Encoder(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), vocab_size=100)
    trainer = SimpleNamespace(loggers=[])
    other = {"format": 1, "label": "bert", "backbone": {"arch": "bert", "layers": 12, "hidden": 768, "heads": 12, "ffn": 3072},
             "parameters": {"total_params": 1, "embedding_params": 1, "pcr_all": 0.0, "pcr_emb": 0.0, "poep": 1.0}}
    write_json_atomic(tmp_path / "bert" / RESULTS_FILE, other)
    with pytest.raises(ValueError, match=r"has backbone bert 12x768 .* but this run has roberta 1x32"):
        ResultsWriter(baseline=str(tmp_path / "bert")).setup(trainer, model, "fit")
    with pytest.raises(FileNotFoundError, match="no results.json"):
        ResultsWriter(baseline=str(tmp_path)).setup(trainer, model, "fit")


def test_results_are_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    path = write_json_atomic(tmp_path / RESULTS_FILE, {"format": 1, "label": "old"})

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, json.dumps({"format": 1, "label": "new"}))
    assert json.loads(path.read_text())["label"] == "old"
    assert os.listdir(tmp_path) == [RESULTS_FILE]  # the temporary file is gone


def test_csv_logger_and_several_loggers_get_results_and_analysis_images_through_the_cli(tmp_path, monkeypatch):
    """The user's own loggers (any Lightning logger, several at once): results.json and the analysis images go to
    the first logger's run folder, every logger gets the figures, and TensorBoard the images."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lit_embed.analysis.embedding_space import ANALYSIS_DIR
    from lit_embed.commands import main

    monkeypatch.chdir(tmp_path)
    loggers = [{"class_path": "pytorch_lightning.loggers.CSVLogger", "init_args": {"save_dir": "logs", "name": "csv"}},
               {"class_path": "pytorch_lightning.loggers.TensorBoardLogger", "init_args": {"save_dir": "logs", "name": "tb"}}]
    callbacks = [{"class_path": "lit_embed.callbacks.EfficiencyMonitor", "init_args": {"warmup_steps": 2}},
                 {"class_path": "lit_embed.callbacks.ResultsWriter", "init_args": {"label": "two_loggers"}},
                 {"class_path": "lit_embed.callbacks.EmbeddingAnalysis", "init_args": {"max_texts": 40, "points": 2000}}]
    assert main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--trainer.logger", json.dumps(loggers),
                 "--trainer.callbacks", json.dumps(callbacks), "--trainer.max_steps", "6", "--trainer.val_check_interval", "6",
                 "--trainer.limit_val_batches", "2", "--data.init_args.batch_size", "4",
                 "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]) == 0
    run = tmp_path / "logs" / "csv" / "version_0"
    results = load_results(run)
    assert results["status"] == "complete" and results["label"] == "two_loggers" and results["parameters"]["pcr_emb"] > 0
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"params/total", "compression/pcr_emb", "efficiency/train_ms_per_sample", "val/loss"} <= set(header)
    assert sorted(p.suffix for p in (run / ANALYSIS_DIR).iterdir() if p.suffix == ".png")
    events = EventAccumulator(str(tmp_path / "logs" / "tb" / "version_0"))
    events.Reload()
    assert "compression/pcr_emb" in events.Tags()["scalars"] and events.Tags()["images"]
