"""`lit-embed sweep`: plans and run names, skipping and resuming, stages, best-of selection, the SLURM job
arrays (without a cluster), `lit-embed report SWEEP_FOLDER`, and the demo sweep through the real CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from lit_embed import progress
from lit_embed.commands import main
from lit_embed.data.tasks import BENCHMARK_TABLES
from lit_embed.errors import BudgetError, ConfigError
from lit_embed.runs.folders import LOCK_FILE
from lit_embed.runs.results import RESULTS_FILE
from lit_embed.storage.files import write_json_atomic
from lit_embed.sweeps.launch import Launch, commands, launch_here, plan_text, summary
from lit_embed.sweeps.outcomes import (
    OUTPUT_FILE,
    STATUS_FILE,
    book,
    checkpoint_of,
    chosen,
    grids,
    outcome,
    resolve,
)
from lit_embed.sweeps.plan import MANIFEST, Sweep, candidates, load_sweep, manifest, read_manifest
from lit_embed.sweeps.slurm import job_script, submit
from tests.helpers import CONFIGS, REPO
from tests.helpers.standins import composed, compress_overrides, fit_overrides, write_task_data

FINETUNE = str(CONFIGS / "demo_finetune.yaml")
COMPRESS = str(CONFIGS / "compress" / "sparse_coding.yaml")


def sweep_file(tmp_path: Path, document: dict, name: str = "grid") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"folder": str(tmp_path / "out"), **document}, sort_keys=False))
    return path


def table6(tmp_path: Path) -> Path:
    """A k-sub-embedding-like sweep: two models x two tasks, an lr grid x 2 seeds, then a stage from its best."""
    return sweep_file(tmp_path, {"stages": {
        "mnli": {
            "config": FINETUNE,
            "axes": {"model": {"dense": {"model.init_args.embedding": "embedding/dense.yaml"},
                               "3se": {"model.init_args.embedding": "embedding/subspace_3.yaml"}},
                     "task": ["topics", "sst2"]},
            "search": {"model.init_args.optim.lr": [1.0e-4, 3.0e-5]},
            "seeds": [1, 2],
            "select": {"metric": "val/score", "mode": "max"},
        },
        "rte": {
            "config": FINETUNE,
            "set": {"model.init_args.checkpoint": "${mnli.checkpoint}"},
            "axes": {"model": {"dense": {}, "3se": {}}, "task": ["topics", "sst2"]},
            "seeds": [1, 2],
        },
    }})


def finish(run, score: float | None, status: str = "complete", task: str = "topics", label: str = "x") -> Path:
    """What a finished ``lit-embed fit`` leaves: a version folder with its best checkpoint and results.json."""
    folder = run.folder / "version_0"
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    (folder / "checkpoints" / "best.ckpt").write_bytes(b"weights")
    write_json_atomic(folder / RESULTS_FILE, {
        "format": 1, "status": status, "label": label, "task": task, "seed": run.seed, "paper": None,
        "metrics": {"test/accuracy": score, "val/score": score},
        "checkpoint": {"monitor": "val/score", "mode": "max", "best": "checkpoints/best.ckpt", "best_score": score},
    })
    return folder


# -- the plan -------------------------------------------------------------------------------------------------


def test_plan_names_every_run_from_its_values(tmp_path):
    sweep = load_sweep(table6(tmp_path))
    names = [run.id for run in sweep.runs]
    assert len(names) == len(set(names)) == 2 * 2 * 2 * 2 + 2 * 2 * 2
    assert names[:3] == ["mnli/model=dense,task=topics,lr=0.0001,seed=1", "mnli/model=dense,task=topics,lr=0.0001,seed=2",
                         "mnli/model=dense,task=topics,lr=3e-05,seed=1"]
    assert names[-1] == "rte/model=3se,task=sst2,seed=2"
    assert [r.id for r in load_sweep(table6(tmp_path)).runs] == names  # deterministic
    run = sweep.runs[0]
    assert run.folder == tmp_path / "out" / "mnli" / "model=dense,task=topics,lr=0.0001,seed=1"
    (argv,) = commands(run, Launch())
    assert argv[:3] == ["fit", "--config", FINETUNE]
    joined = " ".join(argv)
    for part in ("--model.init_args.embedding embedding/dense.yaml", "--task topics", "--model.init_args.optim.lr 0.0001",
                 "--seed_everything 1", f"--trainer.default_root_dir {run.folder}", "--ckpt_path last"):
        assert part in joined
    assert "--trainer.devices" not in joined  # local: the config decides where it runs
    (argv,) = commands(run, Launch("gpus", 2))
    assert argv[-4:] == ["--trainer.accelerator", "gpu", "--trainer.devices", "2"]
    later = sweep.run("rte/model=3se,task=sst2,seed=2")
    assert [d.id for d in later.dependencies] == [r.id for r in sweep.runs if r.id.startswith("mnli/model=3se,task=sst2,")]


def test_dry_run_prints_the_plan_through_the_cli(tmp_path, capsys):
    assert main(["sweep", "--config", str(table6(tmp_path)), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "stage mnli (fit): 16 runs; 2 grid points, the best per row on the highest val/score" in out
    assert "from mnli" in out and "'${mnli.checkpoint}'" in out
    assert out.rstrip().endswith("24 runs: 0 done, 0 diverged, 0 unmet, 0 running, 0 failed, 24 left")
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


@pytest.mark.parametrize(("document", "message"), [
    ({"stages": {"a": {"config": FINETUNE, "seeds": [1, 1]}}}, "seeds must be a list of distinct integers"),
    ({"stages": {"a": {"config": FINETUNE, "sed": [1]}}}, "unknown key sed"),
    ({"stages": {"a": {"config": "nowhere.yaml"}}}, "'nowhere.yaml' does not exist"),
    ({"stages": {"a": {"config": FINETUNE, "set": {"x": "${b.checkpoint}"}}, "b": {"config": FINETUNE}}},
     "refers to ${b...}, which is not an earlier stage"),
    ({"stages": {"a": {"config": FINETUNE, "axes": {"x": ["a b", "a_b"]}}}}, "would share the run folder name x=a_b: give each value a name"),
    ({"stages": {"a": {"config": FINETUNE, "axes": {"task": ["rte"]}},
                 "b": {"config": FINETUNE, "set": {"c": "${a.checkpoint}"}}}}, "whose runs differ in task"),
    ({"stages": {"a": {"config": FINETUNE, "axes": {"task": ["rte"]}, "label": "{lr}"}}}, "label '{lr}' names lr"),
    ({"stages": {}}, "needs `stages:`"),
    ({"stages": {"a": {"command": "compress", "config": COMPRESS, "test": "no"}}}, "stage 'a': test must be true or false"),
    ({"stages": {"a": {"config": FINETUNE, "test": False}}}, "stage 'a': test is a key of compress stages"),
    ({"stages": {"a": {"command": "compress", "config": COMPRESS, "tests": False}}}, "unknown key tests"),
])
def test_bad_sweep_files_are_named_with_the_fix(tmp_path, capsys, document, message):
    assert main(["sweep", "--config", str(sweep_file(tmp_path, document)), "--dry-run"]) == 2
    assert message in capsys.readouterr().err


def test_a_compress_stage_with_test_false_runs_compress_alone_and_is_done_when_its_model_is_written(tmp_path, capsys):
    """``test: false``: a model whose task head is not trained yet (fitted to a pretrained encoder) is not tested; the
    plan says so, the run is done when compress wrote its folder, and a later stage starts from its model."""
    path = sweep_file(tmp_path, {"stages": {
        "fitted": {"command": "compress", "config": COMPRESS, "test": False, "set": {"ckpt": "all-MiniLM-L6-v2"},
                   "axes": {"retention": [0.5]}},
        "tested": {"command": "compress", "config": COMPRESS, "set": {"ckpt": "all-MiniLM-L6-v2"}},
        "tuned": {"config": FINETUNE, "set": {"model.init_args.checkpoint": "${fitted.checkpoint}"}, "axes": {"retention": [0.5]}},
    }})
    sweep = load_sweep(path)
    fitted, tested, tuned = sweep.runs
    assert [argv[0] for argv in commands(fitted, Launch())] == ["compress"]
    assert [argv[0] for argv in commands(tested, Launch())] == ["compress", "test"]  # the default
    assert main(["sweep", "--config", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "stage fitted (compress, no test (test: false)): 1 runs" in out and "stage tested (compress, then test)" in out
    assert out.count("lit-embed test ") == 1  # the tested stage's only
    assert outcome(fitted).state == "left"
    (fitted.folder / "model.ckpt").parent.mkdir(parents=True)
    (fitted.folder / "model.ckpt").write_bytes(b"weights")
    assert outcome(fitted).state == "done" and outcome(tested).state == "left"
    assert resolve(tuned, sweep)["${fitted.checkpoint}"] == str(fitted.folder / "model.ckpt")
    write_json_atomic(sweep.folder / MANIFEST, manifest(sweep))
    recorded = read_manifest(sweep.folder)  # what report reads: the same states
    assert [s.test for s in recorded.stages] == [False, True, True]
    assert outcome(recorded.runs[0]).state == "done"


def test_a_post_hoc_fit_a_strategy_cannot_make_is_left_out_before_it_runs(tmp_path, capsys):
    """A compress run whose method refuses the model's table (a strategy with no vocabulary to fit; one whose
    structure cannot meet the budget, at the model's own 30522 x 384) is unmet in the plan, with the reason."""
    path = sweep_file(tmp_path, {"stages": {"posthoc": {
        "command": "compress", "config": str(CONFIGS / "sweeps" / "zoo" / "posthoc_fit.yaml"), "test": False,
        "axes": {"strategy": {name: {"strategy": str(CONFIGS / "embedding" / f"{name}.yaml")}
                              for name in ("md5_proj", "albert_factorized", "hashing_trick")},
                 "budget": {"1pct": {"budget": 0.01}}}},
        "baselines": {"command": "compress", "config": str(CONFIGS / "sweeps" / "zoo" / "posthoc_baseline.yaml"), "test": False,
                      "axes": {"method": {"svd_1pct": {"method": "svd", "budget": 0.01}, "int8": {"method": "int8"}}}}}})
    assert main(["sweep", "--config", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "unmet    posthoc/strategy=md5_proj,budget=1pct: HashProj does not index vocabulary ids" in out
    assert ("unmet    posthoc/strategy=albert_factorized,budget=1pct: FactorizedEmbedding cannot meet budget=0.01 "
            "(468,818 bytes, 1% of dense)") in out
    assert "left     posthoc/strategy=hashing_trick,budget=1pct\n" in out
    assert "unmet    baselines/method=svd_1pct: FactorizedEmbedding cannot meet budget=0.01 (468,818 bytes" in out
    assert "left     baselines/method=int8\n" in out
    assert "--strategy" in out and "--budget 0.01" in out


#: Names that would not be one folder of the sweep's own, and the rule each breaks.
UNSAFE_NAMES = [("..", "is the name of a folder itself or of its parent"), (".", "is the name of a folder itself or of its parent"),
                (".hidden", "starts with '.'"), ("a/b", "holds a path separator"), ("/tmp/x", "holds a path separator"),
                ("a\\b", "holds a path separator"), ("", "is empty"), ("a\x07b", "holds a control character")]


@pytest.mark.parametrize("place", ["stage", "axis", "value", "value of a list", "search value"])
@pytest.mark.parametrize(("name", "rule"), UNSAFE_NAMES, ids=[repr(n) for n, _ in UNSAFE_NAMES])
def test_names_that_become_folders_stay_inside_the_sweep_folder(tmp_path, capsys, place, name, rule):
    """A stage, an axis or a value names a folder of the sweep: one that would leave it (or hide in it) is refused
    with exit 2, naming it and the rule; nothing is written. A value of a list has its separators and control
    characters made '_' (it shows a config value; '' shows as '_'), so only '.', '..' and a leading '.' stay to refuse."""
    stage = {"config": FINETUNE}
    if place == "axis":
        stage["axes"] = {name: {"a": {}}}
    elif place == "value":
        stage["axes"] = {"model": {name: {}}}
    elif place == "value of a list":
        stage["axes"] = {"model.init_args.optim.lr": [name]}
    elif place == "search value":
        stage["search"] = {"model.init_args.optim.lr": [name, 0.1]}
    stages = {name if place == "stage" else "a": stage}
    status = main(["sweep", "--config", str(sweep_file(tmp_path, {"stages": stages})), "--dry-run"])
    error = capsys.readouterr().err
    sanitised = place in ("value of a list", "search value") and name not in (".", "..", ".hidden")
    if sanitised:
        assert status == 0, error
        return
    assert status == 2, error
    named = {"stage": "stage", "axis": "axis name", "value": "value", "value of a list": "value of axis",
             "search value": "value of axis"}[place]
    assert named in error and repr(name) in error, error
    assert rule in error or "a stage name is letters" in error or "may hold only letters" in error, error
    assert not (tmp_path / "out").exists()


def test_a_symlink_out_of_the_sweep_folder_is_refused_and_a_plan_that_leaves_it_is_not_read(tmp_path, capsys):
    """A run folder must resolve inside its sweep folder: a stage folder that is a symlink elsewhere is refused. A
    plan (sweep.json) naming a stage '..' is not read by report: its runs would be another sweep's."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "a").symlink_to(elsewhere)
    path = sweep_file(tmp_path, {"stages": {"a": {"config": FINETUNE}}})
    assert main(["sweep", "--config", str(path), "--dry-run"]) == 2
    error = capsys.readouterr().err
    assert f"resolves to {elsewhere}/run, outside the sweep folder {tmp_path / 'out'}" in error, error
    (tmp_path / "out" / "a").unlink()
    plan = manifest(load_sweep(path))
    plan["stages"][0]["name"] = ".."
    write_json_atomic(tmp_path / "out" / MANIFEST, plan)
    finish(load_sweep(path).runs[0], 0.9)  # a finished run where the plan's '..' points
    assert main(["report", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert f"{tmp_path / 'out' / MANIFEST} is not a sweep plan" in error and "stage name '..'" in error, error


# -- what is done, best of the grid, stages -----------------------------------------------------------------------


def test_best_grid_point_is_chosen_per_row_on_the_mean_over_seeds(tmp_path):
    sweep = load_sweep(table6(tmp_path))
    mnli, rte = sweep.stages
    for run in mnli.runs:  # lr 1e-4 wins for dense, 3e-5 for 3se (on the mean: one seed of the loser scores higher)
        lr = run.value("model.init_args.optim.lr")
        wins = (lr == "0.0001") == (run.value("model") == "dense")
        finish(run, (0.8 if wins else 0.7) + (0.15 if not wins and run.seed == 2 else 0.0) + 0.01 * run.seed)
    outcomes = {run.id: outcome(run) for run in sweep.runs}
    best = {dict(g.row)["model"] + "/" + dict(g.row)["task"]: g.best for g in grids(mnli, outcomes)}
    assert best == {"dense/topics": "lr=0.0001", "dense/sst2": "lr=0.0001", "3se/topics": "lr=3e-05", "3se/sst2": "lr=3e-05"}
    later = sweep.run("rte/model=3se,task=sst2,seed=2")
    taken = chosen(later, mnli)
    assert taken.id == "mnli/model=3se,task=sst2,lr=3e-05,seed=2"  # the best point, with the same seed
    paths = resolve(later, sweep)
    assert paths["${mnli.checkpoint}"] == str(taken.folder / "version_0" / "checkpoints" / "best.ckpt")
    (argv,) = commands(later, Launch(), paths)
    assert f"--model.init_args.checkpoint {taken.folder}/version_0/checkpoints/best.ckpt" in " ".join(argv)


def test_a_stage_waits_for_the_runs_it_starts_from(tmp_path):
    sweep = load_sweep(table6(tmp_path))
    mnli = sweep.stages[0]
    for run in mnli.runs[1:]:
        finish(run, 0.8)
    later = sweep.run("rte/model=dense,task=topics,seed=1")
    with pytest.raises(ConfigError, match=r"whose runs mnli/model=dense,task=topics,lr=0.0001,seed=1 \(left\) have not finished"):
        resolve(later, sweep)
    text = plan_text(sweep, Launch())
    assert "'${mnli.checkpoint}'" in text  # unresolved until its runs finish
    finish(mnli.runs[0], 0.8, status="interrupted")  # a run stopped by a signal is not done
    assert outcome(mnli.runs[0]).state == "left"
    finish(mnli.runs[0], 0.8, status="untested")  # nor one whose fit finished and whose test did not run
    write_json_atomic(book(mnli.runs[0]) / STATUS_FILE, {"state": "exited", "exit": 143, "error": None})
    assert outcome(mnli.runs[0]).state == "left" and "resumes" in outcome(mnli.runs[0]).detail


def test_a_run_that_diverged_is_settled_left_out_of_its_grid_and_not_started_again(tmp_path, monkeypatch, capsys):
    """Launching again would diverge again: the run is not started, its grid point is chosen on the other seeds and
    points, later stages start from the others, and the progress table says why."""
    sweep = load_sweep(table6(tmp_path))
    mnli, rte = sweep.stages
    for run in mnli.runs:  # lr 1e-4 wins on score, but diverged on dense/topics with seed 1
        high = run.value("model.init_args.optim.lr") == "0.0001"
        if high and run.row == mnli.runs[0].row and run.seed == 1:
            folder = finish(run, float("nan"), status="diverged")
            write_json_atomic(folder / RESULTS_FILE, {**json.loads((folder / RESULTS_FILE).read_text()),
                                                       "detail": "the training loss was nan at step 7"})
            diverged = run
            continue
        finish(run, 0.8 if high else 0.7, task=run.value("task"))
    found = outcome(diverged)
    assert found.state == "diverged" and found.detail.startswith("the training loss was nan at step 7 (remove ")
    outcomes = {run.id: outcome(run) for run in sweep.runs}
    (grid,) = [g for g in grids(mnli, outcomes) if g.row == diverged.row]
    assert grid.best == "lr=0.0001" and grid.scores["lr=0.0001"] == {2: 0.8}  # the seed that finished
    later = sweep.run("rte/model=dense,task=topics,seed=1")
    assert chosen(later, mnli).id == "mnli/model=dense,task=topics,lr=0.0001,seed=2"  # its seed diverged: the best other
    started = []
    monkeypatch.setattr("lit_embed.sweeps.launch._start", lambda sweep, run, launch, gpus: started.append(run.id) or FakeProcess())
    launch_here(Sweep(sweep.path, sweep.folder, [mnli]), Launch(), say=lambda line: None)
    assert started == []  # every run of the stage is settled
    text = summary(sweep, outcomes)
    assert "1 diverged" in text and f"diverged {diverged.id}: the training loss was nan at step 7" in text
    assert main(["sweep", "--config", str(sweep.path), "--run", diverged.id]) == 0
    assert "the training loss was nan at step 7" in capsys.readouterr().out  # nothing to do
    for run in mnli.runs:
        if run.row == diverged.row:
            finish(run, float("nan"), status="diverged")
    with pytest.raises(ConfigError, match=r"whose runs for it all diverged"):
        chosen(later, mnli)


def budgets(tmp_path: Path) -> Path:
    """A zoo-like sweep on the demo's 30522 x 64 table at 1% of its bytes (78,136): the hashing trick meets it, ALBERT's
    factorisation cannot (its smallest is 122,344 bytes), and a strategy file that does not exist fails otherwise; then a
    stage that fine-tunes each."""
    strategies = {"hashing": {"model.init_args.embedding": str(CONFIGS / "embedding" / "hashing_trick.yaml")},
                  "albert": {"model.init_args.embedding": str(CONFIGS / "embedding" / "albert_factorized.yaml")},
                  "broken": {"model.init_args.embedding": str(tmp_path / "nowhere.yaml")}}
    return sweep_file(tmp_path, {"stages": {
        "pretrain": {"config": str(CONFIGS / "sweeps" / "zoo" / "demo_pretrain.yaml"),
                     "axes": {"strategy": strategies, "budget": {"1pct": {"model.init_args.embedding.init_args.budget": 78136}}},
                     "seeds": [0]},
        "finetune": {"config": str(CONFIGS / "sweeps" / "zoo" / "demo_finetune.yaml"),
                     "set": {"model.init_args.checkpoint": "${pretrain.checkpoint}"},
                     "axes": {"strategy": {name: {} for name in strategies}, "budget": {"1pct": {}}}, "seeds": [0, 1]},
    }})


def test_a_cell_whose_strategy_cannot_meet_its_budget_is_left_out_said_and_never_started(tmp_path, monkeypatch, capsys):
    path = budgets(tmp_path)
    assert main(["sweep", "--config", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    cause = "unmet    pretrain/strategy=albert,budget=1pct,seed=0: FactorizedEmbedding cannot meet budget=78136"
    assert cause in out and "the nearest it can meet is 122,344" in out
    for seed in (0, 1):
        assert (f"unmet    finetune/strategy=albert,budget=1pct,seed={seed}: starts from "
                f"pretrain/strategy=albert,budget=1pct,seed=0, which is left out") in out
    for name in ("hashing", "broken"):  # met, or failing for another reason: its run reports that
        assert f"left     pretrain/strategy={name},budget=1pct,seed=0\n" in out
    assert "9 runs: 0 done, 0 diverged, 3 unmet, 0 running, 0 failed, 6 left" in out
    assert "unmet    2 more start from runs left out" in out  # the summary names the causes, counts the rest
    assert not (tmp_path / "out").exists()  # a dry run writes nothing
    started = []
    monkeypatch.setattr("lit_embed.sweeps.launch._start", lambda sweep, run, launch, gpus: started.append(run.id) or FakeProcess())
    assert main(["sweep", "--config", str(path)]) == 2  # the stand-ins leave nothing: failed and waiting, not unmet
    assert started == ["pretrain/strategy=hashing,budget=1pct,seed=0", "pretrain/strategy=broken,budget=1pct,seed=0"]
    plan = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert sorted(plan["unmet"]) == ["finetune/strategy=albert,budget=1pct,seed=0",
                                     "finetune/strategy=albert,budget=1pct,seed=1", "pretrain/strategy=albert,budget=1pct,seed=0"]
    capsys.readouterr()
    assert main(["report", str(tmp_path / "out")]) == 0
    report = capsys.readouterr().out
    assert "| pretrain | 3 | 0 | 0 | 1 | 0 | 0 | 2 |" in report  # Runs, Done, Diverged, Unmet, Running, Failed, Left
    assert "- pretrain/strategy=albert,budget=1pct,seed=0: unmet (FactorizedEmbedding cannot meet budget=78136" in report


def hold_elsewhere(folder: Path) -> subprocess.Popen:
    """A process that holds ``folder``'s lock as ``folders.hold`` takes it (without importing torch) until it reads a line."""
    folder.mkdir(parents=True, exist_ok=True)
    script = (f"import fcntl, os; fd = os.open({str(folder / LOCK_FILE)!r}, os.O_RDWR | os.O_CREAT); "
              "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('held', flush=True); input()")
    holder = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout.readline() == b"held\n"
    return holder


def test_finished_runs_are_skipped_killed_ones_resumed_failed_ones_explained(tmp_path, monkeypatch):
    path = sweep_file(tmp_path, {"stages": {"a": {"config": FINETUNE, "search": {"model.init_args.optim.lr": [1, 2, 3, 4]}}}})
    sweep = load_sweep(path)
    done, killed, failed, running = sweep.runs
    finish(done, 0.9)
    for run in (killed, running):  # both said they were running; only one's process still holds its lock
        write_json_atomic(book(run) / STATUS_FILE, {"state": "running", "host": "node7", "pid": 2**22 + 7})
    holder = hold_elsewhere(book(running))
    write_json_atomic(book(failed) / STATUS_FILE, {"state": "exited", "exit": 1, "error": None})
    book(failed).joinpath(OUTPUT_FILE).write_text("Traceback ...\n  raise\nRuntimeError: CUDA out of memory\nsomething\n")
    outcomes = {run.id: outcome(run) for run in sweep.runs}
    assert [outcomes[r.id].state for r in sweep.runs] == ["done", "left", "failed", "running"]
    assert "resumes from its last checkpoint" in outcomes[killed.id].detail
    text = summary(sweep, outcomes)
    assert "4 runs: 1 done, 0 diverged, 0 unmet, 1 running, 1 failed, 1 left" in text
    assert "running  a/lr=4: process 4194311 on node7" in text
    assert "failed   a/lr=3: RuntimeError: CUDA out of memory" in text

    started = []

    def start(sweep, run, launch, gpus):
        started.append(run.id)
        return FakeProcess()

    monkeypatch.setattr("lit_embed.sweeps.launch._start", start)
    launch_here(sweep, Launch(), say=lambda line: None)
    assert started == [killed.id, failed.id]  # the done run is skipped, the running one left to its process
    holder.communicate(b"\n", timeout=30)
    assert outcome(running).state == "left"  # its process ended without finishing: the next launch resumes it
    assert (sweep.folder / MANIFEST).is_file()



def inline_sweep(tmp_path: Path, monkeypatch, execute) -> tuple[Path, list]:
    """Two runs of one stage, ``--launcher inline``, whose commands ``execute(run, argv)`` stands in for."""
    path = sweep_file(tmp_path, {"stages": {"a": {"config": FINETUNE, "search": {"model.init_args.optim.lr": [1, 2]}}}})
    runs = load_sweep(path).runs
    by_folder = {str(run.folder): run for run in runs}

    def standin(argv: list[str]) -> None:
        execute(by_folder[argv[argv.index("--trainer.default_root_dir") + 1]], argv)

    monkeypatch.setattr("lit_embed.commands.sweep.execute", standin)
    return path, runs


def test_inline_launcher_runs_each_run_in_this_process_with_its_own_log_and_status_one_failing(tmp_path, monkeypatch,
                                                                                              capsys):
    """A run that fails is recorded (exit status, error, traceback in its log) and the next one still runs; each run's
    output, Python's and the file descriptors' alike, goes to its own log, not the launcher's."""
    def execute(run, argv):
        if run.value("model.init_args.optim.lr") == "1":
            raise RuntimeError("boom in the first run")
        print("printed by the second run")
        os.write(2, b"written to fd 2 by the second run\n")
        finish(run, 0.5)

    path, (first, second) = inline_sweep(tmp_path, monkeypatch, execute)
    assert main(["sweep", "--config", str(path), "--launcher", "inline"]) == 2  # a failed run: fix it, run again
    captured = capsys.readouterr()
    assert "[1/2] start a/lr=1" in captured.out
    assert re.search(r"failed a/lr=1 \(\d+ s, \d+ s CPU\): RuntimeError: boom in the first run", captured.out)
    assert "done a/lr=2" in captured.out and "printed by the second run" not in captured.out + captured.err
    assert "failed   a/lr=1: RuntimeError: boom in the first run" in captured.out  # the summary
    status = json.loads((book(first) / STATUS_FILE).read_text())
    assert status["state"] == "exited" and status["exit"] == 1 and status["pid"] == os.getpid()
    failed_log = (book(first) / OUTPUT_FILE).read_text()
    assert "Traceback" in failed_log and "RuntimeError: boom in the first run" in failed_log
    assert "--run a/lr=1 --launcher inline (in the launching process" in failed_log
    log = (book(second) / OUTPUT_FILE).read_text()
    assert "printed by the second run" in log and "written to fd 2 by the second run" in log
    assert json.loads((book(second) / STATUS_FILE).read_text())["exit"] == 0
    assert [outcome(r).state for r in (first, second)] == ["failed", "done"]
    print("the launcher's output is its own again")
    assert "the launcher's output is its own again" in capsys.readouterr().out


def test_inline_launcher_stops_at_a_signal_recording_the_run_as_stopped_and_starting_no_other(tmp_path, monkeypatch,
                                                                                             capsys):
    def execute(run, argv):
        signal.raise_signal(signal.SIGTERM)  # outside a training loop: the command stops at once

    path, (first, second) = inline_sweep(tmp_path, monkeypatch, execute)
    assert main(["sweep", "--config", str(path), "--launcher", "inline"]) == 128 + signal.SIGTERM
    assert json.loads((book(first) / STATUS_FILE).read_text())["exit"] == 128 + signal.SIGTERM
    assert outcome(first).state == "left" and "stopped by a signal" in outcome(first).detail  # it resumes next time
    assert not book(second).exists()  # never started
    assert "[1/2] start a/lr=1" in capsys.readouterr().out


def test_a_cell_found_unmet_when_it_runs_is_left_out_with_the_runs_that_start_from_it(tmp_path, monkeypatch, capsys):
    """A budget the plan cannot check (sized on the run's own token counts) refused when the run sizes its strategy: the
    run is unmet, not failed, as is every run that could start only from such runs; the launch ends without error."""
    path = sweep_file(tmp_path, {"stages": {
        "a": {"config": FINETUNE, "search": {"model.init_args.optim.lr": [1, 2]}},
        "b": {"config": FINETUNE, "set": {"model.init_args.checkpoint": "${a.checkpoint}"}}}})
    runs = load_sweep(path).runs
    by_folder = {str(run.folder): run for run in runs}
    executed = []

    def standin(argv: list[str]) -> None:
        run = by_folder[argv[argv.index("--trainer.default_root_dir") + 1]]
        executed.append(run.id)
        try:
            raise BudgetError("MixedDimensionEmbedding cannot meet budget=0.1 within 1%: the nearest it can meet is 9.22%")
        except BudgetError as error:
            raise ConfigError("model.init_args.embedding: could not build it") from error  # as a parser wraps it

    monkeypatch.setattr("lit_embed.commands.sweep.execute", standin)
    assert main(["sweep", "--config", str(path), "--launcher", "inline"]) == 0
    out = capsys.readouterr().out
    assert executed == ["a/lr=1", "a/lr=2"]  # b never starts
    first, second, last = runs
    assert outcome(first).state == "unmet" and "cannot meet budget=0.1" in outcome(first).detail
    status = json.loads((book(first) / STATUS_FILE).read_text())
    assert status["state"] == "unmet" and status["exit"] == 2
    assert "3 runs: 0 done, 0 diverged, 3 unmet, 0 running, 0 failed, 0 left" in out
    assert "unmet    a/lr=1: MixedDimensionEmbedding cannot meet budget=0.1" in out
    outcomes = {run.id: outcome(run) for run in runs}
    started = []  # the local launcher, later
    monkeypatch.setattr("lit_embed.sweeps.launch._start", lambda sweep, run, launch, gpus: started.append(run.id) or FakeProcess())
    assert set(launch_here(load_sweep(path), Launch(), say=lambda line: None)) == set(outcomes)
    assert started == [first.id, second.id]  # the refusals are checked again: a budget may have been edited since
    monkeypatch.setattr("lit_embed.commands.sweep.execute", lambda argv: (executed.append(argv) or
                                                                          finish(by_folder[argv[argv.index("--trainer.default_root_dir") + 1]], 0.5)))
    assert main(["sweep", "--config", str(path), "--launcher", "inline"]) == 0  # budgets edited: every run now runs
    assert [outcome(run).state for run in runs] == ["done", "done", "done"]


def test_a_run_is_never_started_twice(tmp_path, capsys):
    path = sweep_file(tmp_path, {"stages": {"a": {"config": FINETUNE}}})
    (run,) = load_sweep(path).runs
    write_json_atomic(book(run) / STATUS_FILE, {"state": "running", "host": "node7", "pid": 4242})
    holder = hold_elsewhere(book(run))
    try:
        assert main(["sweep", "--config", str(path), "--run", run.id]) == 2
        assert "a/run is running already (process 4242 on node7): wait for it" in capsys.readouterr().err
    finally:
        holder.communicate(b"\n", timeout=30)
    assert not run.folder.exists()

class FakeProcess:
    """A run process that ends after a few polls, leaving nothing behind (so it shows as failed)."""

    returncode = 1

    def __init__(self, polls: int = 1):
        self.polls = polls

    def poll(self):
        self.polls -= 1
        return 1 if self.polls < 0 else None


def test_gpus_launcher_runs_one_run_per_visible_gpu_at_a_time(tmp_path, monkeypatch):
    path = sweep_file(tmp_path, {"stages": {"a": {"config": FINETUNE, "search": {"model.init_args.optim.lr": [1, 2, 3]}}}})
    sweep = load_sweep(path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.setattr("lit_embed.sweeps.launch.POLL_SECONDS", 0)
    started: list[tuple[str, list[str], int]] = []
    live: list[FakeProcess] = []

    def start(sweep, run, launch, gpus):
        live.append(FakeProcess(polls=2))
        started.append((run.id, list(gpus), sum(p.polls >= 0 for p in live)))
        return live[-1]

    monkeypatch.setattr("lit_embed.sweeps.launch._start", start)
    launch_here(sweep, Launch("gpus"), say=lambda line: None)
    assert [(rid, gpus) for rid, gpus, _ in started] == [("a/lr=1", ["3"]), ("a/lr=2", ["5"]), ("a/lr=3", ["3"])]
    assert started[1][2] == 2  # two at once
    started.clear()
    launch_here(sweep, Launch("gpus", 2), say=lambda line: None)  # DDP over both: one run at a time
    assert [gpus for _, gpus, _ in started] == [["3", "5"]] * 3
    with pytest.raises(ConfigError, match="takes 3 GPUs but 2 are visible"):
        launch_here(sweep, Launch("gpus", 3), say=lambda line: None)
    (argv,) = commands(sweep.runs[0], Launch("gpus", 2))
    assert argv[-4:] == ["--trainer.accelerator", "gpu", "--trainer.devices", "2"]


def test_a_sweep_whose_output_goes_to_a_file_says_its_progress_in_lines(tmp_path, monkeypatch, capsys):
    """stderr no terminal (pytest's capture): the runs ended of those to run, an ETA from their times and the runs
    running, while it waits (here at every look) and as each run ends; a closing line; nothing extra on a terminal."""
    path = sweep_file(tmp_path, {"stages": {"a": {"config": FINETUNE, "search": {"model.init_args.optim.lr": [1, 2, 3]}}}})
    sweep = load_sweep(path)
    monkeypatch.setattr(progress, "INTERVAL", 0.0)
    monkeypatch.setattr("lit_embed.sweeps.launch.POLL_SECONDS", 0)
    monkeypatch.setattr("lit_embed.sweeps.launch._start", lambda sweep, run, launch, gpus: FakeProcess(polls=2))
    launch_here(sweep, Launch(), say=lambda line: None)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sweep run")]
    assert lines[0] == "sweep run 0/3 (0.0%), running a/lr=1 for 0s"
    ended = [line for line in lines if not line.startswith("sweep run 0/")]
    assert [line.split(" (")[0] for line in ended if ", running none" in line] == ["sweep run 1/3", "sweep run 2/3",
                                                                                  "sweep run 3/3"]
    assert re.search(r"^sweep run 1/3 \(33\.3%\), .*, ETA \d+s, running", ended[0])
    assert re.search(r"^sweep run 3/3 \(100\.0%\), .*, done in \d+s, running none$", lines[-1])
    for rerun in sweep.runs:
        shutil.rmtree(rerun.folder, ignore_errors=True)
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: True)
    launch_here(sweep, Launch(), say=lambda line: None)
    assert "sweep run" not in capsys.readouterr().err

# -- SLURM -------------------------------------------------------------------------------------------------------


def fake_program(folder: Path, name: str, body: str) -> None:
    folder.mkdir(exist_ok=True)
    program = folder / name
    program.write_text("#!/bin/bash\n" + textwrap.dedent(body))
    program.chmod(program.stat().st_mode | stat.S_IEXEC)


def test_slurm_submits_one_array_per_stage_after_the_stages_it_starts_from(tmp_path, monkeypatch):
    path = table6(tmp_path)
    document = yaml.safe_load(path.read_text())
    document["slurm"] = {"time": "04:00:00", "partition": "gpu", "max_parallel": 8}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    sweep = load_sweep(path)
    finish(sweep.runs[0], 0.8)  # done: not queued again
    bin_dir = tmp_path / "bin"
    fake_program(bin_dir, "sbatch", f"""\
        echo "$@" >> {tmp_path}/sbatch.calls
        [ -f {tmp_path}/job ] && echo $(( $(cat {tmp_path}/job) + 1 )) > {tmp_path}/job || echo 4100 > {tmp_path}/job
        echo "$(cat {tmp_path}/job);cluster"
    """)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(REPO)
    submit(sweep, Launch("slurm", 1), say=lambda line: None)
    calls = (tmp_path / "sbatch.calls").read_text().splitlines()
    assert calls == [f"--parsable {sweep.folder}/slurm/mnli.sbatch",
                     f"--parsable --dependency=afterany:4100 {sweep.folder}/slurm/rte.sbatch"]
    script = (sweep.folder / "slurm" / "mnli.sbatch").read_text()
    for line in ("#SBATCH --array=0-14%8", "#SBATCH --requeue", "#SBATCH --signal=SIGUSR1@120", "#SBATCH --gpus-per-node=1",
                 "#SBATCH --time=04:00:00", "#SBATCH --partition=gpu", "#SBATCH --ntasks-per-node=1"):
        assert line in script.splitlines()
    assert "model=dense,task=topics,lr=0.0001,seed=1" not in script  # done

    # An array task runs `lit-embed sweep --run` on its own run (srun replaced by one that prints its command).
    fake_program(bin_dir, "srun", 'printf "%s\\n" "$@"\n')
    environment = {**os.environ, "SLURM_ARRAY_TASK_ID": "2"}
    subprocess.run(["bash", str(sweep.folder / "slurm" / "mnli.sbatch")], check=True, env=environment)
    printed = (sweep.folder / "logs" / "mnli" / "model=dense,task=topics,lr=3e-05,seed=2" / OUTPUT_FILE).read_text().split("\n")
    assert printed[:3] == [sys.executable, "-m", "lit_embed.commands"]
    assert printed[printed.index("--run") + 1] == "mnli/model=dense,task=topics,lr=3e-05,seed=2"
    assert printed[printed.index("--launcher") + 1] == "slurm"


def test_slurm_dry_run_writes_the_scripts_without_sbatch(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    path = table6(tmp_path)
    assert main(["sweep", "--config", str(path), "--launcher", "slurm", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would submit stage rte (8 runs): sbatch --parsable '--dependency=afterany:$MNLI_JOB'" in out
    assert (tmp_path / "out" / "slurm" / "rte.sbatch").is_file()
    assert main(["sweep", "--config", str(path), "--launcher", "slurm"]) == 2
    assert "sbatch is not on the PATH" in capsys.readouterr().err


def test_job_script_runs_ddp_with_one_task_per_gpu(tmp_path):
    sweep = load_sweep(table6(tmp_path))
    script = job_script(sweep, sweep.stages[0], sweep.stages[0].runs, Launch("slurm", 4))
    assert "#SBATCH --ntasks-per-node=4" in script and "#SBATCH --gpus-per-node=4" in script
    assert "--gpus-per-run 4" in script


# -- report ------------------------------------------------------------------------------------------------------


def test_report_of_a_sweep_averages_the_chosen_point_over_seeds_and_names_what_is_missing(tmp_path, capsys):
    sweep = load_sweep(table6(tmp_path))
    mnli, rte = sweep.stages
    for run in mnli.runs:
        if run.id == "mnli/model=3se,task=sst2,lr=3e-05,seed=2":
            continue  # not run yet
        good = run.value("model.init_args.optim.lr") == "0.0001"
        finish(run, (0.8 if good else 0.6) + 0.02 * run.seed, task=run.value("task"))
    write_json_atomic(sweep.folder / MANIFEST, manifest(sweep))
    assert main(["report", str(sweep.folder), "--digits", "1"]) == 0
    out = capsys.readouterr().out
    demo = out.split("### ", 2)[1]
    # dense on topics: lr=1e-4, seeds 1 and 2: 82 and 84 -> 83.0 ± 1.4
    assert "| dense |" in demo and "83.0 ± 1.4" in demo
    assert "Grid search, stage mnli" in out and "lr=0.0001" in out
    assert "| dense | topics | 83.0 ± 1.4 | 63.0 ± 1.4 | lr=0.0001 |" in out  # val/score x 100, as the tables above
    assert "the highest val/score of its best checkpoint x 100" in out
    assert "mnli/model=3se,task=sst2,lr=3e-05,seed=2: left" in out
    assert "rte/model=dense,task=topics,seed=1: left" in out
    probe = ("import sys; from lit_embed.commands import main; status = main(['report', sys.argv[1]]); "
             "print([m for m in ('torch', 'pytorch_lightning') if m in sys.modules], status)")
    done = subprocess.run([sys.executable, "-c", probe, str(sweep.folder)], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[] 0"  # a sweep's report imports neither (seconds otherwise)


def test_two_runs_of_one_cell_are_refused_outside_a_sweep(tmp_path, capsys):
    """A cell holds one run per seed, in every table (pre-training runs too): two are refused, never averaged."""
    for name in ("a", "b"):
        write_json_atomic(tmp_path / name / RESULTS_FILE, {"format": 1, "label": "demo", "task": None, "seed": 0,
                                                           "metrics": {"val/loss": 2.0}})
    assert main(["report", str(tmp_path)]) == 2
    assert "a cell holds one run per seed" in capsys.readouterr().err


# -- the real CLI ------------------------------------------------------------------------------------------------


def short_demo_sweep(tmp_path: Path) -> Path:
    """configs/sweeps/demo.yaml, shortened: a few steps per fine-tuning, one seed, one retention; written to a folder of
    its own, its config files named relative to it (``../..`` up to the repository)."""
    document = yaml.safe_load((CONFIGS / "sweeps" / "demo.yaml").read_text())
    document["folder"] = str(tmp_path / "demo")
    finetune, compress = document["stages"]["finetune"], document["stages"]["compress"]
    finetune["set"].update({"trainer.max_epochs": 1, "trainer.max_steps": 6, "trainer.limit_val_batches": 2,
                            "trainer.limit_test_batches": 2, "trainer.val_check_interval": 3,
                            "trainer.enable_progress_bar": False, "trainer.enable_model_summary": False,
                            "data.init_args.batch_size": 4})
    finetune["seeds"] = compress["seeds"] = [0]
    compress["axes"]["retention"] = [0.5]
    compress["set"]["k"] = [1]
    path = tmp_path / "sweeps" / "demo.yaml"
    path.parent.mkdir()

    def moved(name: str) -> str:
        return os.path.relpath(os.path.normpath(CONFIGS / "sweeps" / name), path.parent)

    for stage in (finetune, compress):
        stage["config"] = moved(stage["config"])
    finetune["set"]["model.init_args.embedding"] = moved(finetune["set"]["model.init_args.embedding"])
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_demo_sweep_runs_through_the_cli_and_ends_in_a_report(tmp_path, capsys, monkeypatch):
    """The one test of the real thing: `lit-embed sweep` on the (shortened) demo sweep, from a folder that is neither
    the repository's nor the sweep file's, again (nothing to do), and `lit-embed report` on its folder."""
    path = short_demo_sweep(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["sweep", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "3 runs: 3 done, 0 diverged, 0 unmet, 0 running, 0 failed, 0 left" in out
    assert main(["sweep", "--config", str(path)]) == 0
    assert "start" not in capsys.readouterr().out  # finished runs are skipped
    assert main(["report", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "| dense |" in out and "| sparse coding r=0.5 |" in out
    assert "Grid search, stage finetune" in out


@pytest.mark.slow
def test_a_killed_sweep_resumes_its_run_from_the_last_checkpoint(tmp_path):
    """SIGTERM to `lit-embed sweep`: the run saves last.ckpt and stops; the same command resumes it."""
    path = short_demo_sweep(tmp_path)
    document = yaml.safe_load(path.read_text())
    document["stages"] = {"finetune": document["stages"]["finetune"]}
    document["stages"]["finetune"]["search"] = {"model.init_args.optim.lr": [1.0e-3]}
    document["stages"]["finetune"]["set"].update({"trainer.max_steps": 120, "trainer.val_check_interval": 20})
    path.write_text(yaml.safe_dump(document))
    command = [sys.executable, "-m", "lit_embed.commands", "sweep", "--config", str(path)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    sweep = load_sweep(path)
    (run,) = sweep.runs
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while not list(run.folder.glob("version_0/checkpoints/*.ckpt")):
        assert process.poll() is None and time.monotonic() < deadline, process.stdout.read().decode()
        time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=120)
    assert outcome(run).state == "left"
    assert (run.folder / "version_0" / "checkpoints" / "last.ckpt").is_file()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert outcome(run).state == "done"
    assert "Restoring states from the checkpoint" in (book(run) / OUTPUT_FILE).read_text()
    shutil.rmtree(tmp_path / "demo")


# -- the shipped sweep files ------------------------------------------------------------------------------------


SHIPPED = sorted((CONFIGS / "sweeps").glob("*.yaml"))
ZOO = ("zoo", "zoo_glue")
#: Templates that start from a run of the user's (tests/test_own_checkpoint_sweep.py runs them on one made there).
TEMPLATES = ("own_checkpoint",)
RUNNABLE = [path for path in SHIPPED if path.stem not in TEMPLATES]
#: Twins of a sweep CI runs (the same stages on another benchmark): run and planned by -m slow only, for CI's time.
TWINS = {"sparse_coding_jglue": "sparse_coding_glue", "zoo_glue": "zoo"}


def shipped(paths: list[Path]) -> list:
    """``paths`` as parameters, a twin marked slow."""
    return [pytest.param(path, id=path.stem, marks=[pytest.mark.slow] if path.stem in TWINS else []) for path in paths]


def test_the_papers_sweep_files_plan_their_tables(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # any folder: a sweep file names its configs relative to itself
    assert {p.stem for p in SHIPPED} >= {"demo", "k_sub_embedding_glue", "hashformers_glue", "sparse_coding_glue",
                                        "sparse_coding_jglue", "xnli"}
    plans = {p.stem: load_sweep(p) for p in RUNNABLE if p.stem not in ZOO}
    stages = {name: {s.name: s for s in sweep.stages} for name, sweep in plans.items()}
    k_sub = stages["k_sub_embedding_glue"]
    assert len({r.point for r in k_sub["mnli"].runs}) == 6  # Table 6: lr {1, 2, 3}e-5 x batch {16, 32}
    assert {r.value("task") for r in k_sub["from_mnli"].runs} == {"rte", "mrpc", "stsb"}
    assert k_sub["from_mnli"].references == ["mnli"]
    # Each paper's models are pre-trained by its own sweep (one run each, one node of 8 GPUs), 26 in all.
    pretraining = {name: [s for s in plan.values() if s.name.startswith("pretrain")] for name, plan in stages.items()}
    assert {name: sum(len(s.runs) for s in found) for name, found in pretraining.items() if found} == {
        "hashformers_glue": 12 + 4, "k_sub_embedding_glue": 10, "xnli": 3}
    for found in pretraining.values():
        for stage in found:
            assert stage.seeds is None and stage.gpus_per_run == 8 and stage.slurm["time"] == "48:00:00"
            assert all(run.configs()[0].startswith(f"{CONFIGS}/experiments/") for run in stage.runs)
    for name, plan in stages.items():
        for stage in plan.values():
            values = [str(v) for run in stage.runs for _, v in run.overrides()]
            assert not [v for v in values if v.startswith("runs/")], f"{name}/{stage.name} starts from a run made by hand"
            if stage.name.startswith("pretrain"):
                continue
            assert stage.gpus_per_run == 1  # fine-tuning: one GPU, as the papers
            for run in stage.runs:  # a run starts from the earlier runs of its own model
                assert all(d.value("model") == run.value("model") for d in run.dependencies)
    assert {s.name: s.references for s in [*k_sub.values(), *stages["xnli"].values()]} == {
        "pretrain": [], "glue": ["pretrain"], "mnli": ["pretrain"], "from_mnli": ["mnli"], "cross_lingual": ["pretrain"],
        "translate_train_all": ["pretrain"]}
    hashformers = stages["hashformers_glue"]
    assert list(hashformers) == ["pretrain", "pretrain_subword", "glue", "proformer", "canine_c", "glue_subword"]
    assert hashformers["glue"].references == ["pretrain"] and hashformers["glue_subword"].references == ["pretrain_subword"]
    assert {len(r.dependencies) for s in ("glue", "glue_subword") for r in hashformers[s].runs} == {1}
    for name in ("glue", "proformer", "canine_c", "glue_subword"):
        assert hashformers[name].seeds == [0, 1, 2]  # tr_glue.py:374
        assert {r.value("task") for r in hashformers[name].runs} == set(BENCHMARK_TABLES["GLUE"])
    for name in ("proformer", "canine_c"):  # trained on each task from their own configs: no pre-training run
        stage = hashformers[name]
        assert not stage.references and stage.configs == [f"{CONFIGS}/experiments/hashformers/{name}.yaml"]
        assert all(not run.configs()[:-1] and "model.init_args.checkpoint" not in dict(run.overrides())
                   for run in stage.runs)
        assert {r.label for r in stage.runs} == {name}
    for name in ("sparse_coding_glue", "sparse_coding_jglue"):
        compress = stages[name]["compress"]
        assert {r.value("method") for r in compress.runs} == {"sparse_coding", "unk", "pca"}
        assert {r.value("retention") for r in compress.runs} == {"0.5", "0.6", "0.7", "0.8", "0.9", "1"}
        assert stages[name]["aq"].command == "compress"
    assert list(stages["xnli"]) == ["pretrain", "cross_lingual", "translate_train_all"]


@pytest.mark.parametrize(("name", "dense"), [("zoo", 30522 * 64), ("zoo_glue", 50265 * 512)])
def test_the_zoo_sweeps_pretrain_every_strategy_at_three_budgets_then_fine_tune_each_with_three_seeds(name, dense):
    stages = {s.name: s for s in load_sweep(CONFIGS / "sweeps" / f"{name}.yaml").stages}
    assert list(stages)[:1] == ["pretrain"] and {"pretrain_dense"} <= set(stages)
    pretrain = stages["pretrain"]
    strategies = {}
    for run in pretrain.runs:
        overrides = dict(run.overrides())
        assert overrides["model.init_args.embedding.init_args.budget"] in [round(f * dense * 4) for f in (0.1, 0.01, 0.001)]  # bytes
        config = Path(run.configs()[0])  # else the experiment config's own strategy file, named relative to it
        embedding = overrides.get("model.init_args.embedding") or config.parent / yaml.safe_load(config.read_text())[
            "model"]["init_args"]["embedding"]
        strategies[run.value("strategy")] = yaml.safe_load(Path(embedding).read_text())["class_path"]
    classes = {path.rsplit(".", 1)[-1] for path in strategies.values()}
    assert classes == {"SubspaceEmbedding", "HashEmbedding", "HashProj", "HashingTrickEmbedding", "WeightedHashEmbedding",
                       "QREmbedding", "TTEmbedding", "FactorizedEmbedding", "MixedDimensionEmbedding", "DPQEmbedding",
                       "ROBEEmbedding", "DeepHashEmbedding"}  # the papers' and the nine zoo methods
    assert len(pretrain.runs) == len(strategies) * 3
    tuned = [s for s in stages.values() if s.references == ["pretrain"]]
    assert len(tuned) == 1 and tuned[0].seeds == [0, 1, 2]
    for run in tuned[0].runs:  # each fine-tuning starts from its own cell's pre-training
        (start,) = run.dependencies
        assert (start.value("strategy"), start.value("budget")) == (run.value("strategy"), run.value("budget"))
    assert len(tuned[0].runs) == len(pretrain.runs) * 3 * len({r.value("task") for r in tuned[0].runs})


def test_the_zoo_demo_fits_each_strategy_and_the_baselines_to_minilm_post_hoc_then_fine_tunes_minilm_from_them():
    stages = {s.name: s for s in load_sweep(CONFIGS / "sweeps" / "zoo.yaml").stages}
    posthoc, baselines = stages["posthoc"], stages["posthoc_baselines"]
    assert posthoc.command == baselines.command == "compress" and not posthoc.test and not baselines.test
    assert {r.value("strategy") for r in posthoc.runs} == {r.value("strategy") for r in stages["pretrain"].runs}
    assert {dict(r.overrides())["budget"] for r in posthoc.runs} == {0.1, 0.01, 0.001}  # of MiniLM's own table
    assert {dict(r.overrides())["method"] for r in baselines.runs} == {"svd", "int8", "int4", "pq"}
    for name, start in (("finetune_posthoc", posthoc), ("finetune_posthoc_baselines", baselines)):
        tuned = stages[name]
        assert tuned.references == [start.name] and tuned.seeds == [0, 1, 2]
        assert all(run.variant == "post-hoc" for run in tuned.runs)  # the figure's lines of their own
        assert all(dict(run.overrides())["model.init_args.checkpoint"] == f"${{{start.name}.checkpoint}}" for run in tuned.runs)
    assert {r.variant for r in stages["finetune"].runs} == {""}


@pytest.fixture(scope="session")
def standin_tasks(tmp_path_factory) -> Path:
    """Local stand-ins of every hub task the sweeps fine-tune on, written once for the session."""
    return write_task_data(tmp_path_factory.mktemp("standin_tasks"))


def run_standin(sweep, run, ran: set[str], task_data: Path, minilm: str, capsys) -> None:
    """``run``'s command lines as its launcher runs them (in this process), small and local, after the earlier runs
    its references name (the first of each that this test has not run yet)."""
    if run.id in ran:
        return
    stages = {stage.name: stage for stage in sweep.stages}
    paths = {}
    for name in run.stage.references:
        pool = candidates(run, stages[name])
        earlier = next((r for r in pool if r.id in ran), pool[0])
        run_standin(sweep, earlier, ran, task_data, minilm, capsys)
        paths |= {f"${{{name}.checkpoint}}": str(checkpoint_of(earlier)), f"${{{name}.folder}}": str(earlier.folder)}
    for argv in commands(run, Launch(), paths):
        extra = fit_overrides(composed(argv), task_data, minilm) if argv[0] == "fit" else compress_overrides(argv)
        status = main([*argv, *extra])
        assert status == 0, f"{run.id}: lit-embed {' '.join(argv)}\n{capsys.readouterr().err[-3000:]}"
    assert outcome(run).state == "done", run.id
    ran.add(run.id)


def run_sweep_standins(path: Path, folder: Path, runs, task_data: Path, minilm: str, capsys):
    """``runs(sweep)`` of the sweep file ``path`` on local stand-ins under ``folder``; the plan recorded for report."""
    sweep = load_sweep(path, folder)
    ran: set[str] = set()
    for run in runs(sweep):
        run_standin(sweep, run, ran, task_data, minilm, capsys)
    write_json_atomic(sweep.folder / MANIFEST, manifest(sweep))
    return sweep


@pytest.mark.parametrize("path", shipped(RUNNABLE))
def test_every_stage_of_the_shipped_sweeps_runs_on_local_standins(path, tmp_path, monkeypatch, capsys, standin_tasks,
                                                                  minilm_path):
    """Each stage's first run (and the earlier runs it starts from) runs two steps, its checkpoint feeding the next
    stage, then report reads the sweep folder: a sweep file that cannot run fails here, not on a cluster."""
    monkeypatch.chdir(tmp_path)  # any folder: a sweep file names its configs relative to itself
    sweep = run_sweep_standins(path, tmp_path / path.stem, lambda plan: [stage.runs[0] for stage in plan.stages],
                               standin_tasks, minilm_path, capsys)
    capsys.readouterr()
    assert main(["report", str(sweep.folder)]) == 0, capsys.readouterr().err
    if path.stem == "hashformers_glue":  # MNLI selects by accuracy on matched and mismatched pooled (tr_glue.py)
        results = outcome(sweep.run("glue/model=bert_mlm,task=mnli,seed=0")).results
        metrics = results["metrics"]
        assert results["paper"] == "hashformers" and results["checkpoint"]["monitor"] == "val/score"
        assert metrics["test/score"] == pytest.approx((metrics["test/matched/accuracy"] + metrics["test/mismatched/accuracy"]) / 2)


@pytest.mark.slow
@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: p.stem)
def test_every_run_of_the_shipped_sweeps_runs_on_local_standins(path, tmp_path, monkeypatch, capsys, standin_tasks,
                                                                minilm_path):
    monkeypatch.chdir(REPO)
    sweep = run_sweep_standins(path, tmp_path / path.stem, lambda plan: plan.runs, standin_tasks, minilm_path, capsys)
    assert all(outcome(run).state == "done" for run in sweep.runs)


@pytest.mark.parametrize("path", shipped(SHIPPED))
def test_a_shipped_sweep_plans_from_any_folder(path, tmp_path, monkeypatch, capsys):
    """--dry-run from a folder that is not the repository's: every config file its runs compose exists, and the plan
    is the one made from the repository's root (its runs' folders and configs alike)."""
    monkeypatch.chdir(REPO)
    from_root = [(r.id, r.configs(), r.overrides()) for r in load_sweep(path.relative_to(REPO)).runs]
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "--config", str(path), "--dry-run"]) == 0, capsys.readouterr().err
    runs = load_sweep(path).runs
    named = [c for run in runs for c in run.configs()] + [v for run in runs for _, v in run.overrides()
                                                          if isinstance(v, str) and v.endswith(".yaml")]
    assert named and all(os.path.isabs(name) and os.path.isfile(name) for name in named)
    assert [(r.id, [str(REPO / c) for c in configs], len(overrides)) for r, (_, configs, overrides) in zip(runs, from_root)] \
        == [(r.id, r.configs(), len(r.overrides())) for r in runs]


def test_a_sweep_file_names_configs_from_its_folder_keeps_absolute_ones_and_names_runs_as_written(tmp_path, monkeypatch,
                                                                                                   capsys):
    (tmp_path / "mine" / "pieces").mkdir(parents=True)
    for name in ("base.yaml", "pieces/a.yaml", "pieces/b.yaml"):
        (tmp_path / "mine" / name).write_text("{}\n")
    path = sweep_file(tmp_path / "mine", {"stages": {"a": {
        "config": ["base.yaml", FINETUNE],
        "set": {"model.init_args.encoder": "pieces/a.yaml", "data.init_args.files": ["corpus.txt"], "x": "elsewhere.yaml"},
        "axes": {"model.init_args.embedding": ["pieces/a.yaml", "pieces/b.yaml"], "named": {"one": {"config": "pieces/b.yaml"}}},
    }}})
    monkeypatch.chdir(tmp_path)
    sweep = load_sweep(path)
    first = sweep.runs[0]
    mine = tmp_path / "mine"
    assert first.configs() == [str(mine / "pieces/b.yaml"), str(mine / "base.yaml"), FINETUNE]
    assert dict(first.overrides()) == {"model.init_args.encoder": str(mine / "pieces/a.yaml"),
                                       "data.init_args.files": ["corpus.txt"], "x": "elsewhere.yaml",  # not a file there
                                       "model.init_args.embedding": str(mine / "pieces/a.yaml")}
    assert first.id == "a/embedding=pieces_a.yaml,named=one"  # named as the file writes it, from any folder
    (tmp_path / "mine" / "base.yaml").unlink()
    assert main(["sweep", "--config", str(path), "--dry-run"]) == 2
    assert f"'base.yaml' does not exist in {mine} (a sweep file names config files relative to its own folder" in \
        capsys.readouterr().err


def test_docs_sweeps_section_names_every_shipped_sweep_and_launcher():
    from lit_embed.sweeps.launch import LAUNCHERS
    from tests.helpers.cli import section

    text = section("sweeps-clusters", "Sweeps: grids, seeds and stages as one command")
    for path in SHIPPED:
        assert path.name in text
    for launcher in LAUNCHERS:
        assert f"--launcher {launcher}" in text
    assert "lit-embed report runs/sweeps/demo" in text
    assert yaml.safe_load((CONFIGS / "sweeps" / "demo.yaml").read_text())["folder"] == "runs/sweeps/demo"
