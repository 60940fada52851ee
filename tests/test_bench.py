"""The benchmark suite keeps working: every benchmark runs at its smallest size (figures are not checked
here), and the peers written for it compute what they claim to."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import torch

from tests.helpers import REPO


def test_benchmark_suite_runs_at_smoke_size():
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "bench" / "run.py"), "--smoke", "--no-write"],
        capture_output=True, text=True, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    names = sorted(p.stem.removeprefix("bench_") for p in (REPO / "tools" / "bench").glob("bench_*.py"))
    for name in names:
        assert f"== {name}:" in done.stdout
    out = done.stdout
    assert "lit-embed equal-size" in out and "speed-up vs dense" in out
    # the peers an expert would pick, each in the table of what it is compared with (optional ones may be skipped)
    assert "SparseAdam" in out and "AdamW on touched rows" in out and "speed-up vs best peer" in out
    assert "RobertaForMaskedLM" in out and "speed-up vs HuggingFace MLM" in out
    assert "faiss Kmeans" in out and "xxHash XXH3-128" in out
    assert "== startup:" in out and "import torch" in out and "lit-embed report" in out
    assert "bf16 autocast" in out and "largest loss gap vs fp32" in out


def bench_module(monkeypatch, name: str):
    monkeypatch.syspath_prepend(str(REPO / "tools" / "bench"))
    return importlib.import_module(name)


def test_touched_row_adamw_peer_is_adamw_on_the_rows_it_touches(monkeypatch):
    """The embedding step's touched-row peer is AdamW: on the rows a batch touches it steps as torch's AdamW
    does (same settings), and it leaves every other row alone (lazy, like SparseAdam)."""
    bench = bench_module(monkeypatch, "bench_embedding_step")
    table = bench.TouchedRowsAdamW(50, 8)
    reference = torch.nn.Embedding(50, 8)
    reference.weight.data.copy_(table.weight)
    start = table.weight.clone()
    config = table.config
    optimizer = torch.optim.AdamW(reference.parameters(), lr=config.lr, betas=config.betas, eps=config.eps,
                                  weight_decay=config.weight_decay)
    ids = torch.tensor([[3, 7, 7, 11], [3, 42, 0, 11]])
    for seed in range(3):  # the same rows every step: dense AdamW moves them exactly as the lazy one does
        grad = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(seed))
        for module, step in ((table, table), (reference, optimizer)):
            step.zero_grad(set_to_none=True)
            module(ids).backward(grad)
            step.step()
    touched = ids.unique()
    untouched = torch.ones(50, dtype=torch.bool)
    untouched[touched] = False
    torch.testing.assert_close(table.weight[touched], reference.weight.detach()[touched])
    assert torch.equal(table.weight[untouched], start[untouched])
    assert not torch.equal(table.weight[touched], start[touched])


def test_results_say_when_no_gpu_figures_exist(monkeypatch, tmp_path):
    run = bench_module(monkeypatch, "run")
    environment = {"cpu_count": 2, "torch_threads": 2, "torch": "2"}
    payload = {"title": "T", "description": "D", "date": "2026-01-01", "command": "c", "environment": environment,
               "rows": [{"what": "x", "seconds": 1.0}]}
    (tmp_path / "x.cpu.json").write_text(json.dumps(payload))
    monkeypatch.setattr(run, "RESULTS", tmp_path)
    assert "No GPU results" in run.render()
    (tmp_path / "x.cuda.json").write_text(json.dumps({**payload, "environment": {**environment, "gpu": "H100"}}))
    assert "No GPU results" not in run.render()


def test_a_measurement_in_a_child_process_comes_back_as_its_row(monkeypatch):
    """The path every full-size memory figure takes (the smoke run measures in its own process)."""
    harness = bench_module(monkeypatch, "harness")
    bench = bench_module(monkeypatch, "bench_embedding_step")
    jobs = [{"shape": [100, 8], "label": "nn.Embedding(sparse=True), SparseAdam"}]
    rows = harness.in_children(bench.__file__, jobs, harness.Context(), bench.measure_memory)
    assert len(rows) == 1 and rows[0]["step memory MB"] >= 0
