"""A sweep folder as ``lit-embed report`` reads it: the runs of each row's best grid point, labelled with the
row's name and seed, and tables of the grid search and of the runs still missing."""

from __future__ import annotations

from pathlib import Path

from lit_embed.measures.tables import MISSING, Table, logged_text, mean_std, score_text
from lit_embed.runs.results import is_score
from lit_embed.sweeps.outcomes import STATES, Grid, Outcome, counts, grids, outcome
from lit_embed.sweeps.plan import Stage, Sweep, read_manifest


def sweep_runs(folder: str | Path, digits: int = 1) -> tuple[list[dict], list[Table]]:
    """The ``results.json`` of every finished run the sweep reports, as a row of its table (``label``: the row's
    name; ``seed``: the run's; ``variant``: its stage label's own words, :attr:`Run.variant`), and the grid-search and progress tables (scores with ``digits`` decimals)."""
    sweep = read_manifest(folder)
    outcomes = {run.id: outcome(run) for run in sweep.runs}
    runs, tables = [], []
    for stage in sweep.stages:
        winners = None
        if stage.search:
            found = grids(stage, outcomes)
            tables.append(grid_table(stage, found, outcomes, digits))
            winners = {grid.row: grid.best for grid in found}
        for run in stage.runs:
            results = outcomes[run.id].results
            if results is None or (winners is not None and run.point != winners[run.row]):
                continue
            seed = results.get("seed") if run.seed is None else run.seed
            runs.append({**results, "label": run.label, "seed": seed, "sweep_run": run.id, "variant": run.variant})
    tables.append(progress_table(sweep, outcomes))
    return runs, tables


def grid_table(stage: Stage, found: list[Grid], outcomes: dict[str, Outcome], digits: int = 1) -> Table:
    points = list(dict.fromkeys(run.point for run in stage.runs))
    scores = {name for run in stage.runs for name in (outcomes[run.id].results or {}).get("scores") or ()}
    scaled = is_score(stage.select.metric, scores)  # x 100, as report's other tables show it
    rows, notes = [], []
    for grid in found:
        tasks = {(outcomes[r.id].results or {}).get("task") for r in stage.runs if r.row == grid.row} - {None}
        cells = [grid.label, ", ".join(sorted(tasks)) or dict(grid.row).get("task", MISSING)]
        for point in points:
            seeds = grid.scores.get(point, {})
            if not seeds:
                cells.append(MISSING)
                continue
            values = list(seeds.values())
            text = score_text(*mean_std(values), digits) if scaled else logged_text(*mean_std(values))
            cells.append(text + ("*" if len(values) < grid.expected[point] else ""))
        cells.append(grid.best or MISSING)
        rows.append(cells)
        if any(len(grid.scores.get(p, {})) < grid.expected[p] for p in points):
            notes.append(f"{grid.label}: * not every seed of the point has finished; the choice may change")
    notes.append(f"each point: the {stage.select.describe()} of its best checkpoint{' x 100' if scaled else ''}, mean ± std "
                 f"over seeds; the tables above and below report the chosen point's runs")
    return Table(f"Grid search, stage {stage.name}: the {stage.select.describe()} per point", ["Model", "Task", *points,
                 "Chosen"], rows, notes)


def progress_table(sweep: Sweep, outcomes: dict[str, Outcome]) -> Table:
    rows = []
    for stage in sweep.stages:
        found = counts(Sweep(sweep.path, sweep.folder, [stage]), outcomes)
        rows.append([stage.name, str(len(stage.runs)), *(str(found[state]) for state in STATES)])
    notes = [f"{run.id}: {outcomes[run.id].state}" + (f" ({outcomes[run.id].detail})" if outcomes[run.id].detail else "")
             for run in sweep.runs if outcomes[run.id].state != "done"]
    if notes:
        notes.append(f"finish them: lit-embed sweep --config {sweep.path}")
    return Table(f"Sweep {sweep.folder}: runs", ["Stage", "Runs", *(s.capitalize() for s in STATES)], rows, notes)
