"""Run folders: claimed atomically, locked while a run lives, and found again by resume and by configs."""

from __future__ import annotations

import contextvars
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from lit_embed.errors import CheckpointError, MissingFileError, RunBusyError
from lit_embed.runs.folders import (
    checkpoints_taken,
    claim_version,
    discard_unstarted,
    hold,
    new_command,
    newest_checkpoint,
    run_of,
    start_checkpoint,
    version_folders,
)
from tests.helpers import CONFIGS, REPO


def test_processes_claiming_at_once_each_get_their_own_version(tmp_path):
    """Six processes claim at once. They are forked from a fresh process that has only imported lit_embed.runs.folders:
    forking pytest's own process, whose other threads may hold locks, could deadlock."""
    script = f"import sys, multiprocessing; sys.path.insert(0, {str(REPO)!r}); from lit_embed.runs.folders import claim_version\n" \
             f"with multiprocessing.get_context('fork').Pool(6) as pool: print(pool.map(claim_version, [{str(tmp_path)!r}] * 6))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(json.loads(done.stdout)) == list(range(6))
    assert [p.name for p in version_folders(tmp_path)] == [f"version_{n}" for n in range(6)]
    assert claim_version(tmp_path) == 6


def test_a_folder_held_by_a_live_process_is_refused_and_freed_when_it_ends(tmp_path):
    folder = tmp_path / "run"
    script = f"import sys, time; sys.path.insert(0, {str(REPO)!r}); from lit_embed.runs.folders import hold; " \
             f"hold({str(folder)!r}); print('held', flush=True); time.sleep(60)"
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunBusyError, match=rf"{folder} is in use by a live run \(pid {holder.pid} on "):
            hold(folder)
    finally:
        holder.kill()
        holder.wait()
    hold(folder)  # the lock went with the process
    hold(folder / "checkpoints")  # inside a folder this process holds: nothing more to take


def test_an_unstarted_run_leaves_no_folder_it_made_and_a_started_one_keeps_its_own(tmp_path):
    (tmp_path / "runs" / "kept").mkdir(parents=True)
    for root in ("runs/a", "runs/kept", "new/b/c"):
        claim_version(tmp_path / root)
    (tmp_path / "runs" / "a" / "version_0" / "config.yaml").write_text("as a run writes it when it starts")
    assert len([p for p in discard_unstarted() if tmp_path in p.parents]) == 3  # (and earlier tests' claims, elsewhere)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["runs", "runs/kept"]
    claim_version(tmp_path / "runs" / "a")
    (tmp_path / "runs" / "a" / "version_0" / "checkpoints").mkdir()
    (tmp_path / "runs" / "a" / "version_0" / "checkpoints" / "last.ckpt").write_bytes(b"a started run")
    assert discard_unstarted() == [] and (tmp_path / "runs" / "a" / "version_0" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize("runs_there", [False, True], ids=["runs/ made by the run", "runs/ there before"])
def test_a_run_refused_after_claiming_its_folder_leaves_nothing_it_made(runs_there, tmp_path, monkeypatch, capsys):
    """A fine-tuning whose model and data name different tasks is refused after its logger claimed
    runs/<name>/version_0 (when the data is set up): neither that nor the runs/<name> (and runs/) made to hold it stay
    behind; what was there before does."""
    from lit_embed.commands import main

    monkeypatch.chdir(tmp_path)
    if runs_there:
        (tmp_path / "runs" / "other").mkdir(parents=True)
    assert main(["fit", "--config", str(CONFIGS / "demo_finetune.yaml"), "--trainer.enable_model_summary", "false",
                 "--model.init_args.checkpoint", "null", "--data.init_args.tokenizer", "all-MiniLM-L6-v2",
                 "--model.init_args.task", "sst2"]) == 2
    assert "the model is built for task 'sst2' but the data is 'topics'" in capsys.readouterr().err
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == (["runs", "runs/other"] if runs_there
                                                                                       else [])


def touch(path, content: bytes = b"x", age: float = 0.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return path


def test_last_is_the_newest_checkpoint_of_any_run_or_requeue(tmp_path):
    root = tmp_path / "runs" / "exp"
    assert newest_checkpoint(root) is None
    older = touch(root / "version_0/checkpoints/last.ckpt", age=30)
    newer = touch(root / "version_1/checkpoints/last.ckpt", age=20)
    touch(root / "version_2/checkpoints/last.ckpt", b"", age=0)  # empty: never written whole
    assert newest_checkpoint(root) == newer
    requeue = touch(tmp_path / "hpc_ckpt_3.ckpt", age=10)  # Lightning's SLURM requeue save, in default_root_dir
    assert newest_checkpoint(root, tmp_path) == requeue
    assert run_of(newer, root) == 1 and run_of(older, root) == 0 and run_of(requeue, root) is None


def reported(run, best: str | None, monitor: str | None = "val/score", status: str = "complete") -> None:
    """What ResultsWriter records of a run: its status and its checkpoint callback's best checkpoint."""
    checkpoint = None if best is None else {"monitor": monitor, "mode": "max", "best": best, "best_score": 0.5}
    (run / "results.json").write_text(json.dumps({"format": 1, "label": "x", "status": status, "global_step": 8,
                                                  "checkpoint": checkpoint}))


def test_a_start_point_is_a_file_a_run_folder_or_the_newest_finished_run(tmp_path):
    root = tmp_path / "demo"
    first = touch(root / "version_0/checkpoints/last.ckpt")
    touch(root / "version_0/checkpoints/epoch=0-step=4.ckpt")
    second = touch(root / "version_1/checkpoints/epoch=1-step=8.ckpt")
    for run in ("version_0", "version_1"):
        reported(root / run, None)
    touch(root / "version_2/hparams.yaml")  # killed before its first checkpoint
    for number, status in ((3, "interrupted"), (4, "untested"), (5, "diverged")):  # none finished
        touch(root / f"version_{number}/checkpoints/last.ckpt")
        reported(root / f"version_{number}", None, status=status)
    touch(root / "version_6/checkpoints/last.ckpt")  # killed after a checkpoint, before its results: not finished
    assert start_checkpoint(first) == first
    assert start_checkpoint(root / "version_0") == first  # last.ckpt among several
    assert start_checkpoint(root / "version_1") == second  # the only one
    assert start_checkpoint(root) == second  # versions 3-6 did not complete, version_2 has no checkpoint
    with pytest.raises(MissingFileError, match="holds no finished run with a checkpoint"):
        start_checkpoint(tmp_path)  # no runs in it
    with pytest.raises(MissingFileError, match="does not exist"):
        start_checkpoint(tmp_path / "nowhere")


@pytest.mark.parametrize(("files", "best", "monitor", "expected", "newest"), [
    (["last.ckpt", "epoch=0-step=2.ckpt"], "checkpoints/epoch=0-step=2.ckpt", "val/score", "epoch=0-step=2.ckpt", "last.ckpt"),
    (["last.ckpt", "epoch=0-step=8.ckpt"], "checkpoints/epoch=0-step=8.ckpt", None, "last.ckpt", "last.ckpt"),
    (["last.ckpt", "last-v1.ckpt", "epoch=0-step=8.ckpt"], None, None, "last-v1.ckpt", "last-v1.ckpt"),
    (["epoch=0-step=8.ckpt"], "checkpoints/epoch=0-step=8.ckpt", "val/score", "epoch=0-step=8.ckpt", "epoch=0-step=8.ckpt"),
], ids=["monitored: its best", "unmonitored: its last", "a stale last.ckpt beside last-v1: the newer", "only one"])
def test_a_run_folder_gives_the_model_its_run_reported_or_its_newest(files, best, monitor, expected, newest, tmp_path):
    run = tmp_path / "exp/version_0"
    for age, name in enumerate(reversed(files)):  # the first named is the newest
        touch(run / "checkpoints" / name, age=10 * age)
    reported(run, best, monitor)
    assert start_checkpoint(run) == run / "checkpoints" / expected
    assert start_checkpoint(tmp_path / "exp") == run / "checkpoints" / expected
    assert start_checkpoint(run, newest=True) == run / "checkpoints" / newest  # what fit --ckpt_path RUN resumes


def saved(path, step: int, age: float = 0.0):
    """A checkpoint file that records ``step`` (what Lightning's hold), ``age`` seconds old."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"global_step": step, "state_dict": {}}, path)
    return touch(path, path.read_bytes(), age)


def test_a_killed_runs_newest_state_is_the_step_its_files_record_never_a_stale_last_nor_its_name(tmp_path, capsys):
    """Killed between a periodic save (step 4) and its last.ckpt (step 2, written later than it was saved, or renamed):
    the run folder, --ckpt_path last and the records take step 4, and say why; an experiment folder takes an older run
    that completed, not the killed one."""
    exp = tmp_path / "exp"
    complete = saved(exp / "version_0/checkpoints/last.ckpt", 8, age=100)
    reported(exp / "version_0", None)
    run = exp / "version_1"
    newest = saved(run / "checkpoints/epoch=0-step=2.ckpt", 4, age=20)  # its name says 2: the file says 4
    saved(run / "checkpoints/last.ckpt", 2, age=10)
    assert start_checkpoint(run) == newest and newest_checkpoint(exp) == newest
    assert start_checkpoint(run, newest=True) == newest
    said = capsys.readouterr().err
    assert f"is {newest} (step 4): its newest state, step 4 (the run reported no best); last.ckpt records step 2, " \
           "saved before it; the run has no results: killed" in said, said
    assert start_checkpoint(exp) == complete
    complete.unlink()  # the complete run's model gone: the killed run is still not taken
    with pytest.raises(MissingFileError, match=r"runs: version_0 \(complete\), version_1 \(has no results: killed"):
        start_checkpoint(exp)


def test_a_command_given_a_folder_says_which_checkpoint_it_took_and_why_once(tmp_path, capsys):
    run = tmp_path / "exp/version_0"
    touch(run / "checkpoints/last.ckpt")
    touch(run / "checkpoints/epoch=0-step=2.ckpt", age=10)
    reported(run, "checkpoints/epoch=0-step=2.ckpt", "val/score")

    def command() -> None:  # as lit_embed.commands.main runs one: in a context of its own
        start_checkpoint(run, "--ckpt_path checkpoint")
        start_checkpoint(run, "--ckpt_path checkpoint")  # asked again in the same command: said once
        start_checkpoint(tmp_path / "exp", newest=True)
        start_checkpoint(run / "checkpoints/last.ckpt")  # a file: the user named it, nothing to say

    contextvars.copy_context().run(command)
    said = capsys.readouterr().err.splitlines()
    contextvars.copy_context().run(command)  # the next command in the same process says it again
    assert capsys.readouterr().err.splitlines() == said
    assert said == [
        f"lit-embed: --ckpt_path checkpoint {str(run)!r} is {run}/checkpoints/epoch=0-step=2.ckpt (step 2): the best "
        "checkpoint by val/score its run reported",
        f"lit-embed: checkpoint {str(tmp_path / 'exp')!r} is {run}/checkpoints/last.ckpt (step 8): its newest state, step 8 "
        f"(asked for); version_0 is the newest finished run of {str(tmp_path / 'exp')!r}",
    ]


def test_a_command_records_which_checkpoints_it_took_for_its_outputs(tmp_path):
    """A file, a run's best, an experiment's newest run's last (its step from the run's results), each once; the next
    command starts with none."""
    run = tmp_path / "exp/version_0"
    last, best = touch(run / "checkpoints/last.ckpt"), touch(run / "checkpoints/epoch=0-step=2.ckpt", age=10)
    stale = touch(run / "checkpoints/last-v1.ckpt", age=20)  # older than last.ckpt: the run's results are not its own
    reported(run, "checkpoints/epoch=0-step=2.ckpt", "val/score")

    def command() -> list[dict]:
        new_command()  # as lit_embed.commands.main starts one: in a context of its own, with nothing taken yet
        start_checkpoint(run, "--ckpt_path checkpoint")
        start_checkpoint(run, "--ckpt_path checkpoint")  # asked again: recorded once
        start_checkpoint(tmp_path / "exp", "pre-training checkpoint", newest=True)
        start_checkpoint(stale)
        start_checkpoint(tmp_path / "exp/version_0/checkpoints/../checkpoints/epoch=0-step=2.ckpt")
        return checkpoints_taken()

    outside = checkpoints_taken()  # what this process's own calls (other tests') took, outside any command
    records = contextvars.copy_context().run(command)
    assert records == [
        {"what": "--ckpt_path checkpoint", "given": str(run), "file": str(best), "step": 2,
         "why": "the best checkpoint by val/score its run reported"},
        {"what": "pre-training checkpoint", "given": str(tmp_path / "exp"), "file": str(last), "step": 8,
         "why": f"its newest state, step 8 (asked for); version_0 is the newest finished run of {str(tmp_path / 'exp')!r}"},
        {"what": "checkpoint", "given": str(stale), "file": str(stale), "step": None, "why": "the file given"},
        {"what": "checkpoint", "given": str(run / "checkpoints/../checkpoints/epoch=0-step=2.ckpt"),
         "file": str(run / "checkpoints/../checkpoints/epoch=0-step=2.ckpt"), "step": 2, "why": "the file given"},
    ]
    assert checkpoints_taken() == outside  # taken in the command's context, not its caller's
    assert contextvars.copy_context().run(command) == records


def test_a_run_folder_whose_reported_model_is_gone_or_which_diverged_is_refused_by_name(tmp_path):
    run = tmp_path / "version_0"
    touch(run / "checkpoints/last.ckpt")
    reported(run, "checkpoints/epoch=0-step=2.ckpt")
    with pytest.raises(MissingFileError, match=r"reports checkpoints/epoch=0-step=2\.ckpt as its best checkpoint \(by "
                                               r"val/score\), which is gone"):
        start_checkpoint(run)
    reported(run, None, status="diverged")
    with pytest.raises(CheckpointError, match=r"is a run that diverged \(at step 8\): it has no trained model"):
        start_checkpoint(run, "--ckpt_path checkpoint")
    touch(tmp_path / "version_1/checkpoints/last.ckpt", age=60)  # an older run of the experiment
    with pytest.raises(CheckpointError, match=r"--ckpt_path last: the newest checkpoint .*version_0/checkpoints/last\.ckpt"
                                              r", of the run .*version_0, which diverged \(at step 8\)"):
        newest_checkpoint(tmp_path)


def test_a_write_removes_only_the_temporary_files_of_dead_writers(tmp_path):
    """Two runs writing into one folder must not delete each other's half-written files (the live one's)."""
    import socket

    from lit_embed.storage.files import write_atomic

    host = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = tmp_path / f".last.ckpt.{host}.{os.getpid()}.abc.tmp"
    gone = tmp_path / f".last.ckpt.{host}.{dead.pid}.def.tmp"
    other_host = tmp_path / f".last.ckpt.elsewhere.{dead.pid}.ghi.tmp"
    for path in (live, gone, other_host):
        path.write_text("half")
    write_atomic(tmp_path / "last.ckpt", "whole")
    assert (tmp_path / "last.ckpt").read_text() == "whole"
    assert live.exists() and other_host.exists() and not gone.exists()


def test_a_requeued_slurm_run_continues_in_its_own_folder(tmp_path, monkeypatch):
    """Lightning saves a SLURM requeue checkpoint in default_root_dir, outside the run folder: the checkpoint
    records its run, where ``--ckpt_path last`` continues."""
    import shutil

    import torch

    from lit_embed.commands import main
    from tests.helpers import CONFIGS

    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", str(CONFIGS / "demo.yaml"), "--trainer.limit_val_batches", "1", "--data.init_args.batch_size",
            "4", "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            "--trainer.callbacks", json.dumps([{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint",
                                               "init_args": {"save_last": True}},
                                              {"class_path": "lit_embed.callbacks.ResultsWriter"}])]
    assert main([*args, "--trainer.max_steps", "2"]) == 0
    run = tmp_path / "runs/demo/version_0"
    assert main([*args, "--trainer.max_steps", "2"]) == 0  # another run of the experiment: version_1
    requeue = tmp_path / "runs/demo/hpc_ckpt_1.ckpt"
    shutil.move(run / "checkpoints" / "last.ckpt", requeue)
    os.utime(requeue)  # the newest checkpoint of the experiment
    assert main([*args, "--trainer.max_steps", "4", "--ckpt_path", "last"]) == 0
    assert json.loads((run / "results.json").read_text())["global_step"] == 4
    assert sorted(p.name for p in (tmp_path / "runs/demo").glob("version_*")) == ["version_0", "version_1"]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4


#: The checkpoint callbacks a run may have: a monitor choosing its best (``step``, lowest: the first save, so that the
#: best and the last differ), none (the newest is the model), and a callback that keeps no last of its own.
CALLBACKS = {
    "monitored": {"monitor": "step", "mode": "min", "save_top_k": 1, "save_last": True},
    "unmonitored": {"save_last": True},
    "no save_last": {},
}


@pytest.mark.parametrize("resumed", [False, True], ids=["straight", "stopped before its first save, resumed"])
@pytest.mark.parametrize("kind", list(CALLBACKS))
def test_a_finished_run_has_one_last_checkpoint_at_its_end_and_gives_the_model_it_reported(kind, resumed, tmp_path,
                                                                                           monkeypatch):
    """Lightning refreshes ``last`` only when it saves a new best, and writes last-v1.ckpt beside a last.ckpt saved on a
    signal: a finished fit's last.ckpt was its first validation's (step 2 of 6), or the signal's (step 1)."""
    import torch

    from lit_embed.commands import main
    from tests.helpers import CONFIGS

    monkeypatch.chdir(tmp_path)
    callbacks = [{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint", "init_args": CALLBACKS[kind]},
                 {"class_path": "lit_embed.callbacks.ResultsWriter"}]
    args = ["fit", "--config", str(CONFIGS / "demo.yaml"), "--trainer.max_steps", "6", "--trainer.val_check_interval", "2",
            "--trainer.limit_val_batches", "1", "--data.init_args.batch_size", "4", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false"]
    last = ["--ckpt_path", "last", "--trainer.callbacks", json.dumps(callbacks)]
    if resumed:
        stop = {"class_path": "tests.helpers.probes.SignalAtStep", "init_args": {"step": 1, "marker": str(tmp_path / "sent")}}
        assert main([*args, "--trainer.callbacks", json.dumps([*callbacks, stop])]) == 143
    assert main([*args, *(last if resumed else ["--trainer.callbacks", json.dumps(callbacks)])]) == 0
    run = tmp_path / "runs/demo/version_0"
    step = {p.name: torch.load(p, weights_only=True)["global_step"] for p in (run / "checkpoints").glob("*.ckpt")}
    lasts = sorted(name for name in step if name.startswith("last"))
    assert lasts == (["last.ckpt"] if kind != "no save_last" or resumed else []), step
    assert all(step[name] == 6 for name in lasts), step
    model = start_checkpoint(run)
    assert step[model.name] == (2 if kind == "monitored" else 6), (model, step)  # what the run reported
    if lasts:
        assert start_checkpoint(run, newest=True) == run / "checkpoints/last.ckpt"
        assert main([*args, *last]) == 0  # --ckpt_path last of the finished run
        results = json.loads((run / "results.json").read_text())
        assert results["status"] == "complete" and results["global_step"] == 6  # nothing retrained
        assert "val/loss" in results["metrics"]  # the scores of the run it finished, not lost by the resume


def test_the_logger_every_run_records_is_still_named_lit_embed_runs_RunLogger(tmp_path):
    """Every run's ``config.yaml`` names its logger ``lit_embed.runs.RunLogger`` (the CLI's default, written so before
    the logger's module moved into the ``runs`` package): a config naming it still builds that logger, and the run
    folders' module, which ``report`` and the sweeps import, still imports no Lightning."""
    from jsonargparse import ArgumentParser
    from pytorch_lightning.loggers import Logger

    from lit_embed.runs.logger import RunLogger

    parser = ArgumentParser()
    parser.add_argument("--logger", type=Logger)
    given = json.dumps({"class_path": "lit_embed.runs.RunLogger", "init_args": {"save_dir": str(tmp_path)}})
    assert type(parser.instantiate_classes(parser.parse_args(["--logger", given])).logger) is RunLogger
    code = "import sys, lit_embed.runs.folders; print(sorted(m for m in sys.modules if m.startswith('pytorch_lightning')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr[-2000:]
