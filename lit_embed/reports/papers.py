"""``lit-embed report``: the papers' tables from run folders (their ``results.json``).

* one score table per benchmark: GLUE and JGLUE by task, XNLI by language, each with the average
  over its tasks; every cell the mean ± sample standard deviation over seeds, scores x 100;
* the memory-efficiency table (HashFormers Table 2): PRR per task and on the average, parameter
  counts, PCR_All, PCR_Emb, PoEP;
* the speed table (HashFormers Table 3): time per sample of training and inference steps with the
  speed-up against the baseline, peak memory and the machine's load per core; a speed-up whose two runs ran at
  loads more than :data:`LOAD_MARGIN` per core apart is marked "†", the loads said in a note;
* the final metrics of pre-training runs and of tasks outside the benchmarks, with the PRR of each task's score
  against its uncompressed model (the baseline's runs on that task, else its one dense-table model among the runs);
* the coverage of each task's test data by the common tokens V_C per retention (sparse-coding Tables 5
  and 6), and the cosine similarity of the rebuilt to the original embeddings per method and k (its
  Table 9), from the ``report.json`` of ``lit-embed compress`` outputs under the folders given.

A table row is a run's ``label``: give the runs of one model the same label across tasks and seeds.
A cell holds one run per seed, in every table (pre-training runs too): two runs of one label, task and
seed are refused, never averaged. Runs of different tasks never share a cell. What is missing (a task, a
seed, a baseline figure) is shown as "–" or marked "*", and said in the table's notes.

A sweep folder (``lit-embed sweep``'s) is read as its plan says: each row's runs of the grid point chosen
on validation, labelled with the row's name, with tables of the grid search and of the runs still missing.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from lit_embed.data.tasks import BENCHMARK_TABLES, TASKS, get_task
from lit_embed.errors import ConfigError
from lit_embed.measures.accounting import compression, human
from lit_embed.measures.tables import MISSING, Table, logged_text, mean_std, score_text
from lit_embed.runs.results import (
    LOAD_MARGIN,
    RESULTS_FILE,
    check_same_backbone,
    find_run_dirs,
    is_score,
    load_per_core,
    loads_differ,
    status_of,
)
from lit_embed.sweeps.plan import MANIFEST, is_sweep_folder

#: The strategy of an uncompressed model: a task's reference for PRR where no baseline is given.
UNCOMPRESSED = "DenseEmbedding"


@dataclass(frozen=True)
class Column:
    """A benchmark column: its header, the task it comes from and the evaluation set that stands for it."""

    header: str
    task: str
    eval_set: str

    def metrics(self, paper: str | None) -> tuple[str, ...]:
        """The logged names of the column's score for a run that followed ``paper`` (first found wins)."""
        metric = TASKS[self.task].shown_metric(paper)
        return (f"{self.eval_set}/{metric}", metric) if self.eval_set else (metric,)


#: The papers' score tables, from the task table (its column headers, evaluation sets and metrics).
BENCHMARKS: dict[str, tuple[Column, ...]] = {
    name: tuple(Column(header, task, eval_set) for task in tasks for header, eval_set in TASKS[task].report_columns())
    for name, tasks in BENCHMARK_TABLES.items()
}
PRETRAINING = "pre-training"
SPLITS = ("test", "val")


def normalise_task(task: str) -> str:
    """The task table's name for ``task`` (``SST-2`` -> ``sst2``); XNLI variants and unknown tasks as given."""
    key = task.lower()
    if key.startswith("xnli"):
        return key
    try:
        return get_task(task).name
    except ConfigError:
        return key


def benchmark_of(task: str) -> str | None:
    if task.startswith("xnli"):
        return "XNLI"
    return next((name for name, tasks in BENCHMARK_TABLES.items() if task in tasks), None)


RowKey = tuple[str, str]  # (label, task variant: XNLI's protocol, else "")


@dataclass
class BenchmarkScores:
    """Scores of one benchmark: cell (row, column header) -> {seed: score}."""

    name: str
    columns: list[Column]
    rows: list[RowKey]
    cells: dict[tuple[RowKey, str], dict] = field(default_factory=dict)
    splits: dict[tuple[RowKey, str], set] = field(default_factory=dict)

    def mean(self, row: RowKey, header: str) -> float | None:
        seeds = self.cells.get((row, header))
        return statistics.fmean(seeds.values()) if seeds else None

    def average(self, row: RowKey) -> tuple[float | None, float | None]:
        """The row's average over the table's columns, and its std over the seeds that ran every task."""
        cells = [self.cells.get((row, c.header)) for c in self.columns]
        if not all(cells):
            return None, None
        mean = statistics.fmean(statistics.fmean(c.values()) for c in cells)
        complete = set.intersection(*(set(c) for c in cells))
        per_seed = [statistics.fmean(c[seed] for c in cells) for seed in complete]
        return mean, mean_std(per_seed)[1] if per_seed else None


class Report:
    """The tables for ``runs`` (loaded ``results.json`` dicts), compared against ``baseline``'s label."""

    def __init__(self, runs: list[dict], baseline: dict | None = None, digits: int = 1) -> None:
        if not runs:
            raise ConfigError("no runs to report: give run folders (or folders that hold them)")
        self.baseline_label = baseline["label"] if baseline else None
        self.baseline = baseline
        self.runs = sorted(runs, key=lambda r: r["label"] != self.baseline_label)  # the baseline's rows first
        self.digits = digits
        for run in self.runs:
            run["_task"] = normalise_task(run["task"]) if run.get("task") else None
        self._check()
        self.scores = [s for s in (self._scores(name) for name in BENCHMARKS) if s is not None]

    # -- bad input -------------------------------------------------------------------------------
    def _check(self) -> None:
        counts: dict[str, tuple[dict, tuple]] = {}
        cells: dict[tuple, str] = {}
        for run in self.runs:
            params = run.get("parameters")
            if params:
                mine = (params["total_params"], params["embedding_params"])
                first = counts.setdefault(run["label"], (run, mine))
                if first[1] != mine:
                    raise ConfigError(
                        f"runs labelled {run['label']!r} are different models: {first[0]['run_dir']} has "
                        f"{first[1][0]:,} parameters ({first[1][1]:,} embedding), {run['run_dir']} has {mine[0]:,} "
                        f"({mine[1]:,}). Give each model its own label (ResultsWriter's `label`, or the logger's name)"
                    )
            key = (run["label"], run["_task"], run.get("seed"))  # pre-training runs too: a cell per task and seed
            if key in cells:
                task = f"task {run['task']!r}" if run["_task"] is not None else PRETRAINING
                raise ConfigError(
                    f"{cells[key]} and {run['run_dir']} are both {run['label']!r} on {task} with seed {run.get('seed')}: "
                    f"a cell holds one run per seed (its mean and std are over seeds), so one cell cannot hold both; "
                    f"leave one out or give it another label"
                )
            cells[key] = run["run_dir"]
            if self.baseline is not None:
                check_same_backbone(run, self.baseline)

    # -- scores ----------------------------------------------------------------------------------
    def _scores(self, name: str) -> BenchmarkScores | None:
        runs = [r for r in self.runs if r["_task"] and benchmark_of(r["_task"]) == name]
        if not runs:
            return None
        scores = BenchmarkScores(name, [], [])
        for run in runs:
            variant = run["task"] if name == "XNLI" and run["_task"] != "xnli" else ""
            row = (run["label"], variant)
            if row not in scores.rows:
                scores.rows.append(row)
            for column in BENCHMARKS[name]:
                if name != "XNLI" and column.task != run["_task"]:
                    continue
                found = _score(run, column.metrics(run.get("paper")))
                if found is not None:
                    scores.cells.setdefault((row, column.header), {})[run.get("seed")] = found[0]
                    scores.splits.setdefault((row, column.header), set()).add(found[1])
        scores.columns = [c for c in BENCHMARKS[name] if any(header == c.header for _, header in scores.cells)]
        return scores

    def score_table(self, scores: BenchmarkScores) -> Table:
        notes: list[str] = []
        rows = []
        for row in scores.rows:
            name = _row_name(row)
            seen = [scores.cells.get((row, c.header)) or {} for c in scores.columns]
            expected = set().union(*seen)
            cells = [name]
            for column, seeds in zip(scores.columns, seen):
                if not seeds:
                    cells.append(MISSING)
                    notes.append(f"{name}: no {column.header} result")
                    continue
                incomplete = set(seeds) != expected
                cells.append(self._score_cell(*mean_std(list(seeds.values()))) + ("*" if incomplete else ""))
                if incomplete:
                    missing = ", ".join(str(s) for s in sorted(expected - set(seeds), key=str))
                    notes.append(f"{name} / {column.header}: {len(seeds)} of {len(expected)} seeds (missing seed {missing})")
            average, spread = scores.average(row)
            cells.append(MISSING if average is None else self._score_cell(average, spread))
            if average is None:
                notes.append(f"{name}: no average without every task of the table")
            rows.append(cells)
        notes.append(_split_note(scores))
        title = f"{scores.name}: scores x 100, mean ± std over seeds"
        return Table(title, ["Model", *(c.header for c in scores.columns), "Avg"], rows, notes)

    # -- memory efficiency (HashFormers Table 2) -------------------------------------------------
    def memory_table(self) -> Table | None:
        labels = list(dict.fromkeys(r["label"] for r in self.runs if r.get("parameters")))
        if not labels:
            return None
        notes = []
        header = ["Model"]
        prr_columns: list[tuple[BenchmarkScores, str, str | None]] = []  # (scores, variant, column header or None=Avg)
        if self.baseline_label is not None:
            for scores in self.scores:
                for variant in dict.fromkeys(v for _, v in scores.rows):
                    suffix = f" [{variant}]" if variant else ""
                    for column in scores.columns:
                        prr_columns.append((scores, variant, column.header))
                        header.append(f"{column.header}{suffix}")
                    prr_columns.append((scores, variant, None))
                    header.append(f"{scores.name} Avg{suffix}")
        else:
            notes.append("PRR (performance retention) needs a baseline: lit-embed report ... --baseline RUN_DIR")
        header += ["#Total Params", "#Emb Params", "PCR (All)", "PCR (Emb)", "PoEP"]
        base = self._parameters(self.baseline_label) if self.baseline_label else None
        if self.baseline_label and base is None:
            notes.append(f"baseline {self.baseline_label!r} has no parameter counts: PCR against each run's dense strategy")
        rows = []
        for label in labels:
            cells = [label]
            for scores, variant, column in prr_columns:
                cells.append(self._prr_cell(scores, (label, variant), (self.baseline_label, variant), column, notes))
            params = self._parameters(label)
            if base is not None:
                figures = compression(params["embedding_params"], params["total_params"],
                                      base["embedding_params"], base["total_params"])
            else:
                figures = params
            cells += [human(params["total_params"]), human(params["embedding_params"]),
                      _percent(figures["pcr_all"]), _percent(figures["pcr_emb"]), _percent(figures["poep"])]
            rows.append(cells)
        against = f"the baseline {self.baseline_label!r}" if base else "the dense strategy on each run's backbone and vocabulary"
        notes.append(f"PCR against {against}; PRR, PCR and PoEP in %")
        return Table("Memory efficiency and performance retention (%)", header, rows, notes)

    def _prr_cell(self, scores: BenchmarkScores, row: RowKey, base_row: RowKey, column: str | None, notes: list) -> str:
        if column is None:
            mine, theirs = scores.average(row)[0], scores.average(base_row)[0]
        else:
            mine, theirs = scores.mean(row, column), scores.mean(base_row, column)
        if mine is None or not theirs:
            if theirs is None and row != base_row:
                note = f"baseline {_row_name(base_row)!r} has no {column or scores.name + ' Avg'} result: no PRR"
                if note not in notes:
                    notes.append(note)
            return MISSING
        return f"{100 * mine / theirs:.{self.digits}f}"

    def _parameters(self, label: str) -> dict | None:
        return next((r["parameters"] for r in self.runs if r["label"] == label and r.get("parameters")), None)

    # -- speed (HashFormers Table 3) -------------------------------------------------------------
    def speed_table(self) -> Table | None:
        groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for run in self.runs:
            if run.get("efficiency"):
                groups[(run["label"], run.get("task") or PRETRAINING)].append(run)
        if not groups:
            return None
        notes: list[str] = []
        unknown: list[str] = []  # speed-ups whose runs recorded no load
        header = ["Model", "Runs", "Train (ms/sample)", "Infer (ms/sample)", "Peak memory (MB)", "Device", "Load/core"]
        if self.baseline_label is not None:
            header[3:3] = ["Train speed-up"]
            header[5:5] = ["Infer speed-up"]
        rows = []
        for (label, phase), runs in groups.items():
            times = {kind: _mean_time(runs, kind) for kind in ("train", "infer")}
            devices = sorted({r["efficiency"].get("device", "?") for r in runs})
            peaks = [r["efficiency"]["peak_memory_mb"] for r in runs if r["efficiency"].get("peak_memory_mb")]
            load = _mean_load(runs)
            cells = [f"{label} ({phase})", str(len(runs)), _time(times["train"]), _time(times["infer"]),
                     f"{max(peaks):.0f}" if peaks else MISSING, ", ".join(devices), MISSING if load is None else f"{load:.2f}"]
            if self.baseline_label is not None:
                base_runs = groups.get((self.baseline_label, phase))
                mark = ""
                if not base_runs:
                    notes.append(f"baseline {self.baseline_label!r} has no {phase} run: no speed-up for {label}")
                elif sorted({r["efficiency"].get("device", "?") for r in base_runs}) != devices:
                    notes.append(f"{label} ({phase}) and the baseline ran on different devices: its speed-ups compare machines")
                elif label != self.baseline_label:
                    mark = _load_mark(f"{label} ({phase})", load, _mean_load(base_runs), notes, unknown)
                for kind, index in (("train", 3), ("infer", 5)):
                    base = _mean_time(base_runs or [], kind)
                    mine = times[kind]
                    cells.insert(index, f"{base / mine:.1f}x{mark}" if base and mine else MISSING)
            rows.append(cells)
        notes.append("time per sample: training = forward + backward, inference = forward; warm-up steps excluded; "
                     "under DDP the mean time one device spends per sample; load/core: the machine's 1-minute load "
                     "average over its cores, the mean of its readings at each run's start and end")
        if unknown:
            notes.append(f"no load recorded (results written before lit-embed recorded it) for {', '.join(unknown)} or "
                         f"the baseline: whether those speed-ups compare like loads is not known")
        return Table("Training and inference speed", header, rows, notes)

    # -- other metrics ---------------------------------------------------------------------------
    def metrics_table(self, title: str, runs: list[dict]) -> Table | None:
        """Every evaluation metric of ``runs`` by (label, task): pre-training and tasks outside the benchmarks; for a
        task with an uncompressed model among the runs (:meth:`references`), the PRR of each row's score against it."""
        groups: dict[tuple[str, str | None], list[dict]] = defaultdict(list)
        for run in runs:
            groups[(run["label"], run.get("task"))].append(run)
        names = sorted({m for r in runs for m in r.get("metrics", {}) if m.split("/")[0] in SPLITS})
        if not names:
            return None
        scores = {metric for run in runs for metric in run.get("scores") or ()}
        scaled = [name for name in names if is_score(name, scores)]
        references = self.references(runs)
        rows = []
        for (label, task), members in groups.items():
            cells = [f"{label} ({task or PRETRAINING})"]
            for name in names:
                values = [r["metrics"][name] for r in members if name in r.get("metrics", {})]
                if not values:
                    cells.append(MISSING)
                else:
                    cells.append(self._score_cell(*mean_std(values)) if name in scaled else logged_text(*mean_std(values)))
            if references:
                reference = references.get(task) if task else None
                cells.append(self._task_prr(members, groups.get((reference, task)) if reference else None))
            rows.append(cells)
        note = f"x 100: {', '.join(scaled)}; the others as logged" if scaled else "as logged"
        notes = [f"{note}; mean ± std over seeds"]
        if references:
            notes.append("PRR (%): the task's score (test split where logged, else validation; mean over seeds) over its "
                         "uncompressed model's: " + ", ".join(f"{task}: {label}" for task, label in references.items()))
        return Table(title, ["Model", *names, *(["PRR"] if references else [])], rows, notes)

    def references(self, runs: list[dict]) -> dict[str, str]:
        """Each task's uncompressed model among ``runs``: the baseline's label where it ran the task, else the one label
        whose runs of the task hold the dense table (:data:`UNCOMPRESSED`); none where there are several."""
        found: dict[str, set[str]] = defaultdict(set)
        for run in runs:
            task = run.get("task")
            if task and (run["label"] == self.baseline_label or run.get("strategy") == UNCOMPRESSED):
                found[task].add(run["label"])
        return {task: self.baseline_label if self.baseline_label in labels else next(iter(labels))
                for task, labels in found.items() if self.baseline_label in labels or len(labels) == 1}

    def _task_prr(self, members: list[dict], reference: list[dict] | None) -> str:
        mine = [found[0] for r in members if (found := _score(r, ("score",))) is not None]
        theirs = [found[0] for r in reference or () if (found := _score(r, ("score",))) is not None]
        if not mine or not theirs or not statistics.fmean(theirs):
            return MISSING
        return f"{100 * statistics.fmean(mine) / statistics.fmean(theirs):.{self.digits}f}"

    # -- the zoo's picture -----------------------------------------------------------------------
    def seed_scores(self) -> tuple[dict[str, dict], str]:
        """Each row's task score per seed, the mean over its columns (a benchmark's every column, as its average; a
        task outside the benchmarks: the metric its table shows), over the seeds that ran them all; and what it is."""
        columns: dict[str, dict[tuple, dict]] = defaultdict(dict)
        shown: list[str] = []
        for scores in self.scores:
            for row in scores.rows:
                cells = [scores.cells.get((row, c.header)) for c in scores.columns]
                if all(cells):
                    columns[_row_name(row)].update({(scores.name, c.header): seeds for c, seeds in zip(scores.columns, cells)})
            shown.append(f"{scores.name} average")
        for run in self.runs:
            task = run["_task"]
            if task is None or benchmark_of(task) is not None:
                continue
            metric = TASKS[task].shown_metric(run.get("paper")) if task in TASKS else "score"
            found = _score(run, (metric,))
            if found is not None:
                columns[run["label"]].setdefault((task,), {})[run.get("seed")] = found[0]
                shown.append(f"{task} {metric}")
        result = {}
        for name, cells in columns.items():
            seeds = set.intersection(*(set(seeds) for seeds in cells.values()))
            result[name] = {seed: statistics.fmean(c[seed] for c in cells.values()) for seed in seeds}
        kinds = list(dict.fromkeys(shown))
        return result, kinds[0] if len(kinds) == 1 else "mean task score"

    # -- all -------------------------------------------------------------------------------------
    def tables(self) -> list[Table]:
        tables = [self.score_table(s) for s in self.scores]
        others = [r for r in self.runs if r["_task"] and benchmark_of(r["_task"]) is None]
        pretraining = [r for r in self.runs if r["_task"] is None]
        tables += [
            self.metrics_table("Other tasks: final metrics", others),
            self.memory_table(),
            self.speed_table(),
            self.metrics_table("Pre-training: final metrics", pretraining),
        ]
        return [t for t in tables if t is not None]

    def _score_cell(self, mean: float, spread: float | None) -> str:
        return score_text(mean, spread, self.digits)


def _score(run: dict, metrics: tuple[str, ...]) -> tuple[float, str] | None:
    """The first of ``metrics`` the run logged, on the test split if it has it, else validation."""
    logged = run.get("metrics", {})
    for split in SPLITS:
        for metric in metrics:
            if f"{split}/{metric}" in logged:
                return logged[f"{split}/{metric}"], split
    return None


def _row_name(row: RowKey) -> str:
    label, variant = row
    return f"{label} [{variant}]" if variant else label


def _split_note(scores: BenchmarkScores) -> str:
    used = set().union(*scores.splits.values()) if scores.splits else set()
    if used == {"test"}:
        return "scores on the test split"
    if used == {"val"}:
        return "scores on the validation split (no test metrics were logged)"
    on_val = sorted({f"{_row_name(row)} / {header}" for (row, header), s in scores.splits.items() if "val" in s})
    return "test split where logged, else validation: " + ", ".join(on_val) + " use validation"


def _percent(fraction: float) -> str:
    value = 100 * fraction
    return f"{value:.2f}" if 0 < abs(value) < 1 else f"{value:.1f}"


def _mean_load(runs: list[dict]) -> float | None:
    """The mean load per core over ``runs``' timings; ``None`` where one of them recorded none."""
    loads = [load_per_core(r["efficiency"].get("load")) for r in runs]
    return None if not loads or None in loads else statistics.fmean(x for x in loads if x is not None)


def _load_mark(row: str, mine: float | None, theirs: float | None, notes: list[str], unknown: list[str]) -> str:
    """"†" where a speed-up's two runs ran at loads more than :data:`LOAD_MARGIN` per core apart (said in ``notes``);
    ``row`` joins ``unknown`` where either recorded none."""
    differ = loads_differ(mine, theirs)
    if differ is None:
        unknown.append(row)
    if not differ:
        return ""
    notes.append(f"† {row} ran at a load of {mine:.2f} per core, the baseline at {theirs:.2f}, more than {LOAD_MARGIN} "
                 f"apart: its speed-ups measure the machine's other work as well as the methods")
    return "†"


def _mean_time(runs: list[dict], kind: str) -> float | None:
    times = [t for r in runs if (t := ((r["efficiency"].get(kind) or {}).get("ms_per_sample")))]
    return statistics.fmean(times) if times else None


def _time(value: float | None) -> str:
    return MISSING if value is None else f"{value:.3g}"


def run_and_sweep_folders(paths: list[str]) -> tuple[list[Path], list[Path]]:
    """The run folders and the sweep folders (``lit-embed sweep``'s, holding ``sweep.json``) among ``paths`` and
    in them: a sweep is reported as its plan says (the chosen grid points), not as the run folders it holds."""
    runs: list[Path] = []
    sweeps: list[Path] = []
    for name in paths:
        path = Path(name)
        if is_sweep_folder(path):
            sweeps.append(path)
            continue
        nested = sorted(p.parent for p in path.rglob(MANIFEST) if is_sweep_folder(p.parent)) if path.is_dir() else []
        if not nested:
            compressed_only = path.is_dir() and not any(path.rglob(RESULTS_FILE)) and any(path.rglob("report.json"))
            runs += [] if compressed_only else find_run_dirs([name])  # compress outputs alone: their coverage tables
            continue
        sweeps += nested
        runs += [p.parent for p in sorted(path.rglob(RESULTS_FILE))
                 if not any(sweep in p.parents for sweep in nested)]
    return runs, list(dict.fromkeys(sweeps))


def left_out_table(runs: list[dict]) -> list[Table]:
    """The runs that did not complete (diverged, interrupted, untested), each with its status and why: in no table."""
    if not runs:
        return []
    rows = [[run["run_dir"], run["label"], run.get("task") or PRETRAINING, str(run.get("seed")), status_of(run),
             run.get("detail") or f"stopped at step {run.get('global_step')}"] for run in runs]
    return [Table("Runs left out: they did not complete", ["Run", "Model", "Task", "Seed", "Status", "Why"], rows,
                  ["diverged: its loss or weights were not finite; interrupted: a signal stopped it (--ckpt_path last "
                   "resumes it); untested: its fit finished, its test did not run"])]


def compress_reports(paths: list[str]) -> list[dict]:
    """The ``report.json`` of every ``lit-embed compress`` output of a task under ``paths``."""
    reports = []
    for path in paths:
        for file in sorted(Path(path).rglob("report.json")):
            report = json.loads(file.read_text())
            if isinstance(report, dict) and report.get("task") and "retention" in report:
                reports.append(report)
    return reports


def _task_headers(tasks: list[str]) -> list[str]:
    return [TASKS[t].header or t.upper() if t in TASKS else t for t in tasks]


def coverage_tables(reports: list[dict]) -> list[Table]:
    """Sparse-coding Tables 5 and 6: token and sentence coverage of each task's test data by V_C, one row per
    retention, from ``lit-embed compress`` outputs' reports; means over outputs."""
    cells: dict[tuple[float, str], list[dict]] = defaultdict(list)
    for report in reports:
        if report.get("coverage"):
            cells[(report["retention"], report["task"])].append(report["coverage"])
    if not cells:
        return []
    tasks = list(dict.fromkeys(task for _, task in sorted(cells, key=lambda key: key[1])))
    tables = []
    for kind, title in (("tokens", "Token coverage of the test data by V_C (%)"),
                        ("sentences", "Sentence coverage of the test data only by V_C (%)")):
        rows = [[f"{retention:g}", *(f"{100 * statistics.mean(c[kind] for c in cells[(retention, t)]):.2f}"
                                     if (retention, t) in cells else MISSING for t in tasks)]
                for retention in sorted({r for r, _ in cells})]
        tables.append(Table(title, ["r(V_C)", *_task_headers(tasks)], rows,
                            ["from lit-embed compress outputs; a sentence is an example"]))
    return tables


#: How the report names the paper's methods, as Table 9 does (any other method: its ``--method`` name).
METHOD_NAMES = {"unk": "<unk>", "sparse_coding": "sparse coding", "pca": "PCA", "aq": "AQ"}
#: The token sets of a method that rebuilds common rows too (AQ), in Table 9's order.
TOKEN_SETS = (("all", "(V_C ∪ V_R)"), ("common", "(V_C)"), ("rare", "(V_R)"))


def method_name(report: dict) -> str:
    """A compress output's method as the user chose it: its ``--method`` (Table 9's name for the paper's methods), and
    for ``fit`` the strategy it fitted, with its config's name where that says more than the class (``dpq_vq`` beside
    ``DPQEmbedding``; ``robe`` says nothing ``ROBEEmbedding`` does not). The strategy class alone would merge methods:
    int8 and int4 are one class, svd and a fitted ALBERT factorisation another, DPQ-SX and DPQ-VQ a third."""
    fitted = (report.get("details") or {}).get("strategy") if report["method"] == "fit" else None
    given = (report.get("options") or {}).get("strategy") if fitted else None
    config = Path(given).stem if isinstance(given, str) else None
    if config and fitted and config.replace("_", "").lower() in fitted.lower():
        config = None
    return " ".join(part for part in (METHOD_NAMES.get(report["method"], report["method"]), fitted, config) if part)


def compressed_method(run: dict) -> str | None:
    """The method (:func:`method_name`) of the ``lit-embed compress`` output a run started from: the output that holds
    the run's folder (its config.yaml logs its test runs there), or the one whose ``model.ckpt`` the run tested
    (``--ckpt_path``) or fine-tuned (``model.init_args.checkpoint``; a path as given, read from where the report runs);
    ``None`` for any other run."""
    config = run.get("config") or {}
    started = [config.get("ckpt_path"), (((config.get("model") or {}).get("init_args")) or {}).get("checkpoint")]
    folders = [Path(run["run_dir"]).parent] if run.get("run_dir") else []
    folders += [Path(path).parent for path in started if isinstance(path, str) and path.endswith(".ckpt")]
    for file in (folder / "report.json" for folder in folders):
        try:
            report = json.loads(file.read_text())
        except (OSError, ValueError):  # none there, or another tool's: not a compress output
            continue
        if isinstance(report, dict) and isinstance(report.get("method"), str):
            return method_name(report)
    return None


def _method_row(report: dict) -> str:
    """A compress output's method as a row: its name (:func:`method_name`) and the budget it was given (one method at
    two budgets is two rows)."""
    budget = (report.get("options") or {}).get("budget")
    return " ".join(part for part in (method_name(report), None if budget is None else f"budget={budget}") if part)


def cosine_tables(reports: list[dict]) -> list[Table]:
    """Sparse-coding Table 9: the mean cosine similarity of rebuilt to original embeddings (x 100), one table per
    retention, a column per task, a row per method and k (every k an output tried). A method that keeps the common
    rows exactly (``<unk>``, sparse coding, PCA) is shown on the rare rows it rebuilds; one that rebuilds them all
    (AQ) on all, common and rare rows. Cells are means over the outputs (seeds) of a task."""
    cells: dict[tuple[float, str, str], list[float]] = defaultdict(list)
    for report in reports:
        by_k = report.get("cosine_by_k") or {"": report.get("cosine")}
        for k, cosine in by_k.items():
            if not cosine:
                continue
            name = " ".join(part for part in (_method_row(report), f"k={k}" if k else "") if part)
            sets = (("rare", ""),) if cosine.get("common_rows_identical") else TOKEN_SETS
            for kind, suffix in sets:
                if cosine.get(kind) is not None:
                    row = " ".join(part for part in (name, suffix) if part)
                    cells[(report["retention"], row, report["task"])].append(cosine[kind])
    tables = []
    for retention in sorted({r for r, _, _ in cells}):
        keys = [key for key in cells if key[0] == retention]
        tasks = sorted({task for _, _, task in keys})
        rows = list(dict.fromkeys(row for _, row, _ in sorted(keys, key=_cosine_row_order)))
        body = [[row, *(f"{100 * statistics.mean(cells[(retention, row, t)]):.2f}" if (retention, row, t) in cells
                        else MISSING for t in tasks)] for row in rows]
        tables.append(Table(f"Cosine similarity of the rebuilt embeddings to the original ones, r(V_C) = {retention:g} "
                            f"(x 100)", ["", *_task_headers(tasks)], body,
                            ["from lit-embed compress outputs: the rare tokens' rows where a method keeps the common "
                             "ones exactly, else all, common (V_C) and rare (V_R) rows"]))
    return tables


def _cosine_row_order(key: tuple[float, str, str]) -> tuple:
    """Table 9's order: <unk>, sparse coding, PCA, AQ and other methods, each by its k."""
    row = key[1]
    first = ["<unk>", "sparse coding", "PCA", "AQ"]
    rank = next((i for i, start in enumerate(first) if row.startswith(start)), len(first))
    k = row.split("k=", 1)[1].split()[0] if "k=" in row else ""
    return rank, row.split("k=")[0], int(k) if k.isdigit() else -1, row
