"""The zoo's picture (``lit-embed report --figure``): task score against the embedding's bytes, one line per method.

A point is a model (a report row: a label) that ran a task: the bytes its embedding needs at inference (results.json's
``embedding_bytes``: each tensor at its stored dtype, codes as stored) and its
score over seeds, the mean over its tasks of the metric the score tables show (test split where logged, else
validation), as those tables average a benchmark. A method is a strategy (results.json's ``strategy``), with the
variant a sweep stage's label names (``post-hoc``: fitted to a pretrained table, not pre-trained): its points at
different budgets make its line. A point is on the frontier when no other point scores at least as well with at most
as many bytes (and better in one). The error bars are ± one sample standard deviation over seeds.

matplotlib is imported only to draw, with the Agg backend (no display); the PNG is written atomically and the same
image goes to a TensorBoard event file beside it.
"""

from __future__ import annotations

import io
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from lit_embed.files import write_atomic, writing
from lit_embed.tables import MISSING, Table, mean_std

NOT_MEASURED = "not measured"
#: The tag of the figure in TensorBoard.
TAG = "report/pareto"
#: A marker per method besides its colour: the zoo has more methods than matplotlib's ten colours.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p", "8", "d")


@dataclass(frozen=True)
class Point:
    """One model of the figure: its method's line, its row name, its embedding's inference bytes, its score per seed, and
    the efficiency of its task runs (means over them; ``None`` where none recorded it)."""

    method: str
    label: str
    bytes: int
    scores: dict[int | None, float]
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


def frontier(points: list[Point]) -> list[Point]:
    """The points no other point dominates (as many bytes or fewer and as high a mean score or higher, better
    in one), by bytes."""
    def dominated(p: Point) -> bool:
        return any(q.bytes <= p.bytes and q.mean >= p.mean and (q.bytes, q.mean) != (p.bytes, p.mean)
                   for q in points)

    return sorted((p for p in points if not dominated(p)), key=lambda p: (p.bytes, -p.mean))


def points_of(runs: list[dict], scores: dict[str, dict[int | None, float]]) -> list[Point]:
    """A point per label that has ``scores`` (label -> seed -> score), from its task runs' results.json."""
    found = []
    for label, by_seed in scores.items():
        mine = [r for r in runs if r["label"] == label and r.get("_task")]
        counted = [r["parameters"]["embedding_bytes"] for r in mine if (r.get("parameters") or {}).get("embedding_bytes")]
        if not by_seed or not counted:
            continue
        efficiency = [r["efficiency"] for r in mine if r.get("efficiency")]
        found.append(Point(
            method=_method(mine, label), label=label, bytes=counted[0],
            scores=dict(by_seed), memory_mb=_mean(e.get("peak_memory_mb") for e in efficiency),
            train_ms=_mean((e.get("train") or {}).get("ms_per_sample") for e in efficiency),
            infer_ms=_mean((e.get("infer") or {}).get("ms_per_sample") for e in efficiency),
        ))
    return sorted(found, key=lambda p: (p.method, p.bytes))


def _method(runs: list[dict], label: str) -> str:
    """A point's line: its strategy, and the variant a sweep stage's label names (``QREmbedding post-hoc``)."""
    strategy = next((r["strategy"] for r in runs if r.get("strategy")), label)
    variant = next((r["variant"] for r in runs if r.get("variant")), "")
    return f"{strategy} {variant}" if variant else strategy


def _mean(values) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.fmean(found) if found else None


def pareto_table(points: list[Point], what: str, digits: int = 1) -> Table:
    """Per method and budget: the embedding's inference bytes, score, whether on the frontier, memory and time per sample."""
    best = {p.label for p in frontier(points)}
    rows = [[p.method, p.label, f"{p.bytes:,}", _score(p, digits), str(len(p.scores)), "yes" if p.label in best else MISSING,
             _measured(p.memory_mb, ".0f"), _measured(p.train_ms, ".3g"), _measured(p.infer_ms, ".3g")] for p in points]
    notes = [f"score: {what} x 100, mean ± std over seeds (the figure's error bars: ± one std)",
             "frontier: no other model scores as well with as few embedding bytes (at inference)",
             "memory (peak, MB) and time per sample (training: forward + backward; inference: forward) from the task runs' "
             f"efficiency callback, means over them; {NOT_MEASURED} where no run recorded it"]
    return Table("Pareto: task score against embedding bytes", ["Method", "Model", "Emb bytes", "Score", "Seeds",
                 "Frontier", "Memory (MB)", "Train ms/sample", "Infer ms/sample"], rows, notes)


def _score(point: Point, digits: int) -> str:
    mean, std = mean_std([100 * s for s in point.scores.values()])
    return f"{mean:.{digits}f}" + ("" if std is None else f" ± {std:.{digits}f}")


def _measured(value: float | None, spec: str) -> str:
    return NOT_MEASURED if value is None else format(value, spec)


def draw(points: list[Point], what: str):
    """The figure: a line per method (its points by bytes, ± one std over seeds), the frontier ringed and joined."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a report runs in batch jobs and tests
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 5.5), layout="constrained")
    axes = figure.add_subplot()
    for index, method in enumerate(dict.fromkeys(p.method for p in points)):
        mine = sorted((p for p in points if p.method == method), key=lambda p: p.bytes)
        axes.errorbar([p.bytes for p in mine], [100 * p.mean for p in mine], yerr=[100 * p.std for p in mine],
                      marker=MARKERS[index % len(MARKERS)], markersize=5, capsize=3, linewidth=1.2, label=method)
    best = frontier(points)
    axes.plot([p.bytes for p in best], [100 * p.mean for p in best], linestyle="--", color="black", linewidth=0.8,
              marker="o", markersize=11, markerfacecolor="none", markeredgecolor="black", label="frontier")
    axes.set_xscale("log")
    axes.set_xlabel("embedding bytes at inference (log scale)")
    axes.set_ylabel(f"{what} x 100")
    axes.set_title("Task score against embedding bytes (mean ± std over seeds)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
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
