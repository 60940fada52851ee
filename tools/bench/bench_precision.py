"""bf16 autocast against fp32 for the MLM pre-training step: time per step, and how far the losses drift.

RoBERTa_S MLM (`configs/backbone/roberta_s.yaml`, vocabulary 50265) with the dense table and with
subspace f=3, batches of 2 x 128 on the CPU (32 x 128 on a GPU, where bf16 is set against fp32 too).
bf16 is `torch.autocast(dtype=torch.bfloat16)` around the forward, with weights, gradients, AdamW and
the loss in fp32: what Lightning's `precision: bf16-mixed` does. Inputs: windows of real English text
(`real_text.py`), and uniformly random ids as labelled second rows of the timing. Time: the fp32 and bf16
steps of both models take turns (a warm-up, then 3 rounds): medians, spreads, and "speed-up vs fp32" the
median of the per-round ratios of the fp32 step's time to the row's, with their range. Agreement: two copies of each model with the same weights train on the same 3
batches (seeds 0-2), one in fp32 and one in bf16, with dropout off (evaluation mode) so that
precision is the only difference, at the peak learning rate from the first step (no warm-up) so
that the weights move as they do mid-training; the bf16 row gives the largest |loss_bf16 -
loss_fp32| over the steps and that difference over the fp32 loss. "oneDNN bf16" says whether
PyTorch's CPU kernels have bf16 instructions here (AVX512-BF16 or AMX).

What bounds the speed: without those instructions bf16 matmuls take slower paths than fp32's, and
autocast adds casts of every weight and activation: on machines without AVX512-BF16 ("oneDNN bf16"
no) a bf16 step took 4 to 50 times as long as an fp32 one during development (RoBERTa_S at 2 x 128
and 8 x 128, a shared machine). With them bf16 may be faster or not, by the CPU, the shapes and the
machine's load: read the rows below, which say whether it has them. `configs/trainer/cpu_bf16.yaml` is
the trainer config for such CPUs; `configs/trainer/cpu.yaml` stays fp32. Rerun this benchmark on your CPU
before choosing.
"""
from __future__ import annotations

import copy

import torch

from builders import IDS, batch, compose, step_timer
from harness import ratio_range, speedup, spread_cell, time_interleaved

TITLE = "Precision: bf16 autocast against fp32 for the RoBERTa_S MLM step (time, loss agreement)"
STRATEGIES = {"dense": "dense", "subspace f=3": "subspace_3"}
PRECISIONS = {"fp32 (baseline)": torch.float32, "bf16 autocast": torch.bfloat16}


def losses(model, batches: list[dict], ctx) -> dict[str, list[float]]:
    """The losses of copies of ``model`` (same weights) trained on ``batches`` in each precision, dropout off."""
    from lit_embed.models.optim import OptimConfig

    found = {}
    for name, dtype in PRECISIONS.items():
        twin = copy.deepcopy(model)
        twin.optim = OptimConfig(warmup=0, schedule="constant")
        step = step_timer(twin, batches, ctx, dtype)
        twin.eval()
        found[name] = [float(step()) for _ in batches]
        del twin, step
    return found


def run(ctx) -> list[dict]:
    size = (4, 32) if ctx.smoke else (32, 128) if ctx.device.startswith("cuda") else (2, 128)
    count = 2 if ctx.smoke else 3
    rows = []
    for label, embedding in list(STRATEGIES.items())[: 1 if ctx.smoke else None]:
        model = compose("MaskedLM", "roberta_s", embedding, 50265, ctx.smoke)
        batches = [batch(model, size, seed) for seed in range(count)]
        trained = losses(model, batches, ctx)
        steps = {(name, ids): step_timer(copy.deepcopy(model), batch(model, size, ids=ids), ctx, dtype)
                 for name, dtype in PRECISIONS.items() for ids in IDS}
        timing = time_interleaved(steps, ctx, warmup=1, repeat=3)
        for (name, ids), own in timing.items():
            ratio = speedup(timing, ("fp32 (baseline)", ids), (name, ids))
            row = {"model": f"RoBERTa_S MLM, {label}", "precision": name, "ids": IDS[ids], "batch": f"{size[0]}x{size[1]}",
                   "seconds per step": own["seconds"], "spread": spread_cell(own), "speed-up vs fp32": ratio["median"],
                   "speed-up range": ratio_range(ratio)}
            if ctx.device == "cpu":
                row["oneDNN bf16"] = "yes" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "no"
            if name != "fp32 (baseline)" and ids == "text":
                gaps = [abs(a - b) for a, b in zip(trained[name], trained["fp32 (baseline)"])]
                worst = max(range(count), key=gaps.__getitem__)
                row.update({"steps compared": count, "largest loss gap vs fp32": gaps[worst],
                            "gap / fp32 loss": gaps[worst] / trained["fp32 (baseline)"][worst]})
            rows.append(row)
        del steps, model
    return rows
