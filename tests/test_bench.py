"""The benchmark suite keeps working: every benchmark runs at its smallest size (figures are not checked here)."""

from __future__ import annotations

import subprocess
import sys

from .conftest import REPO


def test_benchmark_suite_runs_at_smoke_size():
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "bench" / "run.py"), "--smoke", "--no-write"],
        capture_output=True, text=True, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    names = sorted(p.stem.removeprefix("bench_") for p in (REPO / "tools" / "bench").glob("bench_*.py"))
    for name in names:
        assert f"== {name}:" in done.stdout
    assert "lit-embed equal-size" in done.stdout and "speed-up vs dense" in done.stdout
