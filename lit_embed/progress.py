"""Progress as plain lines, for a log: where stderr is no terminal (``> log 2>&1``, a batch job), long work says how
far it has got every :data:`INTERVAL` seconds and once at its end, ``train step 1200/250000 (0.5%), 3.1 steps/s,
ETA 22h17m, train/loss 6.412``; on a terminal it says nothing extra (a bar where the work has one).

One :class:`Progress` per piece of work: a run's stages (:class:`lit_embed.callbacks.console.LogProgress`),
``compress``'s fitting loops, a sweep's runs, ``data check``'s names. The libraries' own work (reading a data file,
encoding its rows, loading weights), whose ``\r`` bars are off there (:func:`lit_embed.notices.quiet`), says one line
per stage when it ends (:class:`Stage`, :func:`library_bars`). Imports nothing heavy: ``sweep`` uses it without torch.
"""

from __future__ import annotations

import contextlib
import io
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping

#: Seconds between two lines of one piece of work.
INTERVAL = 30.0
PLURAL = {"step": "steps", "batch": "batches", "run": "runs", "name": "names", "row": "rows", "text": "texts"}


class Progress:
    """``stage``'s progress in ``unit``s of ``total`` (0: unknown), said by :meth:`update` on stderr every ``interval``
    seconds (default :data:`INTERVAL`) and at its end; ``enabled`` (default: stderr is no terminal) false says nothing."""

    def __init__(self, stage: str, unit: str, total: float = 0, interval: float | None = None,
                 enabled: bool | None = None) -> None:
        self.stage, self.unit, self.total = stage, unit, total
        self.interval = INTERVAL if interval is None else interval
        self.enabled = not sys.stderr.isatty() if enabled is None else enabled
        self.started = self.said = time.monotonic()

    def update(self, done: int, details: Mapping | Callable[[], Mapping] | None = None, final: bool = False) -> bool:
        """Say how far it has got where ``interval`` has passed since the last line (or ``final``: it ended), with
        ``details`` (name -> value; a function giving them, called only to say them). Whether it said it."""
        now = time.monotonic()
        if not self.enabled or not (final or now - self.said >= self.interval):
            return False
        print(self.line(done, now, details() if callable(details) else details or {}, final), file=sys.stderr, flush=True)
        self.said = now
        return True

    def line(self, done: int, now: float, details: Mapping, final: bool) -> str:
        elapsed, bounded = now - self.started, 0 < self.total < math.inf
        rate = done / elapsed if elapsed > 0 else 0.0
        units = PLURAL.get(self.unit, f"{self.unit}s")
        line = f"{self.stage} {self.unit} {done}" + (f"/{int(self.total)} ({100 * done / self.total:.1f}%)" if bounded else "")
        if rate:
            line += f", {rate:.3g} {units}/s" if rate * 60 >= 1 else f", {duration(1 / rate)} per {self.unit}"
        if final:
            line += f", done in {duration(elapsed)}"
        elif bounded and rate:
            line += f", ETA {duration((self.total - done) / rate)}"
        return line + "".join(f", {k} {v:.4g}" if isinstance(v, float) else f", {k} {v}" for k, v in details.items())


class Stage:
    """One stage of work said in one line on stderr when it ends, where stderr is no terminal (``enabled``):
    ``Encoding topics train: 1,500 rows, done in 0.4s``. ``count`` (the caller sets it; ``total`` where it is known)
    is what it got through; a stage that raised says nothing (the error does)."""

    def __init__(self, name: str, unit: str | None = "row", enabled: bool | None = None) -> None:
        self.name, self.unit = name, unit
        self.count: int | None = None
        self.total: int | None = None
        self.enabled = not sys.stderr.isatty() if enabled is None else enabled

    def __enter__(self) -> Stage:
        self.started = time.monotonic()
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None and self.enabled:
            print(self.line(time.monotonic() - self.started), file=sys.stderr, flush=True)

    def line(self, seconds: float) -> str:
        said = ""
        if self.count is not None:
            said = f"{self.count:,}" + (f"/{self.total:,}" if self.total is not None else "")
            if self.unit:
                said += f" {self.unit if self.count == 1 else PLURAL.get(self.unit, self.unit + 's')}"
            said += ", "
        return f"{self.name}: {said}done in {f'{seconds:.1f}s' if seconds < 60 else duration(seconds)}"


@contextlib.contextmanager
def library_bars(prefix: str, enabled: bool | None = None) -> Iterator[None]:
    """transformers' progress bars inside (``Loading weights``, shards) as one :class:`Stage` line each when they end,
    ``PREFIX: Loading weights 101/101, done in 0.3s``, through its own hook (``transformers.utils.logging.set_tqdm_hook``),
    where stderr is no terminal; elsewhere its bars as they are."""
    enabled = not sys.stderr.isatty() if enabled is None else enabled
    from transformers.utils import logging as hf_logging

    hook = getattr(hf_logging, "set_tqdm_hook", None)  # transformers 5.x
    if not enabled or hook is None:
        yield
        return
    hook(lambda factory, args, kwargs: _line_bar(prefix, args, kwargs))
    try:
        yield
    finally:
        hook(None)


def _line_bar(prefix: str, args: tuple, kwargs: dict):
    """A tqdm that counts and draws nothing (into a string), and says its :class:`Stage` line when it closes."""
    from tqdm import tqdm

    class LineBar(tqdm):
        def close(self) -> None:
            if not self.disable:  # closing disables it: said once
                stage.count, stage.total = self.n, self.total
                stage.__exit__(None, None, None)
            super().close()

    stage = Stage(f"{prefix}{kwargs.get('desc') or 'working'}", unit=None, enabled=True).__enter__()
    return LineBar(*args, **{**kwargs, "file": io.StringIO(), "disable": False})


def duration(seconds: float) -> str:
    """``22h17m``, ``3m05s``, ``12s``."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s" if rest >= 60 else f"{rest}s"
