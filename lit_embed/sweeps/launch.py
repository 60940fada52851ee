"""Running a sweep's runs: each in a process of its own (``lit-embed sweep --run``), one after another
(``local``) or as many at once as the visible GPUs allow (``gpus``); or one after another in the launching process
(``inline``: lit-embed, torch and Lightning imported once, each run still in its own folder with its own config, log
and exit status); and the progress summary.

``lit-embed sweep --run STAGE/NAME`` runs one run in its own process, as a SLURM array task does: it resolves
the run's references to earlier stages (which must have finished), then runs ``lit-embed fit ... --ckpt_path
last`` (or ``compress`` then ``test``) in-process, so signals reach Lightning as they do in a plain ``fit``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lit_embed.errors import BudgetError, ConfigError, RunBusyError, causes
from lit_embed.progress import Progress, duration
from lit_embed.runs.folders import LAUNCH_LOCK, held, hold, holds
from lit_embed.runs.signals import received_signal, stop_if_signalled
from lit_embed.storage.files import open_in_place, write_json_atomic, writing
from lit_embed.sweeps.outcomes import (
    OUTPUT_FILE,
    SETTLED,
    STATUS_FILE,
    Outcome,
    book,
    counts,
    finished,
    outcome,
    read_status,
    resolve,
    start_left_out,
    substitute,
    to_launch,
)
from lit_embed.sweeps.plan import MANIFEST, Run, Sweep, manifest

LAUNCHERS = ("local", "inline", "gpus", "slurm")
POLL_SECONDS = 0.5


@dataclass(frozen=True)
class Launch:
    """How runs are started: ``launcher``, and the GPUs each run takes (``None``: each stage's ``gpus_per_run``)."""

    launcher: str = "local"
    gpus_per_run: int | None = None

    def gpus(self, run: Run) -> int:
        """The GPUs ``run`` takes: none under ``local`` and ``inline`` (the config decides where it runs)."""
        if self.launcher in ("local", "inline"):
            return 0
        return run.stage.gpus_per_run if self.gpus_per_run is None else self.gpus_per_run


# -- one run's command lines ----------------------------------------------------------------------------------


def commands(run: Run, launch: Launch, paths: dict[str, str] | None = None) -> list[list[str]]:
    """The ``lit-embed`` command lines of ``run`` (``fit``; or ``compress``, then ``test`` unless the stage says
    ``test: false``), its references replaced
    by ``paths`` (left as written without them)."""
    gpus = launch.gpus(run)
    args = [arg for config in run.configs() for arg in ("--config", config)]
    for key, value in run.overrides():
        args += [f"--{key}", _text(value if paths is None else substitute(value, paths))]
    if run.stage.command == "fit":
        if run.seed is not None:
            args += ["--seed_everything", str(run.seed)]
        args += ["--trainer.default_root_dir", str(run.folder), "--ckpt_path", "last"]
        if gpus:
            args += ["--trainer.accelerator", "gpu", "--trainer.devices", str(gpus)]
        return [["fit", *args]]
    if run.seed is not None:
        args += ["--seed", str(run.seed)]
    args += ["--out", str(run.folder)]
    test = ["test", "--config", str(run.folder / "config.yaml"), "--ckpt_path", str(run.folder / "model.ckpt")]
    if any(key == "trust_remote_code" and str(value).lower() == "true" for key, value in run.overrides()):
        test += ["--data.init_args.trust_remote_code", "true"]  # compress's output records no trust (lit_embed.checkpoints.recorded)
    if gpus:
        args += ["--accelerator", "gpu"]
        test += ["--trainer.accelerator", "gpu", "--trainer.devices", "1"]
    return [["compress", *args], test] if run.stage.test else [["compress", *args]]


def _text(value) -> str:
    """A value as the command line reads it (YAML): strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def run_here(sweep: Sweep, run: Run, launch: Launch, execute: Callable[[list[str]], object],
             explain: Callable[[Exception], tuple[str, int] | None]) -> int:
    """Run ``run`` in this process (``lit-embed sweep --run``): skipped when done, else resumed where it stopped.

    ``execute`` runs one of its lit-embed commands (an argv), ``explain`` gives the one line and exit status of an error
    the user can fix (``None`` for a bug): the command layer's, which this library does not import.

    Global rank 0 holds the run's lock and records its status; the other ranks of a multi-GPU run (which
    Lightning or ``srun`` start with the same command) only run it.
    """
    found = outcome(run)
    if not to_launch(run, found) and found.state in SETTLED:
        print(f"{run.id}: {'complete' if found.state == 'done' else found.detail}, nothing to do")
        return 0
    first = _rank_zero()
    if first:
        _hold(run)
        _write_status(run, state="running", command=sys.argv)
    code, error, state = 1, None, "exited"
    try:
        paths = resolve(run, sweep)
        for argv in commands(run, launch, paths):
            stop_if_signalled()  # a signal as a command ended stops the run before the next one (compress, then test)
            if argv[0] == "compress" and (run.folder / "model.ckpt").is_file():
                continue  # compressed before the test was stopped: compress writes its folder whole or not at all
            print("lit-embed " + shlex.join(argv), flush=True)
            execute(argv)
        if first and not finished(run):
            raise ConfigError(f"{run.id} ended without a complete results.json in its version folder under {run.folder}: "
                              f"its config needs the lit_embed.callbacks.ResultsWriter callback")
        code = 0  # every step finished (a signal that came as the last one ended left nothing undone)
    except SystemExit as stop:  # the parser's errors (printed already), or Lightning's exit after a signal
        signum = received_signal()
        code = 128 + signum if signum is not None else stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
        raise
    except BaseException as exception:
        known = explain(exception) if isinstance(exception, Exception) else None
        signum = received_signal()
        code = 128 + signum if signum is not None else known[1] if known is not None else 1
        error = f"lit-embed: error: {known[0]}" if known is not None else f"{type(exception).__name__}: {exception}"
        refusal = _budget_refusal(exception)
        if refusal is not None and signum is None:  # a cell that does not exist, as the plan leaves out: not a failure
            state, error = "unmet", str(refusal)
        raise
    finally:
        if first:
            _write_status(run, state=state, exit=code, error=error if code else None)
    return 0


def _budget_refusal(exception: BaseException) -> BudgetError | None:
    """The :class:`BudgetError` that caused ``exception`` (a parser wraps the strategy's), if one did: the strategy,
    sized on the run's own data (a frequency split counts its tokens), cannot meet the run's budget."""
    return next((cause for cause in causes(exception) if isinstance(cause, BudgetError)), None)


def _hold(run: Run, tries: int = 5) -> None:
    """Lock the run's records for this process; a moment's retry lets a reader that asked whether the run
    is running (``folders.held``: a brief shared lock) let go."""
    for attempt in range(tries):
        try:
            return hold(book(run), "sweep run")
        except RunBusyError:
            if attempt + 1 < tries:
                time.sleep(0.2)
    status = read_status(run) or {}
    raise RunBusyError(f"{run.id} is running already (process {status.get('pid')} on {status.get('host')}): wait for it")


def _rank_zero() -> bool:
    """Whether this process is global rank 0 (or the only process) of its run."""
    return all(os.environ.get(name, "0") == "0" for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"))


def _write_status(run: Run, **fields) -> None:
    status = {**fields, "host": socket.gethostname(), "pid": os.getpid(),
              "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    write_json_atomic(book(run) / STATUS_FILE, status)


# -- many runs: local and gpus --------------------------------------------------------------------------------


def launch_here(sweep: Sweep, launch: Launch, say: Callable[[str], None] = print) -> dict[str, Outcome]:
    """Run what is not done, each as ``lit-embed sweep --run`` in its own process: one at a time (``local``),
    or as many as the visible GPUs allow (``gpus``: each run sees only its own, ``CUDA_VISIBLE_DEVICES``).
    A run starts when the earlier runs it refers to are done; one whose earlier runs failed waits for the
    next launch. Returns every run's outcome."""
    visible = _visible_gpus() if launch.launcher == "gpus" else []
    free = list(visible)
    needs = {run.id: launch.gpus(run) for run in sweep.runs}
    too_many = [r for r in sweep.runs if needs[r.id] > len(visible)] if launch.launcher == "gpus" else []
    if too_many:
        raise ConfigError(f"{too_many[0].id} takes {needs[too_many[0].id]} GPUs but {len(visible)} are visible "
                          f"({', '.join(visible) or 'none'}): lower gpus_per_run, or use --launcher local")
    claim_sweep_folder(sweep)
    outcomes = {run.id: outcome(run) for run in sweep.runs}
    todo = [run for run in sweep.runs if to_launch(run, outcomes[run.id])]
    outcomes.update({run.id: Outcome("left") for run in todo if outcomes[run.id].state == "unmet"})  # its starts wait
    total, started, ended = len(todo), 0, 0
    running: dict[subprocess.Popen, tuple[Run, list[str], float]] = {}
    progress = Progress("sweep", "run", total)  # in a log: the runs ended, an ETA from their times, the runs running

    def running_now() -> dict[str, str]:
        now = time.monotonic()
        return {"running": ", ".join(f"{run.id} for {duration(now - began)}" for run, _, began in running.values()) or "none"}

    try:
        while todo or running:
            ours = {run.id for run, _, _ in running.values()}
            for run in list(todo):
                for dependency in run.dependencies:  # one that runs elsewhere may have finished meanwhile
                    if outcomes[dependency.id].state == "running" and dependency.id not in ours:
                        outcomes[dependency.id] = outcome(dependency)
                left_out = start_left_out(run, outcomes)
                if left_out is not None:
                    outcomes[run.id] = Outcome("unmet", detail=left_out)
                    todo.remove(run)
                    continue
                waiting = [d for d in run.dependencies if outcomes[d.id].state not in SETTLED]
                if any(outcomes[d.id].state == "failed" or d.id in _blocked(outcomes) for d in waiting):
                    failed = next(d for d in waiting if outcomes[d.id].state == "failed" or d.id in _blocked(outcomes))
                    outcomes[run.id] = Outcome("left", detail=f"waits for {failed.id}, which did not finish")
                    todo.remove(run)
                    continue
                if waiting or (launch.launcher == "local" and running) or len(free) < needs[run.id]:
                    continue
                gpus, free[:] = free[:needs[run.id]], free[needs[run.id]:]
                started += 1
                say(f"[{started}/{total}] start {run.id}" + (f" on GPU {','.join(gpus)}" if gpus else ""))
                running[_start(sweep, run, launch, gpus)] = (run, gpus, time.monotonic())
                outcomes[run.id] = Outcome("running")
                todo.remove(run)
            if not running:
                for run in todo:  # what they wait for runs elsewhere (another launch, a cluster): not ours to wait on
                    outcomes[run.id] = Outcome("left", detail="waits for runs that run elsewhere")
                break
            finished = _wait_any(running, lambda ended=ended: progress.update(ended, running_now))
            run, gpus, began = running.pop(finished)
            ended += 1
            free[:] = [gpu for gpu in visible if gpu in free or gpu in gpus]
            outcomes[run.id] = outcome(run)
            took = f"{time.monotonic() - began:.0f} s"
            found = outcomes[run.id]
            if found.state == "done":
                say(f"done {run.id} ({took})")
            elif finished.returncode < 0:
                say(f"killed {run.id} by {signal.Signals(-finished.returncode).name} ({took}): {found.detail}")
            else:
                say(f"{found.state} {run.id} ({took}): {found.detail}")
            progress.update(ended, running_now, final=ended == total)
    except BaseException:
        _stop(running)
        raise
    return outcomes


def launch_inline(sweep: Sweep, launch: Launch, execute: Callable[[list[str]], object],
                  explain: Callable[[Exception], tuple[str, int] | None], say: Callable[[str], None] = print
                  ) -> dict[str, Outcome]:
    """Run what is not done one after another in this process (``--launcher inline``), as ``lit-embed sweep --run``
    would in a process of its own: lit-embed, torch and Lightning are imported once, not per run (on 2 CPU cores the
    imports were most of a small run's time). Each run keeps its folder, config and records: what it prints goes to
    its ``output.log`` (the file descriptors, so Lightning's and C's output too), its exit status to ``status.json``.
    A run that fails is recorded and the next one starts; a signal stops the run at a step (it resumes from its
    checkpoint) and then the launch. SLURM and ``gpus`` keep a process per run: a job array's tasks and each GPU's run
    are processes of their own, and a crash there (out of memory, a segfault) must not take the launch with it.
    Returns every run's outcome."""
    claim_sweep_folder(sweep)
    outcomes = {run.id: outcome(run) for run in sweep.runs}
    todo = [run for run in sweep.runs if to_launch(run, outcomes[run.id])]
    outcomes.update({run.id: Outcome("left") for run in todo if outcomes[run.id].state == "unmet"})  # its starts wait
    progress = Progress("sweep", "run", len(todo))
    for ended, run in enumerate(todo, 1):
        waiting = next((d for d in run.dependencies if outcomes[d.id].state not in SETTLED), None)
        left_out = start_left_out(run, outcomes)
        if left_out is not None:
            outcomes[run.id] = Outcome("unmet", detail=left_out)
        elif waiting is None:
            outcomes[run.id] = _run_inline(sweep, run, launch, execute, explain, f"[{ended}/{len(todo)}]", say)
        else:
            outcomes[run.id] = Outcome("left", detail=f"waits for {waiting.id}, which did not finish")
        progress.update(ended, final=ended == len(todo))
    return outcomes


def _run_inline(sweep: Sweep, run: Run, launch: Launch, execute: Callable[[list[str]], object],
                explain: Callable[[Exception], tuple[str, int] | None], count: str, say: Callable[[str], None]) -> Outcome:
    """One run of :func:`launch_inline`, its output in its log; its outcome."""
    say(f"{count} start {run.id}")
    began, cpu = time.monotonic(), time.process_time()
    with _output_to(book(run) / OUTPUT_FILE) as log:
        log.write(f"\n=== {datetime.datetime.now().isoformat(timespec='seconds')} lit-embed "
                  f"{shlex.join(run_argv(sweep, run, launch))} (in the launching process {os.getpid()})\n")
        try:
            run_here(sweep, run, launch, execute, explain)
        except (Exception, SystemExit) as error:  # recorded by run_here; the log gets what the process would print
            if isinstance(error, SystemExit) and received_signal() is not None:
                raise
            known = explain(error) if isinstance(error, Exception) else None
            if known is not None:
                log.write(f"lit-embed: error: {known[0]}\n")
            elif isinstance(error, Exception):
                traceback.print_exc(file=log)
    found = outcome(run)
    took = f"{time.monotonic() - began:.0f} s, {time.process_time() - cpu:.0f} s CPU"  # CPU: what load inflates less
    say(f"{found.state} {run.id} ({took})" + (f": {found.detail}" if found.detail else ""))
    return found


@contextlib.contextmanager
def _output_to(log: Path):
    """This process's output (``sys.stdout``/``sys.stderr`` and file descriptors 1 and 2) appended to ``log`` while
    the block runs; the file, as a text stream, for the block's own lines."""
    with writing(log):  # a full disk names it
        log.parent.mkdir(parents=True, exist_ok=True)
        out = open(open_in_place(log, "sweep run's log", append=True), "a", buffering=1, encoding="utf-8")
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            yield out
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        out.close()


#: Set in the environment of each run a launch starts (the launching process's id): ``--run`` of a sweep whose folder a
#: live launch holds is refused unless that launch started it.
LAUNCHED = "LIT_EMBED_SWEEP_LAUNCH"


def check_not_launching(sweep: Sweep, run: Run) -> None:
    """Refuse to run ``run`` by hand (``sweep --run``) while a launch of the sweep in another process holds its folder:
    the launch runs it too, and two versions of one run would be written, the later silently winning."""
    if held(sweep.folder, LAUNCH_LOCK) and not holds(sweep.folder) and os.environ.get(LAUNCHED) is None:
        raise RunBusyError(f"sweep folder {sweep.folder} is in use by a live `lit-embed sweep` launch, which runs {run.id} "
                           f"itself: wait for it (--dry-run shows its progress), or stop it first")


def claim_sweep_folder(sweep: Sweep) -> None:
    """Hold the sweep folder for this launch (one launch at a time) and record the plan in it."""
    try:
        hold(sweep.folder, "sweep folder", holds_runs=True)
    except RunBusyError:
        raise RunBusyError(f"sweep folder {sweep.folder} is in use by another `lit-embed sweep`: wait for it, or see its "
                           f"progress with --dry-run") from None
    write_json_atomic(sweep.folder / MANIFEST, manifest(sweep))


def _blocked(outcomes: dict[str, Outcome]) -> set[str]:
    return {rid for rid, found in outcomes.items() if found.state == "left" and found.detail.startswith("waits for")}


def _visible_gpus() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def _start(sweep: Sweep, run: Run, launch: Launch, gpus: list[str]) -> subprocess.Popen:
    """``lit-embed sweep --run`` in a session of its own (this process forwards one signal to it), its output
    appended to the run's ``output.log``."""
    env = {**os.environ, LAUNCHED: str(os.getpid())}
    if launch.launcher == "gpus":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    argv = [sys.executable, "-m", "lit_embed.commands", *run_argv(sweep, run, launch)]
    log = book(run) / OUTPUT_FILE
    with writing(log):  # appended to, not replaced: a full disk names it
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(open_in_place(log, "sweep run's log", append=True), "ab") as out:
            out.write(f"\n=== {datetime.datetime.now().isoformat(timespec='seconds')} {shlex.join(argv)}\n".encode())
            out.flush()
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)


def run_argv(sweep: Sweep, run: Run, launch: Launch) -> list[str]:
    """The ``lit-embed`` arguments that run ``run`` in a process of its own."""
    argv = ["sweep", "--config", str(sweep.path.absolute()), "--folder", str(sweep.folder.absolute()), "--run", run.id,
            "--launcher", launch.launcher]
    if launch.launcher not in ("local", "inline"):
        argv += ["--gpus-per-run", str(launch.gpus(run))]
    return argv


def _wait_any(running: dict[subprocess.Popen, tuple], waiting: Callable[[], object]) -> subprocess.Popen:
    """The first of ``running`` to end, calling ``waiting`` at each look until one has."""
    while True:
        for process in running:
            if process.poll() is not None:
                return process
        waiting()
        time.sleep(POLL_SECONDS)


def _stop(running: dict[subprocess.Popen, tuple]) -> None:
    """This launch was stopped by a signal: pass it on once to every run (each saves a resumable checkpoint)
    and wait for them."""
    signum = received_signal() or signal.SIGTERM
    for process in running:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)
    for process in running:
        process.wait()


# -- what the user sees --------------------------------------------------------------------------------------


def summary(sweep: Sweep, outcomes: dict[str, Outcome]) -> str:
    """done / diverged / running / failed / left, with each failed run's last error line, why a run diverged and why
    runs wait."""
    found = counts(sweep, outcomes)
    lines = [f"sweep {sweep.folder}: {len(sweep.runs)} runs: " + ", ".join(f"{n} {state}" for state, n in found.items())]
    for state in ("diverged", "unmet", "failed", "running", "left"):
        for run in sweep.runs:
            if outcomes[run.id].state == state and outcomes[run.id].detail and not (state == "unmet" and run.stage.references):
                lines.append(f"  {state:<8} {run.id}: {outcomes[run.id].detail}")
    following = sum(1 for r in sweep.runs if outcomes[r.id].state == "unmet" and r.stage.references)
    if following:
        lines.append(f"  {'unmet':<8} {following} more start from runs left out")
    quiet = sum(1 for r in sweep.runs if outcomes[r.id].state == "left" and not outcomes[r.id].detail)
    if quiet and quiet != found["left"]:
        lines.append(f"  {'left':<8} {quiet} more not started")
    if found["done"]:
        lines.append(f"tables: lit-embed report {sweep.folder}")
    return "\n".join(lines) + "\n"


def plan_text(sweep: Sweep, launch: Launch) -> str:
    """The plan (``--dry-run``): each stage and run, its state and its command lines (references resolved where
    the runs they name have finished)."""
    outcomes = {run.id: outcome(run) for run in sweep.runs}
    lines = [f"sweep {sweep.path}: {len(sweep.runs)} runs under {sweep.folder}/ (launcher {launch.launcher})"]
    for stage in sweep.stages:
        about = [f"{len(stage.runs)} runs"]
        if stage.search:
            points = len({r.point for r in stage.runs})
            about.append(f"{points} grid points, the best per row on the {stage.select.describe()} (mean over seeds)")
        if stage.seeds:
            about.append(f"seeds {', '.join(map(str, stage.seeds))}")
        if stage.references:
            about.append(f"from {', '.join(stage.references)}")
        then = {"compress": ", then test" if stage.test else ", no test (test: false)"}.get(stage.command, "")
        lines.append(f"stage {stage.name} ({stage.command}{then}): "
                     + "; ".join(about))
        for run in stage.runs:
            found = outcomes[run.id]
            lines.append(f"  {found.state:<8} {run.id}" + (f": {found.detail}" if found.detail else ""))
            paths = None
            if run.stage.references and all(outcomes[d.id].state == "done" for d in run.dependencies):
                with contextlib.suppress(ConfigError):
                    paths = resolve(run, sweep)
            for argv in commands(run, launch, paths):
                lines.append("           lit-embed " + shlex.join(argv))
    return "\n".join(lines) + "\n" + summary(sweep, outcomes)

