"""Inference time per sample: strategy + encoder forward (evaluation mode, no gradients) of RoBERTa_S
and XLM-R_S with subspace and HashFormer-Proj against dense.

What every downstream use runs (a fine-tuned classifier adds one small head): the strategy turns a
batch of 32 x 128 codes into vectors and the encoder (`configs/backbone/{roberta_s,xlmr_s}.yaml`)
reads them (on a GPU in fp16 autocast). Inputs: windows of real English text (`real_text.py`: WordPiece
ids, or MD5 codes of its words), the headline, and uniformly random ids (random codes) as labelled second
rows. The models of one backbone take turns batch by batch (a warm-up, then 5 rounds): medians, spreads,
and speed-ups as the median of the per-round ratios with their range.
"""

from __future__ import annotations

import torch

from builders import IDS, autocast, batch, compose
from harness import ratio_range, speedup, spread_cell, time_interleaved

TITLE = "Inference time per sample: subspace and HashFormer-Proj against dense"
MODELS = {"RoBERTa_S": ("roberta_s", 50265), "XLM-R_S": ("xlmr_s", 250002)}
STRATEGIES = {"dense (baseline)": "dense", "subspace f=3": "subspace_3", "HashFormer-Proj": "md5_proj"}


def forward_timer(model, data: dict, ctx):
    model.to(ctx.device).eval()
    data = {k: v.to(ctx.device) for k, v in data.items()}

    def forward():
        with torch.inference_mode(), autocast(ctx):
            model.encode(data)

    return forward


def run(ctx) -> list[dict]:
    size = (4, 32) if ctx.smoke else (32, 128)
    rows = []
    for model_name, (backbone, vocab_size) in MODELS.items():
        calls = {}
        for label, embedding in STRATEGIES.items():
            model = compose("ShuffleRandom", backbone, embedding, vocab_size, ctx.smoke)
            for ids in IDS:
                calls[(label, ids)] = forward_timer(model, batch(model, size, ids=ids), ctx)
        timing = time_interleaved(calls, ctx, warmup=1, repeat=5)
        for (label, ids), own in timing.items():
            ratio = speedup(timing, ("dense (baseline)", ids), (label, ids))
            rows.append({"model": model_name, "strategy": label, "ids": IDS[ids], "batch": f"{size[0]}x{size[1]}",
                         "ms per sample": 1000 * own["seconds"] / size[0], "spread": spread_cell(own),
                         "speed-up vs dense": ratio["median"], "speed-up range": ratio_range(ratio)})
        ctx.report(rows)
    return rows
