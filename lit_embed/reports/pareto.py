"""The zoo's picture (``lit-embed report --figure``): task score against the embedding's bytes, one line per method.

A point is a model (a report row: a label) that ran a task: the bytes its embedding needs at inference (results.json's
``embedding_bytes``: each tensor at its stored dtype, codes as stored) and its score over seeds, the mean over its
tasks of the metric the score tables show (test split where logged, else validation), as those tables average a
benchmark. A method is what the user chose: the ``lit-embed compress`` method a run tested (``int8`` and ``int4`` are
two, though one strategy class; ``fit`` by the strategy it fitted), else its strategy (results.json's ``strategy``); with
the variant a sweep stage's label names (``post-hoc``: fitted to a pretrained table, not pre-trained): its points at
different budgets make its line.

Models of two paths are never compared: those pre-trained from scratch and those compressed post hoc from one
pretrained model (a ``post-hoc`` variant) each get a panel, a frontier, and their uncompressed model (the dense
table's points of that path) as a reference line; chance is drawn where the task's metric is accuracy. A point is on
its path's frontier unless a point of that path with no more bytes beats it beyond the seeds' noise
(:func:`beats`: a one-sided paired t-test over the seeds both ran, p < :data:`ALPHA`); a frontier point that a
cheaper frontier point cannot be told from is a tie, drawn and listed as one. The error bars are ± one sample
standard deviation over seeds. Each method has one colour and one marker in every panel.

matplotlib is imported only to draw, with the Agg backend (no display); the PNG is written atomically and the same
image goes to a TensorBoard event file beside it.
"""

from __future__ import annotations

import io
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lit_embed.measures.tables import MISSING, Table, mean_std
from lit_embed.reports.papers import compressed_method
from lit_embed.storage.files import write_atomic, writing

NOT_MEASURED = "not measured"
#: The tag of the figure in TensorBoard.
TAG = "report/pareto"
#: A marker per method besides its colour: the zoo has more methods than one palette's colours.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p", "8", "d")
#: The paths, in panel order: models pre-trained from scratch, and models compressed post hoc from a pretrained one.
PRETRAINED, POST_HOC = "pre-trained", "post hoc"
#: The word of a sweep stage's label that puts its runs on the post-hoc path.
POST_HOC_WORD = "post-hoc"
#: The compress method that fits a strategy to a table: its method is named ``fit STRATEGY``.
FIT = "fit"
#: A point beats another when a one-sided paired t-test over their common seeds gives p below this.
ALPHA = 0.05
#: The methods of a path's uncompressed model: the dense strategy, and compress's ``dense`` (the table kept as it is).
DENSE = ("DenseEmbedding", "dense")


@dataclass(frozen=True)
class Point:
    """One model of the figure: its method's line, its row name, its embedding's inference bytes, its score per seed,
    its path, and the efficiency of its task runs (means over them; ``None`` where none recorded it)."""

    method: str
    label: str
    bytes: int
    scores: dict[int | None, float]
    path: str = PRETRAINED
    memory_mb: float | None = None
    train_ms: float | None = None
    infer_ms: float | None = None

    @property
    def mean(self) -> float:
        return statistics.fmean(self.scores.values())

    @property
    def std(self) -> float:
        """The sample standard deviation over seeds (0 for one seed: no bar)."""
        return mean_std(list(self.scores.values()))[1] or 0.0

    @property
    def reference(self) -> bool:
        """Whether this is its path's uncompressed model (the dense table)."""
        return self.method.split(" ")[0] in DENSE


def beats(q: Point, p: Point) -> bool:
    """Whether ``q`` scores higher than ``p`` beyond the seeds' noise: over the seeds both ran (at least two), the
    differences q - p have a positive mean that a one-sided paired t-test finds at p < :data:`ALPHA` (all equal and
    positive: beyond noise; fewer than two common seeds: no noise to judge by, so never)."""
    common = sorted(set(q.scores) & set(p.scores), key=str)
    if len(common) < 2:
        return False
    differences = [q.scores[s] - p.scores[s] for s in common]
    mean, spread = statistics.fmean(differences), statistics.stdev(differences)
    if spread == 0:
        return mean > 0
    from scipy.stats import t

    return bool(t.sf(mean / (spread / math.sqrt(len(common))), len(common) - 1) < ALPHA)


def frontier(points: list[Point]) -> list[Point]:
    """The points no point of their path with as many bytes or fewer beats beyond noise (:func:`beats`), by path and
    bytes."""
    def dominated(p: Point) -> bool:
        return any(q is not p and q.path == p.path and q.bytes <= p.bytes and beats(q, p) for q in points)

    return sorted((p for p in points if not dominated(p)), key=lambda p: (PATHS.index(p.path), p.bytes, -p.mean))


def ties(points: list[Point]) -> dict[str, list[str]]:
    """Each frontier point's cheaper frontier points of its path that it does not beat beyond noise (by label): where
    there are any, its place on the frontier is a tie, not a measured gain."""
    best = frontier(points)
    return {p.label: [q.label for q in best if q.path == p.path and q.bytes < p.bytes and not beats(p, q)] for p in best}


PATHS = (PRETRAINED, POST_HOC)


def points_of(runs: list[dict], scores: dict[str, dict[int | None, float]]) -> list[Point]:
    """A point per label that has ``scores`` (label -> seed -> score), from its task runs' results.json."""
    found = []
    for label, by_seed in scores.items():
        mine = [r for r in runs if r["label"] == label and r.get("_task")]
        counted = [r["parameters"]["embedding_bytes"] for r in mine if (r.get("parameters") or {}).get("embedding_bytes")]
        if not by_seed or not counted:
            continue
        efficiency = [r["efficiency"] for r in mine if r.get("efficiency")]
        method = _method(mine, label)
        found.append(Point(
            method=method, label=label, bytes=counted[0], scores=dict(by_seed),
            path=POST_HOC if POST_HOC_WORD in f"{method} {label}".split(" ") else PRETRAINED, memory_mb=_mean(e.get("peak_memory_mb") for e in efficiency),
            train_ms=_mean((e.get("train") or {}).get("ms_per_sample") for e in efficiency),
            infer_ms=_mean((e.get("infer") or {}).get("ms_per_sample") for e in efficiency),
        ))
    return sorted(found, key=lambda p: (PATHS.index(p.path), p.method, p.bytes))


def _method(runs: list[dict], label: str) -> str:
    """A point's line: the compress method its runs tested (:func:`~lit_embed.reports.papers.compressed_method`: ``int4``,
    ``fit ROBEEmbedding``), else its strategy; and the variant a sweep stage's label names (``QREmbedding post-hoc``)."""
    compressed = next((method for r in runs if (method := compressed_method(r))), None)
    strategy = compressed or next((r["strategy"] for r in runs if r.get("strategy")), label)
    variant = next((r["variant"] for r in runs if r.get("variant")), "")
    return f"{strategy} {variant}" if variant else strategy


def _mean(values) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.fmean(found) if found else None


def chance(runs: list[dict]) -> float | None:
    """The accuracy of guessing one of the task's labels at random, where every scored run is of one classification
    task shown by accuracy (``None`` otherwise: no line drawn)."""
    from lit_embed.data.tasks import TASKS

    tasks = {r["_task"] for r in runs if r.get("_task")}
    task = TASKS.get(next(iter(tasks))) if len(tasks) == 1 else None
    if task is None or not task.labels or task.shown_metric(None) != "accuracy":
        return None
    return 1 / len(task.labels)


def references(points: list[Point]) -> dict[str, Point]:
    """Each path's uncompressed model (its dense table's point; the cheapest where there are several)."""
    found: dict[str, Point] = {}
    for p in sorted((p for p in points if p.reference), key=lambda p: p.bytes):
        found.setdefault(p.path, p)
    return found


def pareto_table(points: list[Point], what: str, digits: int = 1, guess: float | None = None) -> Table:
    """Per path, method and budget: the embedding's inference bytes (and their share of the uncompressed model's),
    score, PRR against the uncompressed model, frontier (or tie), memory and time per sample."""
    tied, best, base = ties(points), {p.label for p in frontier(points)}, references(points)

    def frontier_cell(p: Point) -> str:
        if p.label not in best:
            return MISSING
        return f"tie with {', '.join(tied[p.label])}" if tied[p.label] else "yes"

    rows = []
    for p in points:
        ref = base.get(p.path)
        rows.append([p.path, p.method, p.label, f"{p.bytes:,}", MISSING if ref is None else f"{100 * p.bytes / ref.bytes:.3g}%",
                     _score(p, digits), MISSING if ref is None or not ref.mean else f"{p.mean / ref.mean:.3f}",
                     str(len(p.scores)), frontier_cell(p), _measured(p.memory_mb, ".0f"), _measured(p.train_ms, ".3g"),
                     _measured(p.infer_ms, ".3g")])
    missing = [path for path in dict.fromkeys(p.path for p in points) if path not in base]
    notes = [f"score: {what} x 100, mean ± std over seeds (the figure's error bars: ± one std)"
             + ("" if guess is None else f"; chance {100 * guess:.1f}"),
             "bytes: the embedding's at inference; % of dense and PRR (score / score) against the path's uncompressed "
             "model" + (f"; {' and '.join(missing)} has no uncompressed model among the runs: –" if missing else ""),
             f"frontier: no model of the same path with as few bytes or fewer beats it beyond the seeds' noise (a one-sided "
             f"paired t-test over their common seeds, p < {ALPHA}; with fewer than two common seeds nothing is beyond noise); "
             f"tie: a cheaper frontier model it does not beat beyond noise; paths are never compared",
             "memory (peak, MB) and time per sample (training: forward + backward; inference: forward) from the task runs' "
             f"efficiency callback, means over them; {NOT_MEASURED} where no run recorded it"]
    return Table("Pareto: task score against embedding bytes", ["Path", "Method", "Model", "Emb bytes", "% of dense",
                 "Score", "PRR", "Seeds", "Frontier", "Memory (MB)", "Train ms/sample", "Infer ms/sample"], rows, notes)


def _score(point: Point, digits: int) -> str:
    mean, std = mean_std([100 * s for s in point.scores.values()])
    return f"{mean:.{digits}f}" + ("" if std is None else f" ± {std:.{digits}f}")


def _measured(value: float | None, spec: str) -> str:
    return NOT_MEASURED if value is None else format(value, spec)


def styles(points: list[Point]) -> dict[str, tuple[tuple, str]]:
    """One colour and one marker per method, the same in every panel (a strategy's post-hoc line takes its colour)."""
    from matplotlib import colormaps

    tab20 = colormaps["tab20"]
    palette = [tuple(tab20(i)) for i in (*range(0, tab20.N, 2), *range(1, tab20.N, 2))]  # dark hues, then light ones
    shown = kinds(points)
    order = list(dict.fromkeys(sorted(shown.values())))
    return {method: (palette[order.index(kind) % len(palette)], MARKERS[order.index(kind) % len(MARKERS)])
            for method, kind in shown.items()}


def kinds(points: list[Point]) -> dict[str, str]:
    """Each method's name in the legend, which sets its colour and marker: a strategy's whether pre-trained or fitted
    post hoc (``fit ROBEEmbedding post-hoc`` is ``ROBEEmbedding``). A fit names the config it fitted where that says
    more than the class (``subspace_3``); a pre-trained run records its class only, so it takes the name of its class's
    one fitted config, or stays the class where several were fitted (DPQ beside ``DPQEmbedding dpq_vq``)."""
    split: dict[str, tuple[str, str | None]] = {}  # method -> (class or method, fitted config's name; None: not a fit)
    for p in points:
        words = [word for word in p.method.split(" ") if word != POST_HOC_WORD]
        fitted = len(words) > 1 and words[0] == FIT
        split[p.method] = (words[1], " ".join(words[2:])) if fitted else (" ".join(words), None)
    configs: dict[str, set[str]] = {}
    for name, config in split.values():
        if config is not None:
            configs.setdefault(name, set()).add(config)

    def shown(name: str, config: str | None) -> str:
        fitted = configs.get(name, set())
        config = config if config is not None else next(iter(fitted)) if len(fitted) == 1 else ""
        return f"{name} {config}" if config else name

    return {method: shown(*parts) for method, parts in split.items()}


def draw(points: list[Point], what: str, guess: float | None = None):
    """The figure: a panel per path; in each, a line per method (its points by bytes, ± one std over seeds), the
    uncompressed model's score as a line with its ± one std band, chance, and the frontier ringed and joined (ties
    ringed in grey)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a report runs in batch jobs and tests
    from matplotlib.figure import Figure

    paths = [path for path in PATHS if any(p.path == path for p in points)]
    figure = Figure(figsize=(9 if len(paths) == 1 else 15, 5.5), layout="constrained")
    panels = figure.subplots(1, len(paths), squeeze=False, sharey=True)[0]
    style, shown, tied, base = styles(points), kinds(points), ties(points), references(points)
    for axes, path in zip(panels, paths):
        mine = [p for p in points if p.path == path]
        for method in dict.fromkeys(p.method for p in mine):
            line = sorted((p for p in mine if p.method == method), key=lambda p: p.bytes)
            colour, marker = style[method]
            axes.errorbar([p.bytes for p in line], [100 * p.mean for p in line], yerr=[100 * p.std for p in line],
                          color=colour, marker=marker, markersize=5, capsize=3, linewidth=1.2, label=shown[method])
        ref = base.get(path)
        if ref is not None:
            axes.axhline(100 * ref.mean, color="grey", linewidth=1, label="uncompressed")
            axes.axhspan(100 * (ref.mean - ref.std), 100 * (ref.mean + ref.std), color="grey", alpha=0.12)
        if guess is not None:
            axes.axhline(100 * guess, color="grey", linestyle=":", linewidth=1, label="chance")
        best = [p for p in frontier(points) if p.path == path]
        axes.plot([p.bytes for p in best], [100 * p.mean for p in best], linestyle="--", color="black", linewidth=0.8,
                  label="frontier")
        for p in best:
            axes.plot([p.bytes], [100 * p.mean], marker="o", markersize=11, markerfacecolor="none",
                      markeredgecolor="grey" if tied[p.label] else "black", linestyle="none")
        axes.set_xscale("log")
        axes.set_xlabel("embedding bytes at inference (log scale)")
        axes.set_title(f"{path}" + ("" if ref is not None else " (no uncompressed model among the runs)"))
        axes.grid(True, which="both", alpha=0.3)
    panels[0].set_ylabel(f"{what} x 100")
    handles: dict[str, Any] = {}
    for axes in panels:
        for handle, label in zip(*axes.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    figure.suptitle("Task score against embedding bytes, per path (mean ± std over seeds; grey rings: ties)")
    figure.legend(handles=list(handles.values()), labels=list(handles), fontsize=8, loc="outside right center")
    return figure


def save(figure, path: Path, dpi: int = 110) -> None:
    """Write ``figure`` to ``path`` (a PNG, atomically), then the same image to a TensorBoard event file of its own in
    the PNG's folder (a full disk named through :func:`writing`)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=dpi)
    png = image.getvalue()
    write_atomic(path, png)
    width, height = (round(v) for v in figure.get_size_inches() * dpi)
    summary = Summary(value=[Summary.Value(tag=TAG, image=Summary.Image(height=height, width=width, colorspace=4,
                                                                      encoded_image_string=png))])
    with writing(path.parent):
        writer = EventFileWriter(str(path.parent))
        try:
            writer.add_event(Event(wall_time=time.time(), step=0, summary=summary))
        finally:
            writer.close()
