"""The shipped template that compares post-hoc methods on a user's own fine-tuned model (configs/sweeps/own_checkpoint.yaml,
issue 35 item 6): every method at every budget compressed and tested beside the model kept dense, and `lit-embed report`
giving each one's bytes and the score it keeps against the dense model (PRR)."""

from __future__ import annotations

import json

import pytest
import yaml

from lit_embed.commands import main
from lit_embed.compress.methods import method_class
from lit_embed.sweeps.plan import load_sweep
from tests.helpers import CONFIGS, go_offline

TEMPLATE = CONFIGS / "sweeps" / "own_checkpoint.yaml"
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", "--trainer.logger", "false"]


def test_the_template_compresses_every_method_at_every_budget_beside_the_dense_reference():
    stages = {stage.name: stage for stage in load_sweep(TEMPLATE).stages}
    assert all(stage.command == "compress" and stage.test for stage in stages.values())  # each output is tested
    (reference,) = stages["reference"].runs
    assert dict(reference.overrides())["method"] == "dense" and reference.label == "dense post-hoc"
    compressed = stages["compressed"].runs
    methods = {dict(run.overrides())["method"] for run in compressed}
    assert methods == {"sparse_coding", "pca", "unk", "svd", "pq", "fit"}
    assert all("budget" in method_class(name).option_names() for name in methods | {"int8", "int4", "dense"})
    assert {dict(run.overrides())["budget"] for run in compressed} == {0.1, 0.03, 0.01}
    assert len({run.label for run in compressed}) == len(compressed)  # one row per method and budget
    assert {dict(run.overrides())["method"] for run in stages["fixed_size"].runs} == {"int8", "int4"}
    ckpts = {dict(run.overrides())["ckpt"] for stage in stages.values() for run in stage.runs}
    assert ckpts == {"runs/my_finetune"}  # the one line a user changes


def test_the_template_on_a_tiny_fine_tuned_model_reports_bytes_and_the_score_kept(tmp_path, monkeypatch, tmp_path_factory):
    """A tiny classifier fine-tuned for 3 steps, the template pointed at its run folder (sparse coding and PQ at 20% and
    4% of its 30522 x 64 table, int8 and int4, the dense reference): the cells a method cannot meet are left out,
    saying why; the others are compressed and tested; the report's Pareto table gives each its method (int8 and int4
    two, though one strategy class), bytes, share and PRR."""
    go_offline(monkeypatch, tmp_path_factory)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "finetune.yaml").write_text(yaml.safe_dump({
        "seed_everything": 0,
        "model": {"class_path": "lit_embed.models.SequenceClassifier",
                  "init_args": {"task": "topics", "vocab_size": 30522, "encoder": str(CONFIGS / "backbone/tiny.yaml")}},
        "data": {"class_path": "lit_embed.data.TaskDataModule",
                 "init_args": {"task": "topics", "tokenizer": "all-MiniLM-L6-v2", "max_length": 16, "batch_size": 32}},
        "trainer": {"accelerator": "cpu", "devices": 1, "max_steps": 3, "limit_val_batches": 1,
                    "default_root_dir": "runs/my_finetune"}}))
    assert main(["fit", "--config", "finetune.yaml", *QUIET]) == 0
    sweep = yaml.safe_load(TEMPLATE.read_text())
    stages = sweep["stages"]
    chosen = stages["compressed"]["axes"]["method"]
    stages["compressed"]["axes"] = {"method": {name: chosen[name] for name in ("sparse_coding", "pq")},
                                    "budget": {"20pct": {"budget": 0.2}, "4pct": {"budget": 0.04}}}
    stages["fixed_size"]["axes"]["method"] = {"int8": {"method": "int8"}, "int4": {"method": "int4"}}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({**sweep, "folder": "runs/mine"}, sort_keys=False))

    assert main(["sweep", "--config", "mine.yaml", "--launcher", "inline"]) == 0
    assert main(["report", "runs/mine", "--figure", "runs/mine/pareto.png", "--output", "report.md"]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "sparse_coding,budget=4pct: unmet (SparseCodedEmbedding cannot meet budget=0.04" in report
    assert "pq,budget=20pct: unmet (ProductQuantizedEmbedding cannot meet budget=0.2" in report
    rows = {cells[2]: cells for cells in (line.strip("|").split(" | ") for line in report.splitlines())
            if len(cells) == 12 and cells[0].strip() == "post hoc"}
    assert {label: cells[1] for label, cells in rows.items()} == {
        "dense post-hoc": "dense", "sparse_coding 20pct post-hoc": "sparse coding post-hoc", "pq 4pct post-hoc": "pq post-hoc",
        "int8 post-hoc": "int8 post-hoc", "int4 post-hoc": "int4 post-hoc"}
    scores = {}
    for label, run in (("dense post-hoc", "reference/run"), ("sparse_coding 20pct post-hoc", "compressed/method=sparse_coding,budget=20pct"),
                       ("pq 4pct post-hoc", "compressed/method=pq,budget=4pct"), ("int8 post-hoc", "fixed_size/method=int8"),
                       ("int4 post-hoc", "fixed_size/method=int4")):
        folder = tmp_path / "runs/mine" / run
        compressed = json.loads((folder / "report.json").read_text())
        (tested,) = folder.rglob("results.json")  # the test's run, in the output's version_0
        results = json.loads(tested.read_text())
        scores[label] = results["metrics"]["test/accuracy"]
        assert rows[label][3] == f"{compressed['bytes']['embedding']['after']:,}"  # the bytes the output holds
        assert rows[label][4] == f"{100 * compressed['bytes']['embedding']['after'] / (30522 * 64 * 4):.3g}%"
    for label, cells in rows.items():
        assert cells[6] == f"{scores[label] / scores['dense post-hoc']:.3f}"  # PRR against the dense reference
    assert (tmp_path / "runs/mine/pareto.png").stat().st_size > 0


@pytest.mark.slow
def test_the_shipped_template_plans_every_cell_on_minilm_saying_which_cannot_be_met(tmp_path, monkeypatch, capsys):
    """The template as shipped, pointed at the packaged MiniLM (30522 x 384): each method's cells met or left out by
    name, before anything runs."""
    monkeypatch.chdir(tmp_path)
    sweep = yaml.safe_load(TEMPLATE.read_text())
    text = yaml.safe_dump(sweep, sort_keys=False).replace("runs/my_finetune", "all-MiniLM-L6-v2")
    text = text.replace("../embedding/", f"{CONFIGS}/embedding/")
    (tmp_path / "minilm.yaml").write_text(text)
    assert main(["sweep", "--config", "minilm.yaml", "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "24 runs: 0 done, 0 diverged, 6 unmet, 0 running, 0 failed, 18 left" in plan
    assert "pq,budget=10pct: ProductQuantizedEmbedding cannot meet budget=0.1" in plan  # K = 256 is 1.36% at 8 groups
    for cell in ("sparse_coding,budget=10pct", "hashing_trick,budget=1pct", "robe,budget=1pct", "unk,budget=1pct"):
        assert f"left     compressed/method={cell}" in plan
