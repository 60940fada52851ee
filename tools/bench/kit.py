"""The GPU kit: on a machine with a GPU, one command runs the GPU tests and the GPU benchmarks within a time
budget and keeps every result it gets, however the run ends.

    python tools/bench/run.py --device cuda --quick                 # 7 minutes in all
    python tools/bench/run.py --device cuda --quick --budget 600     # another budget, in seconds

Its parts run in turn, each in a process of its own, offline (`HF_HUB_OFFLINE=1`), with its progress
printed under timestamps:

1. the GPU: what torch sees (devices, CUDA, bf16);
2. the MLM step: RoBERTa_S 3-SE against HuggingFace's masked LM trained as an expert would (LM head on the
   masked positions) and as `*ForMaskedLM(labels=)` does (logits at every position), 32 x 512, in bf16
   and in fp16 (`bench_pretrain_step.py`);
3. HashFormers' Table 3: time per sample of BERT-base-size HashFormers with S+R against BERT-MLM as
   HuggingFace computes it, 16 x 512, fp16 (`bench_table3.py`);
4. the GPU tests: `pytest -m gpu` (fp16 fits, the unfused optimiser under clipping, the benchmark suite at
   smoke size on the GPU), the DDP test left to part 5;
5. a 2-process DDP run over NCCL (the DDP test of `tests/test_gpu.py`) where two GPUs exist.

Each part gets a share of what is left of the budget (a part that ends early leaves its time to the
next) and is stopped when its share runs out (SIGTERM, then SIGKILL). The benchmarks write
`results/<name>.cuda.json` and RESULTS.md after every complete group of rows, so a part stopped or
failed keeps what it measured (marked partial); `results/gpu_kit.cuda.json` records each part's outcome
as it ends and `results/gpu_kit.log` everything printed. With `--out DIR` (by default `$OUT` where set,
as the device runner sets it) the log, the `.cuda.json` results and RESULTS.md are copied there after
every part. Exit status: 0 when every part that ran passed, 1 when one failed or ran out of time, 2 when
no GPU is present (said in one line, nothing written).
"""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from record import save

from harness import REPO, checkout_env

HERE = Path(__file__).resolve().parent
DEFAULT_BUDGET = 420.0
#: Seconds kept back at the end for the summary and the copies.
RESERVE = 5.0
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
GPU_CHECK = ("import torch; n = torch.cuda.device_count(); print('torch', torch.__version__, 'CUDA', torch.version.cuda, "
             "'devices', n); [print(i, torch.cuda.get_device_name(i), 'bf16', torch.cuda.is_bf16_supported(), "
             "round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1), 'GiB') for i in range(n)]; "
             "torch.ones(1, device='cuda').add_(1); torch.cuda.synchronize()")


@dataclass
class Part:
    """One step of the kit: a command run from the repository root, its weight in the budget's division, and
    why it does not run here (``None``: it runs)."""

    name: str
    command: list[str]
    weight: float
    skip: str | None = None


def gpu_count() -> int:
    """CUDA devices torch sees (0 where it has no CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def parts(gpus: int) -> list[Part]:
    python, bench = sys.executable, str(HERE / "run.py")
    pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests"]
    return [
        Part("GPU", [python, "-c", GPU_CHECK], 1),
        Part("MLM step, RoBERTa_S 3-SE vs HuggingFace, 32x512, bf16 + fp16", [python, bench, "pretrain_step", "--device", "cuda"], 7),
        Part("HashFormers' Table 3, 16x512, fp16", [python, bench, "table3", "--device", "cuda"], 6),
        Part("GPU tests (pytest -m gpu)", [*pytest, "-k", "not ddp"], 7),
        Part("DDP, 2 processes over NCCL", [*pytest, "-k", "ddp"], 3,
             None if gpus >= 2 else f"needs 2 GPUs, this machine has {gpus}"),
    ]


class Log:
    """Lines printed with the time and the seconds since the kit started, and written to a file (one per run)."""

    def __init__(self, path: Path) -> None:
        self.start = time.monotonic()
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = path.open("w", encoding="utf-8")
        self.lock = threading.Lock()

    def __call__(self, line: str) -> None:
        stamp = f"[{datetime.datetime.now():%H:%M:%S} +{time.monotonic() - self.start:6.1f}s]"
        with self.lock:
            print(f"{stamp} {line}", flush=True)
            self.handle.write(f"{stamp} {line}\n")
            self.handle.flush()

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def run_part(part: Part, seconds: float, log: Log) -> dict:
    """Run one part for at most ``seconds``, its output logged line by line; its outcome."""
    if part.skip:
        log(f"== {part.name}: skipped ({part.skip})")
        return {"part": part.name, "status": "skipped", "note": part.skip}
    log(f"== {part.name}: starting, {seconds:.0f} s at most: {' '.join(part.command)}")
    start = time.monotonic()
    process = subprocess.Popen(part.command, cwd=REPO, env=checkout_env(OFFLINE), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    reader = threading.Thread(target=lambda: [log(f"   {line.rstrip()}") for line in process.stdout], daemon=True)
    reader.start()
    try:
        code = process.wait(timeout=max(seconds, 1.0))
        status = "passed" if code == 0 else f"failed (exit {code})"
    except subprocess.TimeoutExpired:
        stop(process)
        status = "out of time"
    reader.join(timeout=5)
    took = time.monotonic() - start
    log(f"== {part.name}: {status} after {took:.0f} s")
    return {"part": part.name, "status": status, "seconds": round(took, 1), "budget s": round(seconds, 1)}


def stop(process: subprocess.Popen) -> None:
    """End a part and every process it started: SIGTERM to its process group, SIGKILL 10 s later."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_parts(plan: list[Part], budget: float, log: Log, after=lambda rows: None) -> list[dict]:
    """Every part in turn, each given its weight's share of the time left; ``after(rows)`` once each has ended."""
    rows: list[dict] = []
    for index, part in enumerate(plan):
        waiting = [p.weight for p in plan[index:] if not p.skip]
        left = budget - RESERVE - log.elapsed()
        if part.skip:
            rows.append(run_part(part, 0, log))
        elif left <= 1:
            log(f"== {part.name}: not started, the budget of {budget:.0f} s is spent")
            rows.append({"part": part.name, "status": "out of time", "note": "not started"})
        else:
            rows.append(run_part(part, left * part.weight / sum(waiting), log))
        after(rows)
    return rows


def copy_out(out: Path | None, results: Path, log: Log) -> None:
    """Copy the log, the GPU results and RESULTS.md to ``out`` (best effort: a failure is logged, not fatal)."""
    if out is None:
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
        for path in [log.path, results.parent / "RESULTS.md", *sorted(results.glob("*.cuda.json"))]:
            if path.exists():
                shutil.copy2(path, out / path.name)
    except OSError as error:
        log(f"could not copy the results to {out}: {error}")


def main(budget: float | None, out: str | None, results: Path) -> int:
    """The kit (see the module's docstring), its results in the folder ``results``; its exit status."""
    from harness import Context, environment

    budget = DEFAULT_BUDGET if budget is None else budget
    if budget <= RESERVE + 1:
        print(f"--budget {budget:g} is too short: give the kit more than {RESERVE + 1:g} seconds (default {DEFAULT_BUDGET:g})",
              file=sys.stderr)
        return 2
    target = Path(out) if out else (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    log = Log(results / "gpu_kit.log")
    gpus = gpu_count()
    log(f"GPU kit: {gpus} GPU(s), budget {budget:.0f} s, results in {results}" + (f", copied to {target}" if target else ""))
    payload = {"title": "GPU kit: the parts of the last run and how each ended", "description": (__doc__ or "").strip(),
               "date": datetime.date.today().isoformat(), "command": "python tools/bench/run.py --device cuda --quick",
               "environment": environment(Context(device="cuda"))}

    def record(rows: list[dict], complete: bool = False) -> None:
        save(results / "gpu_kit.cuda.json", payload, rows, complete=complete)
        copy_out(target, results, log)

    rows = run_parts(parts(gpus), budget, log, after=record)
    record(rows, complete=True)
    failed = [row["part"] for row in rows if row["status"] not in ("passed", "skipped")]
    log(f"GPU kit done in {log.elapsed():.0f} s: " + (f"{len(failed)} part(s) did not pass: {failed}" if failed else "every part passed"))
    return 1 if failed else 0
