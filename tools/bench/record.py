"""A benchmark's result file and RESULTS.md, rebuilt from every result beside it: what ``run.py`` and the GPU kit
(``kit.py``) both write."""

from __future__ import annotations

import json
from pathlib import Path

import headlines
from fingerprint import describe, imported_code

from lit_embed.storage.files import write_atomic, write_json_atomic

from harness import RESULTS, load_average, markdown_table

INTRO = """# Benchmarks

Every figure is measured beside its baseline in the same run, on the machine named with it, and
given as a ratio. Rebuild with `python tools/bench/run.py [NAME...] [--device cuda]`; this file is
generated from `results/*.json`.
"""

HEADLINES = """## Headlines

Each claim names its peer and its input (real-text ids, the headline, or uniform ids) and the code it timed (the
fingerprint of the files its run imported: a result whose code has changed since is left out of the headlines and marked
STALE in its own section); the peer's figure is
that of lit-embed's group in the same run (for the embedding step, of the rounds they took turns in); the
ratio is the median of the per-round ratios, with their range ("measured" gives the rounds where known); "% of memory
limit" is the time the bytes a step must move would take at the machine's measured bandwidth over the measured time
(see each benchmark). To measure them again, on a quiet machine: `python tools/bench/run.py --headlines` (CPU, 15
interleaved rounds), and the GPU rows with `python tools/bench/run.py --device cuda --quick` (the GPU kit).
"""


NO_GPU = """No GPU results: every figure below was measured on the CPU (no `results/*.cuda.json` exists).
The GPU kit (`kit.py`) adds them on a machine with a GPU, in about 7 minutes, from the root of a copy of this
repository (lit-embed need not be installed, no network is used; the packages of `pyproject.toml` and its
`test` extra, with a CUDA build of torch): `python tools/bench/run.py --device cuda --quick`. Its results
land in `tools/bench/results/` (`*.cuda.json`, `gpu_kit.cuda.json`, `gpu_kit.log`) and this file, all
copied to `--out DIR` (by default `$OUT`, where set) after every part.
"""


def render(results: Path = RESULTS) -> str:
    parts = [INTRO]
    headline_table = headlines.table(results)
    if headline_table:
        parts += [HEADLINES, headline_table + "\n"]
    if not any(results.glob("*.cuda*.json")):
        parts.append(NO_GPU)
    for path in sorted(results.glob("*.json")):
        result = json.loads(path.read_text())
        env = result["environment"]
        where = env.get("gpu") or f"{env['cpu_count']} CPU cores, {env['torch_threads']} torch threads"
        parts.append(f"## {result['title']}\n")
        parts.append(f"{result['description']}\n")
        load = f", load average {env.get('load average')} -> {result.get('load average after')}" if "load average" in env else ""
        parts.append(f"Measured {result['date']} on {where} (torch {env['torch']}{load}): `{result['command']}`\n")
        if env.get("text-like ids"):
            parts.append(f"Text-like ids: {env['text-like ids']}.\n")
        parts.append(f"The code it timed: {describe(result)}.\n")
        if not result.get("complete", True):
            parts.append("**Partial: the run stopped before this benchmark finished; the rows below are those it had.**\n")
        parts.append(markdown_table(result["rows"]) + "\n")
    return "\n".join(parts)


def save(path: Path, payload: dict, rows: list[dict], complete: bool) -> None:
    """Write a benchmark's result file (partial until ``complete``) and rebuild RESULTS.md (beside the results
    folder) from every result in its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {**payload, "load average after": load_average(), "code": imported_code(), "complete": complete,
                             "rows": rows})
    write_atomic(path.parent.parent / "RESULTS.md", render(path.parent))
