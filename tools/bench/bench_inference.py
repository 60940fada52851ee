"""Inference time per sample: strategy + encoder forward (evaluation mode, no gradients) of RoBERTa_S
and XLM-R_S with subspace and HashFormer-Proj against dense.

What every downstream use runs (a fine-tuned classifier adds one small head): the strategy turns a
batch of 32 x 128 codes into vectors and the encoder (`configs/backbone/{roberta_s,xlmr_s}.yaml`)
reads them (on a GPU in fp16 autocast). The models of one backbone take turns batch by batch (a
warm-up, then 5 rounds, medians).
"""

from __future__ import annotations

import torch

from builders import autocast, batch, compose
from harness import time_interleaved

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
            calls[label] = forward_timer(model, batch(model, size), ctx)
        timing = time_interleaved(calls, ctx, warmup=1, repeat=5)
        dense = timing["dense (baseline)"]["seconds"]
        for label in STRATEGIES:
            seconds = timing[label]["seconds"]
            rows.append({"model": model_name, "strategy": label, "batch": f"{size[0]}x{size[1]}",
                         "ms per sample": 1000 * seconds / size[0], "speed-up vs dense": dense / seconds})
    return rows
