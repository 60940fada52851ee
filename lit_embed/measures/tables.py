"""Tables as Markdown, CSV or LaTeX: a title, a header, rows of cells, and notes on what is missing."""

from __future__ import annotations

import csv
import io
import math
import statistics
from dataclasses import dataclass, field

from lit_embed.errors import ConfigError

FORMATS = ("md", "csv", "latex")
MISSING = "–"


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation of a cell's values (``None`` for a single value); NaN where one is not
    finite (an undefined score, a diverged loss: results.json may hold them), as ``statistics`` cannot take them."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    return mean, statistics.stdev(values) if all(map(math.isfinite, values)) else math.nan


def score_text(mean: float, spread: float | None, digits: int = 1) -> str:
    """A score (a fraction, higher is better: :func:`lit_embed.runs.results.is_score`) as every table shows one: x 100 with
    ``digits`` decimals, ± its standard deviation."""
    text = f"{100 * mean:.{digits}f}"
    return text if spread is None else f"{text} ± {100 * spread:.{digits}f}"


def logged_text(mean: float, spread: float | None) -> str:
    """Any other metric (a loss, a perplexity) as logged: four significant digits, ± two."""
    return f"{mean:.4g}" + (f" ± {spread:.2g}" if spread is not None else "")


def render(tables: list[Table], fmt: str = "md") -> str:
    if fmt not in FORMATS:
        raise ConfigError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    if fmt == "csv":
        return _csv(tables)
    one = _markdown if fmt == "md" else _latex
    return "\n".join(one(table) for table in tables)


def _markdown(table: Table) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    lines = [f"### {table.title}", "", line(table.header), "|" + "|".join(["---"] * len(table.header)) + "|"]
    lines += [line(row) for row in table.rows]
    lines += [""] + [f"- {note}" for note in table.notes] + ([""] if table.notes else [])
    return "\n".join(lines)


def _csv(tables: list[Table]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for number, table in enumerate(tables):
        if number:
            writer.writerow([])
        writer.writerow([f"# {table.title}"])
        writer.writerow(table.header)
        writer.writerows(table.rows)
        for note in table.notes:
            writer.writerow([f"# note: {note}"])
    return out.getvalue()


_LATEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _tex(text: str) -> str:
    escaped = "".join(_LATEX_ESCAPES.get(char, char) for char in text)
    return escaped.replace("±", r"$\pm$").replace(MISSING, "--")


def _latex(table: Table) -> str:
    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{_tex(table.title)}}}",
             r"\begin{tabular}{l" + "r" * (len(table.header) - 1) + "}", r"\toprule",
             " & ".join(_tex(cell) for cell in table.header) + r" \\", r"\midrule"]
    lines += [" & ".join(_tex(cell) for cell in row) + r" \\" for row in table.rows]
    lines += [r"\bottomrule", r"\end{tabular}"]
    lines += [rf"\par\footnotesize {_tex(note)}" for note in table.notes]
    lines += [r"\end{table}", ""]
    return "\n".join(lines)
