"""``lit-embed report RUN_DIR...``: the papers' tables from run folders, sweep folders and compress outputs."""

from __future__ import annotations

import sys
from pathlib import Path

from lit_embed.commands.parsing import ArgumentParser
from lit_embed.errors import ConfigError
from lit_embed.files import check_output, write_atomic
from lit_embed.reporting import (
    Report,
    compress_reports,
    cosine_tables,
    coverage_tables,
    left_out_table,
    run_and_sweep_folders,
)
from lit_embed.results import COMPLETE, RESULTS_FILE, load_results, status_of
from lit_embed.sweeps.plan import MANIFEST
from lit_embed.sweeps.progress import sweep_runs
from lit_embed.tables import FORMATS, render


def main(argv: list[str]) -> int:
    """The papers' tables (scores, memory, speed) from run folders' results.json."""
    parser = ArgumentParser(
        allow_abbrev=False,
        prog="lit-embed report",
        description="The papers' tables from run folders: scores per benchmark (mean ± std over seeds), "
        "memory efficiency with PRR and PCR (HashFormers Table 2), speed (HashFormers Table 3).",
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="run folders, folders holding them, or sweep folders (lit-embed sweep's)")
    parser.add_argument("--baseline", metavar="RUN_DIR", help="a run of the baseline model: its label's runs are the baseline")
    parser.add_argument("--format", choices=FORMATS, default="md", help="md (default), csv or latex")
    parser.add_argument("--digits", type=int, default=1, help="decimals of scores and PRR (default 1)")
    parser.add_argument("--output", "-o", help="write to this file instead of printing")
    args = parser.parse_args(argv)
    if not 0 <= args.digits <= 6:
        raise ConfigError(f"--digits={args.digits}: use 0 to 6")
    dirs, sweeps = run_and_sweep_folders(args.run_dirs)
    runs = [load_results(d) for d in dirs]
    unfinished = [run for run in runs if status_of(run) != COMPLETE]  # stopped short or diverged: never averaged in
    if unfinished:
        listed = ", ".join(f"{run['run_dir']} ({status_of(run)})" for run in unfinished)
        print(f"lit-embed report: left out {len(unfinished)} run(s) that did not complete: {listed}", file=sys.stderr)
    predictions = [run["run_dir"] for run in runs if run.get("command") == "predict"]  # no scores: not a row
    runs = [run for run in runs if status_of(run) == COMPLETE and run["run_dir"] not in predictions]
    sweep_tables = []
    for folder in sweeps:
        found, tables = sweep_runs(folder, args.digits)
        runs += found
        sweep_tables += tables
    baseline = None
    if args.baseline is not None:
        baseline = load_results(args.baseline)
        where = Path(baseline["run_dir"]).resolve()
        known = [r for r in runs if Path(r["run_dir"]).resolve() == where]
        if known:
            baseline = known[0]  # as reported (a sweep's run: labelled with its row's name)
        else:
            runs.append(baseline)
    compressed = compress_reports(args.run_dirs)
    coverage = coverage_tables(compressed) + cosine_tables(compressed)
    tables = Report(runs, baseline, args.digits).tables() if runs or not (sweep_tables or unfinished or coverage) else []
    text = render(tables + sweep_tables + coverage + left_out_table(unfinished), args.format)
    if args.output:  # never over a file it read (a results.json, a sweep's plan, a compress report)
        read = [*(d / RESULTS_FILE for d in dirs), *(Path(r["run_dir"]) / RESULTS_FILE for r in runs),
                *(Path(s) / MANIFEST for s in sweeps), *(f for p in args.run_dirs for f in Path(p).rglob("report.json"))]
        check_output(Path(args.output), True, lambda out: None, read, option="--output")
        write_atomic(args.output, text)
    else:
        print(text, end="")
    return 0
