"""What a sweep's runs left on disk (done, diverged, running, failed, left), the best grid point of each row, and the
earlier runs a ``${stage.checkpoint}`` reference resolves to.

A run is done when one of its ``version_N`` folders holds a complete ``results.json``: every step its stage asked
for (fit, then the test it runs on task data) finished; a compress run that does not test, when its ``model.ckpt`` is
written. One whose newest ``results.json`` says it diverged is settled
too: launching again would diverge again, so it is not started, a grid leaves it out, and later stages start from the
others. Its launch keeps
``SWEEP/logs/<stage>/<run>/``: ``output.log`` (what it printed), ``status.json`` (running on which host and
process, or its exit status and error) and the lock of the live process.
"""

from __future__ import annotations

import contextlib
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from lit_embed.errors import ConfigError, UserError
from lit_embed.runs import folders
from lit_embed.runs.results import COMPLETE, DIVERGED, RESULTS_FILE, load_results, status_of
from lit_embed.sweeps.plan import REFERENCE, Run, Select, Stage, Sweep, candidates

LOGS = "logs"
STATUS_FILE = "status.json"
OUTPUT_FILE = "output.log"
STATES = ("done", "diverged", "unmet", "running", "failed", "left")
#: States that launching again does not change (unmet: left out, its strategy cannot meet its budget).
SETTLED = ("done", "diverged", "unmet")
#: Exit statuses of a run stopped by a signal (SIGINT, SIGTERM): it resumes from its last checkpoint.
STOPPED = (130, 143)


@dataclass
class Outcome:
    state: str                  # one of STATES
    results: dict | None = None  # the complete results.json of a done run
    detail: str = ""            # failed: its last error line; left: why; running: where


def book(run: Run) -> Path:
    """The folder of a run's launch records: ``SWEEP/logs/<stage>/<run>``."""
    return run.folder.parent.parent / LOGS / run.stage.name / run.name


def finished_results(run: Run) -> dict | None:
    """The complete ``results.json`` of the run's newest version folder that has one."""
    return next((results for results in _results(run) if status_of(results) == COMPLETE), None)


def finished(run: Run) -> bool:
    """Whether every step of the run finished: a complete ``results.json``; for a compress stage that does not test,
    its ``model.ckpt`` (compress writes its folder whole or not at all)."""
    if finished_results(run) is not None:
        return True
    return run.stage.command == "compress" and not run.stage.test and (run.folder / "model.ckpt").is_file()


def _results(run: Run):
    """The readable ``results.json`` of the run's version folders, newest first."""
    for folder in reversed(folders.version_folders(run.folder)):
        if (folder / RESULTS_FILE).is_file():
            with contextlib.suppress(UserError):
                yield load_results(folder)


def outcome(run: Run) -> Outcome:
    if run.unmet:
        return Outcome("unmet", detail=run.unmet)
    results = finished_results(run)
    if results is not None or finished(run):
        return Outcome("done", results)
    newest = next(_results(run), None)
    if newest is not None and status_of(newest) == DIVERGED:
        return Outcome("diverged", detail=f"{newest.get('detail') or 'diverged'} (remove {newest['run_dir']} to run it "
                                          f"again)")
    status = read_status(run)
    if status is None:
        return Outcome("left")
    if status.get("state") == "unmet":  # its strategy met the data and could not meet its budget (the plan cannot know)
        return Outcome("unmet", detail=status.get("error") or "its strategy cannot meet its budget")
    if status.get("state") == "running":
        if folders.held(book(run)):  # its process holds the lock until it ends, on whichever host it runs
            return Outcome("running", detail=f"process {status.get('pid')} on {status.get('host')}")
        return Outcome("left", detail="killed: it resumes from its last checkpoint")
    code = status.get("exit")
    if code in STOPPED:
        return Outcome("left", detail="stopped by a signal: it resumes from its last checkpoint")
    error = status.get("error") or last_error_line(book(run) / OUTPUT_FILE) or f"exit status {code}"
    return Outcome("failed", detail=error)


def to_launch(run: Run, found: Outcome) -> bool:
    """Whether a launch runs ``run``: not finished, or found unmet when it last ran rather than by the plan (its budget
    may have been edited since; the refusal takes seconds to repeat)."""
    return found.state in ("left", "failed") or (found.state == "unmet" and run.unmet is None)


def start_left_out(run: Run, outcomes: dict[str, Outcome]) -> str | None:
    """Why ``run`` is left out when every run it could start from is (found out when they ran), else ``None``: the
    plan's rule (:meth:`~lit_embed.sweeps.plan.Sweep.leave_out`) applied to what the launch has learnt since."""
    if run.dependencies and all(outcomes[d.id].state == "unmet" for d in run.dependencies):
        return f"starts from {run.dependencies[0].id}, which is left out"
    return None


def read_status(run: Run) -> dict | None:
    with contextlib.suppress(OSError, ValueError):
        return json.loads((book(run) / STATUS_FILE).read_text())
    return None


def last_error_line(log: Path) -> str | None:
    """The line of ``log`` that says what went wrong last: ``lit-embed: error: ...``, a parser's ``error:``, or
    the exception line ending a traceback."""
    try:
        with log.open("rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - 64_000))
            lines = [line.strip() for line in handle.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    for line in reversed(lines):
        if "error:" in line or re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", line):
            return line
    return lines[-1] if lines else None


# -- choosing: the best grid point of a row, the run a reference takes ---------------------------------------


def score(results: dict, select: Select) -> float | None:
    """The run's validation score for selection: that of its best checkpoint (the one tested) where its
    checkpoint callback monitored ``select.metric``, else the final one logged."""
    checkpoint = results.get("checkpoint") or {}
    if checkpoint.get("monitor") == select.metric and checkpoint.get("best_score") is not None:
        return float(checkpoint["best_score"])
    value = (results.get("metrics") or {}).get(select.metric)
    return None if value is None else float(value)


@dataclass
class Grid:
    """One row of a stage that searches a grid: each point's scores (by seed) and the point chosen."""

    stage: Stage
    row: tuple
    label: str
    scores: dict[str, dict[int | None, float]]  # point -> seed -> score, of the runs that are done
    expected: dict[str, int]                    # point -> how many runs it has
    best: str | None

    def mean(self, point: str) -> float | None:
        values = list(self.scores.get(point, {}).values())
        return statistics.fmean(values) if values else None


def grids(stage: Stage, outcomes: dict[str, Outcome], runs: list[Run] | None = None) -> list[Grid]:
    """Each row's grid search (of ``runs``, default the stage's): the point with the best mean score over its
    seeds (runs that are not done left out)."""
    rows: dict[tuple, list[Run]] = {}
    for run in stage.runs if runs is None else runs:
        rows.setdefault(run.row, []).append(run)
    found = []
    for row, runs in rows.items():
        scores: dict[str, dict] = {run.point: {} for run in runs}
        expected: dict[str, int] = {}
        for run in runs:
            expected[run.point] = expected.get(run.point, 0) + 1
            results = outcomes[run.id].results
            value = score(results, stage.select) if results is not None else None
            if value is not None:
                scores[run.point][run.seed] = value
        grid = Grid(stage, row, runs[0].label, scores, expected, None)
        grid.best = stage.select.best({point: grid.mean(point) for point in scores})
        found.append(grid)
    return found


def chosen(run: Run, earlier: Stage) -> Run:
    """The run of ``earlier`` that ``run`` refers to: of the runs with its values of the shared axes, the
    best grid point's, with ``run``'s seed where that point ran it, else its best seed."""
    pool = candidates(run, earlier)
    outcomes = {r.id: outcome(r) for r in pool}
    unfinished = [r for r in pool if outcomes[r.id].state not in SETTLED]
    if unfinished:
        listed = ", ".join(f"{r.id} ({outcomes[r.id].state})" for r in unfinished[:4])
        more = f" and {len(unfinished) - 4} more" if len(unfinished) > 4 else ""
        raise ConfigError(f"{run.id} starts from stage {earlier.name!r}, whose runs {listed}{more} have not finished: "
                          f"finish them first (run `lit-embed sweep` again)")
    pool = [r for r in pool if outcomes[r.id].state == "done"]  # a diverged run has no model to start from
    if not pool:
        raise ConfigError(f"{run.id} starts from stage {earlier.name!r}, whose runs for it all diverged: rerun them with a "
                          f"lower learning rate (remove their folders), or leave this run out")
    if earlier.search:
        (grid,) = grids(earlier, outcomes, pool)  # the pool is one row: the shared axes name it
        if grid.best is None:
            raise ConfigError(f"no run of stage {earlier.name!r} for {run.id} logged {earlier.select.metric}: give the "
                              f"stage a select.metric its runs log")
        pool = [r for r in pool if r.point == grid.best]
    same_seed = [r for r in pool if run.seed is not None and r.seed == run.seed]
    if same_seed or len(pool) == 1:
        return (same_seed or pool)[0]
    best = earlier.select.best({r.id: score(outcomes[r.id].results, earlier.select) for r in pool})
    if best is None:
        raise ConfigError(f"no run of stage {earlier.name!r} for {run.id} logged {earlier.select.metric}: give the stage "
                          f"a select.metric its runs log")
    return next(r for r in pool if r.id == best)


def checkpoint_of(run: Run) -> Path:
    """The checkpoint a later stage starts from: a compress run's model, a fit run's reported one (its best checkpoint,
    the one tested; its last where nothing was monitored)."""
    if run.stage.command == "compress":
        return run.folder / "model.ckpt"
    return folders.start_checkpoint(finished_results(run)["run_dir"], f"the checkpoint of {run.id}")


def resolve(run: Run, sweep: Sweep) -> dict[str, str]:
    """Each ``${stage.checkpoint}`` and ``${stage.folder}`` of ``run``'s stage, as the paths they stand for now."""
    stages = {s.name: s for s in sweep.stages}
    found = {}
    for name in run.stage.references:
        earlier = chosen(run, stages[name])
        found[f"${{{name}.checkpoint}}"] = str(checkpoint_of(earlier))
        found[f"${{{name}.folder}}"] = str(earlier.folder)
    return found


def substitute(value, paths: dict[str, str]):
    """``value`` with its references replaced (in strings, lists and mappings)."""
    if isinstance(value, str):
        return REFERENCE.sub(lambda m: paths[m.group(0)], value)
    if isinstance(value, list):
        return [substitute(v, paths) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, paths) for k, v in value.items()}
    return value


def counts(sweep: Sweep, outcomes: dict[str, Outcome]) -> dict[str, int]:
    return {state: sum(1 for r in sweep.runs if outcomes[r.id].state == state) for state in STATES}
