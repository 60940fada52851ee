"""A subspace MLM step under each of the model's ``torch_compile`` settings: eager, ``true`` (inductor's fused
kernels) and ``reduce-overhead`` (the compiled encoder's kernels replayed as CUDA graphs).

    python tools/bench/compile_modes.py                      # RoBERTa_S subspace f=3, 32 x 512, bf16, on cuda
    python tools/bench/compile_modes.py --embedding dense --batch 16x512

A probe, not a benchmark with a peer (``bench_pretrain_step.py`` sets the compiled step against HuggingFace's
compiled one): each setting's model is built afresh, compiled on its first steps (4 unmeasured ones), then timed
over 5 runs of 10 back-to-back steps; the median run's time per step and tokens per second are printed. Back to back
a step runs faster than in the benchmark's interleaved rounds, where the models take turns step by step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from builders import batch, compose, step_timer  # noqa: E402
from harness import Context, markdown_table  # noqa: E402

SETTINGS = {"eager": False, "true": True, "reduce-overhead": "reduce-overhead"}


def time_setting(setting, args, ctx: Context) -> dict:
    """Build the model with ``torch_compile=setting``, warm it up, time it; its row."""
    torch._dynamo.reset()
    model = compose("MaskedLM", args.backbone, args.embedding, args.vocab_size)
    if setting:  # as the model's torch_compile option does, on the same encoder
        model.encoder.compile(mode="default" if setting is True else setting)
    size = tuple(int(n) for n in args.batch.split("x"))
    step = step_timer(model, batch(model, size), ctx, getattr(torch, args.dtype))
    started = time.perf_counter()
    for _ in range(4):
        step()
    ctx.sync()
    warmup = time.perf_counter() - started
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(10):
            step()
        ctx.sync()
        runs.append((time.perf_counter() - started) / 10)
    seconds = statistics.median(runs)
    return {"ms per step": round(seconds * 1e3, 2), "range ms": f"{min(runs) * 1e3:.1f}-{max(runs) * 1e3:.1f}",
            "tokens/s": round(size[0] * size[1] / seconds), "warm-up s": round(warmup, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", default="roberta_s", help="a configs/backbone file (default roberta_s)")
    parser.add_argument("--embedding", default="subspace_3", help="a configs/embedding file (default subspace_3)")
    parser.add_argument("--vocab-size", type=int, default=50265)
    parser.add_argument("--batch", default="32x512", help="sequences x tokens")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("no CUDA device here: CUDA graphs need one (give --device cpu for the fused kernels alone)")
    ctx = Context(device=args.device)
    rows = [{"torch_compile": name, **time_setting(setting, args, ctx)} for name, setting in SETTINGS.items()]
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
