"""Start-up time of the lit-embed command line against `python -c "import torch"`.

Every command is a fresh process of the running Python: `lit-embed --help`, `lit-embed params
--config configs/demo.yaml` and `lit-embed report RUN_DIR --baseline RUN` run as the `lit-embed`
console script does (`from lit_embed.commands import main`), with this checkout first on PYTHONPATH and
the hub offline; the baseline imports PyTorch and exits, the least any of them can cost. RUN_DIR is
generated: six runs' `results.json` (a dense RoBERTa_S baseline and a 3-sub-embedding model, SST-2,
three seeds), laid out as the ResultsWriter callback writes them; RUN is the first dense run. The
commands take turns round by round (a warm-up round, then 5 rounds, medians), so the file cache is
warm for all and a busy machine slows them alike; "vs import torch" divides by the baseline's median
of the same rounds. What bounds the result: `lit_embed.commands` dispatches before it imports anything heavy, so
`--help` and `report` import neither PyTorch nor Lightning; `params` imports both, parses the config
with jsonargparse and builds the model (without training it), which is most of its time.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from harness import REPO, checkout_env, time_interleaved

TITLE = "Start-up: lit-embed --help, params and report against python -c 'import torch'"
CLI = "import sys; from lit_embed.commands import main; sys.exit(main())"
ROBERTA_S = {"arch": "roberta", "layers": 8, "hidden": 512, "heads": 8, "ffn": 2048}


def run_folder(root: Path) -> Path:
    """Six runs' results.json (dense and 3-sub-embedding RoBERTa_S on SST-2, three seeds) under ``root``."""
    from lit_embed.measures.accounting import compression
    from lit_embed.runs.results import RESULTS_FILE, RESULTS_FORMAT
    from lit_embed.storage.files import write_json_atomic

    dense = (51_482_112, 25_735_680)  # RoBERTa_S total and embedding parameters (k-sub-embedding Table 1)
    for label, (total, embedding), score, ms in (("roberta_s", dense, 0.90, 24.9), ("3se", (25_765_376, 18_944), 0.86, 20.1)):
        for seed in range(3):
            write_json_atomic(root / f"{label}-sst2-{seed}" / RESULTS_FILE, {
                "format": RESULTS_FORMAT, "label": label, "task": "sst2", "seed": seed, "backbone": ROBERTA_S,
                "parameters": {"total_params": total, "embedding_params": embedding, "baseline_total_params": dense[0],
                               "baseline_embedding_params": dense[1], **compression(embedding, total, dense[1], dense[0])},
                "efficiency": {"train": {"ms_per_sample": ms}, "infer": {"ms_per_sample": ms / 5}, "peak_memory_mb": 900.0,
                               "device": "cpu"},
                "metrics": {"test/accuracy": score + 0.01 * seed, "test/loss": 0.4},
            })
    return root


def command(argv: list[str]):
    """A function running ``python ARGV`` to completion (its output discarded; a failure raises)."""
    env = checkout_env({"HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"})

    def call():
        done = subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"python {' '.join(argv)} failed:\n{done.stderr[-3000:]}")

    return call


def run(ctx) -> list[dict]:
    baseline = "python -c 'import torch' (baseline)"
    with tempfile.TemporaryDirectory() as root:
        runs = run_folder(Path(root))
        calls = {
            baseline: command(["-c", "import torch"]),
            "lit-embed --help": command(["-c", CLI, "--help"]),
            "lit-embed params --config configs/demo.yaml": command(["-c", CLI, "params", "--config", "configs/demo.yaml"]),
            "lit-embed report RUN_DIR --baseline RUN (6 runs)": command(["-c", CLI, "report", str(runs), "--baseline",
                                                                          str(runs / "roberta_s-sst2-0")]),
        }
        if ctx.smoke:  # CI: the baseline and report, which reads the generated folder; the others start as report does
            calls = {name: call for name, call in calls.items() if "params" not in name and "--help" not in name}
        timing = time_interleaved(calls, ctx, warmup=0 if ctx.smoke else 1, repeat=5)
    base = timing[baseline]["seconds"]
    return [{"command": name, "seconds": t["seconds"], "min seconds": t["min_seconds"],
             "minus import torch, s": t["seconds"] - base, "vs import torch": t["seconds"] / base}
            for name, t in timing.items()]
