"""What every benchmark shares: a synchronised timer, the machine it ran on, and result files.

A benchmark module ``bench_<name>.py`` defines ``run(ctx) -> list[dict]``; each row names what was
timed and, where it has one, the baseline measured in the same run and the ratio between them; it may
set ``THREADS``, the torch threads it runs with unless ``run.py --threads`` says otherwise. A
benchmark hands its rows so far to ``ctx.report`` whenever a group of them is complete, so that a run
cut short (the GPU kit's time budget) keeps what it measured.

Every timing is repeated: rows give the median and the spread ((slowest - fastest) / median) of the
repeats, and alternatives take turns (A B A B ...) so that a busy machine slows them alike; a ratio is the
median of the per-round ratios, with their range.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import real_text
import torch

from lit_embed.runs.results import load_average

RESULTS = Path(__file__).parent / "results"
REPO = Path(__file__).resolve().parents[2]


def checkout_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment, this checkout first on PYTHONPATH, and ``extra``: for the processes a
    benchmark starts, so that they run the checkout's lit-embed, installed or not (a GPU machine may hold only
    a copy of the repository)."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


@dataclass
class Context:
    """Options every benchmark reads: the device, whether to run at the smallest size (CI's smoke test), the
    interleaved rounds of every timing where given (``rounds``: else each benchmark's own), and where the rows
    measured so far go (``partial``; see :meth:`report`)."""

    device: str = "cpu"
    smoke: bool = False
    rounds: int | None = None
    partial: Callable[[list[dict]], None] | None = None

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def report(self, rows: list[dict]) -> None:
        """The rows measured so far (a complete group of them): written at once by ``run.py``."""
        if self.partial is not None:
            self.partial(rows)


def summary(samples: list[float]) -> dict:
    """Median, fastest, slowest and spread ((slowest - fastest) / median) of repeated timings, and the timings."""
    median = statistics.median(samples)
    return {"seconds": median, "min_seconds": min(samples), "max_seconds": max(samples),
            "spread": (max(samples) - min(samples)) / median if median else 0.0, "repeats": len(samples),
            "samples": samples}


def speedup(timing: dict[str, dict], base: str, name: str) -> dict:
    """How many times faster ``name`` ran than ``base`` where they took turns (:func:`time_interleaved`): the
    median of the per-round ratios, and their lowest and highest."""
    ratios = sorted(b / n for b, n in zip(timing[base]["samples"], timing[name]["samples"]))
    return {"median": statistics.median(ratios), "low": ratios[0], "high": ratios[-1]}


def ratio_range(ratio: dict) -> str:
    """A :func:`speedup` as a cell: its lowest and highest per-round ratio."""
    return f"{ratio['low']:.3g}-{ratio['high']:.3g}"


def spread_cell(timing: dict) -> str:
    """A timing's spread as a cell: "4%" over its repeats."""
    return f"{100 * timing['spread']:.0f}% of {timing['repeats']}"


def time_call(fn: Callable[[], object], ctx: Context, warmup: int = 2, repeat: int = 5) -> dict:
    """:func:`summary` of ``fn()``'s seconds over ``repeat`` calls after ``warmup`` calls, device-synchronised."""
    if ctx.smoke:
        warmup, repeat = min(warmup, 1), 1
    for _ in range(warmup):
        fn()
    ctx.sync()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        ctx.sync()
        samples.append(time.perf_counter() - start)
    return summary(samples)


def time_interleaved(calls: dict[str, Callable[[], object]], ctx: Context, warmup: int = 1, repeat: int = 5) -> dict[str, dict]:
    """:func:`time_call` of several calls taking turns: round r times every call once, so a load change
    on a shared machine slows all of them alike, and their ratios stay fair. ``ctx.rounds`` replaces ``repeat``."""
    repeat = ctx.rounds or repeat
    if ctx.smoke:
        warmup, repeat = min(warmup, 1), 1
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(warmup + repeat):
        for name, fn in calls.items():
            ctx.sync()
            start = time.perf_counter()
            fn()
            ctx.sync()
            if round_ >= warmup:
                samples[name].append(time.perf_counter() - start)
    return {name: summary(s) for name, s in samples.items()}


def reset_peak_memory(device: str) -> int:
    """Start a new peak-memory measurement; the memory in use now, which the peak is read against.

    On a GPU CUDA's allocated bytes. On the CPU the resident set size: writing 5 to
    ``/proc/self/clear_refs`` (Linux) lowers VmHWM, the peak, to it.
    """
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return int(torch.cuda.memory_allocated(device))
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:  # not Linux, or not allowed: the peak since the process started
        pass
    return _proc_status("VmRSS")


def peak_memory(device: str) -> int:
    """Peak bytes since :func:`reset_peak_memory`: CUDA's peak allocated bytes, or the process's VmHWM.

    VmHWM is the process's own peak resident set size (``getrusage``'s ru_maxrss starts from the
    parent's at fork, see the memory benchmark), the figure lit-embed's EfficiencyMonitor reads.
    """
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    return _proc_status("VmHWM")


def memory_of(work: Callable[[], object], device: str, warmup: Callable[[], object] | None = None) -> float:
    """MB that ``work()`` adds, at its peak, to what the process holds before it. ``warmup()``, a small
    version of the same work, runs first, so that what loads on first use (modules imported inside
    functions, kernel libraries, thread pools) is not counted."""
    if warmup is not None:
        warmup()
        gc.collect()
    before = reset_peak_memory(device)
    work()
    return (peak_memory(device) - before) / 2**20


def _proc_status(field: str) -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def in_children(script: str, jobs: list, ctx: Context, measure: Callable[[object, Context], dict],
                env: dict[str, str] | None = None) -> list[dict]:
    """Measure each of ``jobs`` (JSON-able) in a fresh process of ``script`` (with ``env`` added to its
    environment), so that peaks do not mix; each job gives one row. The script calls :func:`child_main`
    with ``measure``. At smoke size, where figures are not read and CI's time is, the jobs run in this
    process through ``measure`` (a child would import Lightning again, seconds per benchmark)."""
    if ctx.smoke:
        return [measure(job, ctx) for job in jobs]
    rows = []
    for job in jobs:
        command = [sys.executable, script, ctx.device, str(int(ctx.smoke)), str(torch.get_num_threads()), json.dumps(job)]
        done = subprocess.run(command, capture_output=True, text=True, env=checkout_env({"PYTHONWARNINGS": "ignore", **(env or {})}))
        if done.returncode:
            raise RuntimeError(f"measuring {job} in {Path(script).name} failed:\n{done.stderr[-3000:]}")
        rows += [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return rows


def child_main(measure: Callable[[object, Context], dict]) -> None:
    """A child of :func:`in_children`: ``measure(job, ctx)`` for every job on the command line, one JSON line each."""
    device, smoke, threads, *jobs = sys.argv[1:]
    torch.set_num_threads(int(threads))
    ctx = Context(device=device, smoke=smoke == "1")
    for job in jobs:
        print(json.dumps(measure(json.loads(job), ctx)), flush=True)


def memory_bandwidth(ctx: Context, megabytes: int = 512, repeat: int = 7) -> dict:
    """The memory bandwidth this process reaches with its threads: ``dst.copy_(src)`` of float32 tensors far
    larger than the caches, counting bytes read plus bytes written (STREAM's convention for copy), at the
    fastest of ``repeat`` copies (the limit; the median is what a busy machine left). GB are 10^9 bytes."""
    count = (16 if ctx.smoke else megabytes) * 2**20 // 4
    source = torch.ones(count, device=ctx.device)
    target = torch.empty_like(source)
    timing = time_call(lambda: target.copy_(source), ctx, warmup=1, repeat=2 if ctx.smoke else repeat)
    moved = 2 * 4 * count
    return {"GB/s": moved / timing["min_seconds"] / 1e9, "median GB/s": moved / timing["seconds"] / 1e9,
            "threads": torch.get_num_threads(), "MB copied": moved / 2 / 2**20}


def gemm_rate(ctx: Context, m: int, k: int, n: int, repeat: int = 7) -> dict:
    """The float32 matrix-product rate this process reaches with its threads at one shape: ``(m x k) @ (k x n)``,
    ``2 m k n`` floating-point operations, at the fastest of ``repeat`` products (the limit, as
    :func:`memory_bandwidth`'s; the median is what a busy machine left). GFLOP are 10^9 operations."""
    a, b = torch.randn(m, k, device=ctx.device), torch.randn(k, n, device=ctx.device)
    timing = time_call(lambda: a @ b, ctx, warmup=2, repeat=2 if ctx.smoke else repeat)
    flops = 2 * m * k * n
    return {"GFLOP/s": flops / timing["min_seconds"] / 1e9, "median GFLOP/s": flops / timing["seconds"] / 1e9,
            "shape": f"{m} x {k} x {n}"}


def environment(ctx: Context) -> dict:
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": ctx.device,
        "load average": load_average(),
        "text-like ids": real_text.describe(),
    }
    if ctx.device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name()
    return info


def markdown_table(rows: list[dict]) -> str:
    """Rows as a markdown table; columns in first-seen order, floats to 4 significant digits."""
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]

    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return "" if value is None else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)
