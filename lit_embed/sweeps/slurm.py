"""``--launcher slurm``: one SLURM job array per stage, one array task per run that is not done, submitted
with ``sbatch``; a stage that starts from earlier stages waits for their arrays (``afterany``).

Each task runs ``lit-embed sweep --run STAGE/NAME`` under ``srun``: it resolves the run's references when it
starts (the earlier arrays have ended by then) and runs ``lit-embed fit ... --ckpt_path last`` in its own
process, so Lightning's SLURM handling applies. ``--signal=SIGUSR1@120`` makes Lightning save a checkpoint
and requeue the task before its time limit; ``--requeue`` lets SLURM requeue a preempted task (SIGTERM makes
lit-embed save ``last.ckpt`` first); either way the task resumes from its newest checkpoint.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from lit_embed.errors import ConfigError
from lit_embed.storage.files import write_atomic
from lit_embed.sweeps.launch import LAUNCHED, Launch, claim_sweep_folder, run_argv
from lit_embed.sweeps.outcomes import LOGS, OUTPUT_FILE, Outcome, outcome
from lit_embed.sweeps.plan import Run, Stage, Sweep

SCRIPTS = "slurm"
#: Lightning saves and requeues this long (seconds) before the time limit.
WARNING_SECONDS = 120


def submit(sweep: Sweep, launch: Launch, dry_run: bool = False, say: Callable[[str], None] = print) -> dict[str, Outcome]:
    """Write each stage's job script to ``SWEEP/slurm/<stage>.sbatch`` and submit it (unless ``dry_run``)."""
    if not dry_run and shutil.which("sbatch") is None:
        raise ConfigError("sbatch is not on the PATH: --launcher slurm submits from a SLURM cluster's login node "
                          "(--dry-run writes the job scripts without submitting them)")
    if not dry_run:
        claim_sweep_folder(sweep)
    outcomes = {run.id: outcome(run) for run in sweep.runs}
    jobs: dict[str, str] = {}
    for stage in sweep.stages:
        todo = [run for run in stage.runs if outcomes[run.id].state in ("left", "failed")]
        if not todo:
            continue
        script = write_atomic(script_path(sweep, stage), job_script(sweep, stage, todo, launch))
        after = [jobs[name] for name in stage.references if name in jobs]
        argv = ["sbatch", "--parsable", *([f"--dependency=afterany:{':'.join(after)}"] if after else []), str(script)]
        if dry_run:
            say(f"would submit stage {stage.name} ({len(todo)} runs): {shlex.join(argv)}")
            jobs[stage.name] = f"${stage.name.upper().replace('-', '_')}_JOB"
            continue
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode:
            raise ConfigError(f"sbatch refused {script} (exit {done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
        jobs[stage.name] = done.stdout.strip().split(";")[0]
        say(f"submitted stage {stage.name} as job {jobs[stage.name]} ({len(todo)} array tasks): {script}")
        for run in todo:
            outcomes[run.id] = Outcome("left", detail=f"queued as job {jobs[stage.name]}")
    return outcomes


def job_script(sweep: Sweep, stage: Stage, runs: list[Run], launch: Launch) -> str:
    """The job array of ``runs`` (one task each) with the sweep's ``slurm:`` options as ``#SBATCH`` lines."""
    gpus = launch.gpus(runs[0])
    folder = sweep.folder.absolute()
    options = dict(stage.slurm)
    parallel = options.pop("max_parallel", None)
    directives = {
        "job-name": f"{sweep.name}.{stage.name}",
        "array": f"0-{len(runs) - 1}" + (f"%{parallel}" if parallel else ""),
        "nodes": 1,
        "ntasks-per-node": max(1, gpus),  # Lightning's DDP under SLURM: one task per GPU
        **({"gpus-per-node": gpus} if gpus else {}),
        "output": f"{folder / SCRIPTS}/{stage.name}-%A_%a.out",
        "open-mode": "append",
        "requeue": True,
        "signal": f"SIGUSR1@{WARNING_SECONDS}",
        **{str(key).replace("_", "-"): value for key, value in options.items()},
    }
    lines = [
        "#!/bin/bash",
        f"# Written by `lit-embed sweep --launcher slurm` for stage {stage.name!r} of {sweep.path}: one array task",
        "# per run. Each resumes its run from its newest checkpoint (--ckpt_path last); submitting again",
        "# (lit-embed sweep ... --launcher slurm) queues only the runs that are not done.",
    ]
    for key, value in directives.items():
        if value is True:
            lines.append(f"#SBATCH --{key}")
        elif value not in (False, None):
            lines.append(f"#SBATCH --{key}={value}")
    logs = folder / LOGS / stage.name
    command = [sys.executable, "-m", "lit_embed.commands", *run_argv(sweep, runs[0], launch)]
    at = command.index("--run") + 1
    invocation = f'{shlex.join(command[:at])} "$run" {shlex.join(command[at + 1:])}'
    lines += [
        "set -eu",
        f"cd {shlex.quote(os.getcwd())}",
        "names=(",
        *(f"  {shlex.quote(run.name)}" for run in runs),
        ")",
        'name="${names[$SLURM_ARRAY_TASK_ID]}"',
        f"run={shlex.quote(stage.name)}/\"$name\"",
        f"log={shlex.quote(str(logs))}/\"$name\"/{OUTPUT_FILE}",
        'mkdir -p "$(dirname "$log")"',
        # the log is appended to in place: never through a link (a sweep folder copied from elsewhere may hold one)
        'if [ -L "$log" ]; then echo "lit-embed: error: sweep run\'s log $log is a symbolic link: remove it" >&2; exit 2; fi',
        f"export {LAUNCHED}={shlex.quote('slurm')}  # this sweep's own run: not refused as run by hand beside a launch",
        f'srun {invocation} >> "$log" 2>&1',
        "",
    ]
    return "\n".join(lines)


def script_path(sweep: Sweep, stage: Stage) -> Path:
    return sweep.folder / SCRIPTS / f"{stage.name}.sbatch"
