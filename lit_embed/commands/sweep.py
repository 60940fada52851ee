"""``lit-embed sweep``: a sweep file's grid of runs, locally, on every GPU of a node, or as SLURM job arrays.

    lit-embed sweep --config configs/sweeps/demo.yaml --dry-run      # the plan, and how far it has got
    lit-embed sweep --config configs/sweeps/demo.yaml                # run what is not done, one after another
    lit-embed sweep --config SWEEP.yaml --launcher gpus              # one run per visible GPU at a time
    lit-embed sweep --config SWEEP.yaml --launcher slurm             # one job array per stage
    lit-embed report runs/sweeps/demo                                # the tables
"""

from __future__ import annotations

from lit_embed.commands import check_yaml_files, command, user_error
from lit_embed.commands.parsing import ArgumentParser
from lit_embed.errors import ConfigError
from lit_embed.sweeps.launch import LAUNCHERS, Launch, launch_here, plan_text, run_here, summary
from lit_embed.sweeps.outcomes import counts
from lit_embed.sweeps.plan import load_sweep
from lit_embed.sweeps.slurm import submit


def parser() -> ArgumentParser:
    parsing = ArgumentParser(
        allow_abbrev=False,
        prog="lit-embed sweep",
        description="Run a sweep file's stages: every combination of its axes, grid and seeds, each run in a folder "
        "of its own under the sweep's folder. Finished runs are skipped and stopped ones resumed, so running the "
        "command again finishes what is missing.",
    )
    parsing.add_argument("--config", required=True, metavar="SWEEP.yaml", help="the sweep file (see configs/sweeps/)")
    parsing.add_argument("--launcher", choices=LAUNCHERS, default="local",
                         help="local: one run after another (default); gpus: as many runs at once as the visible GPUs "
                         "allow, each on its own (CUDA_VISIBLE_DEVICES); slurm: one job array per stage (sbatch)")
    parsing.add_argument("--gpus-per-run", type=int, metavar="N",
                         help="GPUs each run takes under gpus and slurm (N > 1: DDP); default the sweep file's gpus_per_run (1)")
    parsing.add_argument("--folder", metavar="DIR", help="where the runs go (default the sweep file's folder)")
    parsing.add_argument("--dry-run", action="store_true",
                         help="print the plan (each run's state and command lines) and run nothing; with --launcher "
                         "slurm, write the job scripts without submitting them")
    parsing.add_argument("--run", metavar="STAGE/NAME", help="run this one run here, in this process (what each launcher "
                         "starts, and each SLURM array task)")
    return parsing


def main(argv: list[str]) -> int:
    """A sweep file's grids, seeds and stages as runs of their own, resumable, locally, on GPUs or SLURM."""
    args = parser().parse_args(argv)
    if args.gpus_per_run is not None and args.gpus_per_run < 0:
        raise ConfigError(f"--gpus-per-run {args.gpus_per_run}: give 0 or more")
    sweep = load_sweep(args.config, args.folder)
    launch = Launch(args.launcher, args.gpus_per_run)
    if args.run is not None:
        return run_here(sweep, sweep.run(args.run), launch, execute, user_error)
    if args.dry_run:
        print(plan_text(sweep, launch), end="")
        if launch.launcher == "slurm":
            submit(sweep, launch, dry_run=True)
        return 0
    if launch.launcher == "slurm":
        outcomes = submit(sweep, launch)
    else:
        outcomes = launch_here(sweep, launch)
    print(summary(sweep, outcomes), end="")
    found = counts(sweep, outcomes)
    if launch.launcher != "slurm" and (found["failed"] or found["left"]):
        raise ConfigError(f"{found['failed']} run(s) failed and {found['left']} are left (see above): fix what failed and "
                          f"run the same command again; finished runs are skipped, stopped ones resume")
    return 0


def execute(argv: list[str]) -> None:
    """One command of a sweep's run, in this process (its exit status: an exception, as the command raises it)."""
    check_yaml_files(argv)
    command(argv[0])(argv[1:])
