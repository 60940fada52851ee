"""``lit-embed sweep``: a sweep file's grid of runs, locally, on every GPU of a node, or as SLURM job arrays.

    lit-embed sweep --config configs/sweeps/demo.yaml --dry-run      # the plan, and how far it has got
    lit-embed sweep --config configs/sweeps/demo.yaml                # run what is not done, one after another
    lit-embed sweep --config SWEEP.yaml --launcher gpus              # one run per visible GPU at a time
    lit-embed sweep --config SWEEP.yaml --launcher slurm             # one job array per stage
    lit-embed report runs/sweeps/demo                                # the tables
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
from pathlib import Path

import yaml

from lit_embed.commands import check_yaml_files, command, user_error
from lit_embed.commands.parsing import ArgumentParser
from lit_embed.errors import ConfigError, causes
from lit_embed.sweeps.launch import (
    LAUNCHERS,
    Launch,
    check_not_launching,
    commands,
    launch_here,
    launch_inline,
    plan_text,
    run_here,
    summary,
)
from lit_embed.sweeps.outcomes import counts
from lit_embed.sweeps.plan import REFERENCE, Run, load_sweep
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
                         help="local: one run after another, each in a process of its own (default); inline: one after "
                         "another in this process (imports once: quicker for many small runs); gpus: as many runs at once as the visible GPUs "
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
        run = sweep.run(args.run)
        check_not_launching(sweep, run)
        return run_here(sweep, run, launch, execute, user_error)
    sweep.leave_out(functools.partial(unmet_budget, launch=launch, seen={}))
    if args.dry_run:
        print(plan_text(sweep, launch), end="")
        if launch.launcher == "slurm":
            submit(sweep, launch, dry_run=True)
        return 0
    if launch.launcher == "slurm":
        outcomes = submit(sweep, launch)
    elif launch.launcher == "inline":
        outcomes = launch_inline(sweep, launch, execute, user_error)
    else:
        outcomes = launch_here(sweep, launch)
    print(summary(sweep, outcomes), end="")
    found = counts(sweep, outcomes)
    if launch.launcher != "slurm" and (found["failed"] or found["left"]):
        raise ConfigError(f"{found['failed']} run(s) failed and {found['left']} are left (see above): fix what failed and "
                          f"run the same command again; finished runs are skipped, stopped ones resume")
    return 0


def unmet_budget(run: Run, launch: Launch, seen: dict[tuple[str, ...], str | None]) -> str | None:
    """Why ``run`` cannot be, where its strategy's structure cannot meet the budget its config asks (the budget knob's
    refusal, found by building its model from shapes alone, as ``lit-embed params`` does), else ``None``: any other
    error is the run's own to report. ``seen`` holds the answers by model arguments (seeds and folders differ)."""
    if run.stage.command == "compress":
        return _unmet_compression(run, seen)
    if not any(key.rsplit(".", 1)[-1] == "budget" for key, _ in run.overrides()):
        return None  # only a budget the sweep sets is checked before the run (a config file's is met when it runs)
    (argv,) = commands(run, launch)
    model = tuple(argv[1:argv.index("--trainer.default_root_dir")])
    if model[-2:-1] == ("--seed_everything",):
        model = model[:-2]
    if model not in seen:
        # torch and Lightning: imported only where a fit run is planned
        from lit_embed.commands.lightning import ModelOnlyCLI
        from lit_embed.errors import BudgetError
        from lit_embed.hub import shapes_only

        seen[model] = None
        try:
            with shapes_only(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                ModelOnlyCLI(args=list(model), run=False, prog="lit-embed sweep")
        except (Exception, SystemExit) as error:  # any other error is the run's to report (a parser may wrap the refusal)
            cause = next((e for e in causes(error) if isinstance(e, BudgetError)), None)
            seen[model] = None if cause is None else str(cause)
    return seen[model]


def _unmet_compression(run: Run, seen: dict) -> str | None:
    """Why a compress run cannot be: its method refuses the source's table before any work (``--method fit``: a
    strategy with no vocabulary, or one whose structure cannot meet the budget). Checked where the run compresses a
    model named as it is (not an earlier stage's), on an empty table of the model's shape."""
    arguments: dict = {}
    for config in run.configs():
        with contextlib.suppress(OSError, yaml.YAMLError):
            loaded = yaml.safe_load(Path(config).read_text())
            arguments.update(loaded if isinstance(loaded, dict) else {})
    arguments.update(run.overrides())
    ckpt = arguments.get("ckpt")
    if not isinstance(ckpt, str) or REFERENCE.search(ckpt):
        return None
    import torch

    from lit_embed.compress.methods import Job, method_class, method_named
    from lit_embed.compress.strategy_fit import NoVocabularyError
    from lit_embed.errors import BudgetError

    key = ("compress", json.dumps(sorted(arguments.items()), default=str))
    if key not in seen:
        seen[key] = None
        try:
            method = str(arguments.get("method", "sparse_coding"))
            names = method_class(method).option_names()
            compression = method_named(method, {k: v for k, v in arguments.items() if k in names})
            compression.check(Job(torch.empty(_table_shape(ckpt), device="meta"), torch.arange(0)))
        except Exception as error:  # any other error is the run's own to report when it runs
            cause = next((e for e in causes(error) if isinstance(e, (BudgetError, NoVocabularyError))), None)
            seen[key] = None if cause is None else str(cause)
    return seen[key]


@functools.cache
def _table_shape(ckpt: str) -> tuple[int, ...]:
    """The input embedding table's shape of the model compress would read."""
    from lit_embed.compress.model_io import load_source

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return tuple(load_source(ckpt).weight.shape)


def execute(argv: list[str]) -> None:
    """One command of a sweep's run, in this process (its exit status: an exception, as the command raises it)."""
    check_yaml_files(argv)
    command(argv[0])(argv[1:])
