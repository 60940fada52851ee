"""``lit-embed report RUN_DIR...``: the papers' tables from run folders, sweep folders and compress outputs."""

from __future__ import annotations

import sys
from pathlib import Path

from lit_embed.commands.parsing import ArgumentParser
from lit_embed.errors import ConfigError
from lit_embed.measures.tables import FORMATS, render
from lit_embed.reports import pareto
from lit_embed.reports.papers import (
    Report,
    compress_reports,
    cosine_tables,
    coverage_tables,
    left_out_table,
    run_and_sweep_folders,
)
from lit_embed.runs.results import COMPLETE, RESULTS_FILE, load_results, status_of
from lit_embed.storage.files import check_file_output, write_atomic
from lit_embed.sweeps.plan import MANIFEST, is_sweep_folder
from lit_embed.sweeps.progress import sweep_runs

#: The figure's file name where ``--figure`` names none.
FIGURE = "pareto.png"


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
    parser.add_argument("--output", "-o", help="write to this file instead of printing (one that exists: --overwrite)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace --output and --figure where they exist (never a file the report reads)")
    parser.add_argument("--figure", nargs="?", const="", metavar="FILE.png",
                        help="draw the Pareto figure (task score against embedding parameters, a line per strategy, the "
                        f"frontier marked, ± std over seeds) to this PNG, and to TensorBoard beside it, with its table; "
                        f"without FILE: {FIGURE} beside --output, or in the one sweep folder given")
    args = parser.parse_args(argv)
    if not 0 <= args.digits <= 6:
        raise ConfigError(f"--digits={args.digits}: use 0 to 6")
    figure = None if args.figure is None else figure_path(args.figure, args.output, args.run_dirs)
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
    report = Report(runs, baseline, args.digits) if runs or not (sweep_tables or unfinished or coverage) else None
    tables = report.tables() if report else []
    read = [*(d / RESULTS_FILE for d in dirs), *(Path(r["run_dir"]) / RESULTS_FILE for r in runs),
            *(Path(s) / MANIFEST for s in sweeps), *(f for p in args.run_dirs for f in Path(p).rglob("report.json"))]
    drawn = None
    if figure is not None:  # never over a file it read (a results.json, a sweep's plan, a compress report)
        check_file_output(figure, args.overwrite, read, option="--figure")
        scores, what = report.seed_scores() if report else ({}, "")
        points = pareto.points_of(report.runs, scores) if report else []
        if not points:
            raise ConfigError(f"--figure: no model has both a task score and parameter counts in {' '.join(args.run_dirs)}: "
                              f"give fine-tuned runs (their results.json) or a sweep folder that holds them")
        guess = pareto.chance(report.runs) if report else None
        tables.append(pareto.pareto_table(points, what, args.digits, guess))
        drawn = pareto.draw(points, what, guess)
    text = render(tables + sweep_tables + coverage + left_out_table(unfinished), args.format)
    if args.output:
        check_file_output(args.output, args.overwrite, read, option="--output")
    if drawn is not None:
        pareto.save(drawn, figure)
        print(f"lit-embed report: wrote {figure} and its TensorBoard image (tag {pareto.TAG}) in {figure.parent}",
              file=sys.stderr)
    if args.output:
        write_atomic(args.output, text)
    else:
        print(text, end="")
    return 0


def figure_path(given: str, output: str | None, run_dirs: list[str]) -> Path:
    """Where ``--figure`` draws: the file given (a .png), else beside ``--output``, else in the one sweep folder given."""
    if given:
        if Path(given).suffix.lower() != ".png":
            raise ConfigError(f"--figure {given}: the figure is a PNG; give a file name ending in .png")
        if Path(given).is_dir():
            raise ConfigError(f"--figure {given} is a folder: give a file name ending in .png, e.g. {Path(given) / FIGURE}")
        return Path(given)
    if output:
        return Path(output).parent / FIGURE
    if len(run_dirs) == 1 and is_sweep_folder(run_dirs[0]):
        return Path(run_dirs[0]) / FIGURE
    raise ConfigError("--figure without a file name draws beside --output or in the one sweep folder given: "
                      f"give it a file name, e.g. --figure {FIGURE}")
