"""Shuffle+Random pre-training step (forward, backward, AdamW step) of XLM-R_S: subspace f=3 and
HashFormer-Proj against the dense table.

Models are composed from the shipped config pieces (`configs/backbone/xlmr_s.yaml`, vocabulary 250002,
`configs/embedding/{dense,subspace_3,md5_proj}.yaml`) with S+R's 3-way token head: no decoder, so what a
strategy saves is the dense table's own cost (its 250002 x 512 gradient and fused AdamW update, see the
embedding step), fixed per step while the encoder's grows with the batch: hence 32 x 128 and 4 x 128.
S+R has no HuggingFace model, so the peer is lit-embed's dense table, the paper's BERT-S+R. Inputs:
windows of real English text (`real_text.py`; HashFormer-Proj hashes its words), the headline, and
uniformly random ids (random codes) as labelled second rows. The models of one batch size take turns
step by step (a warm-up, then 3 rounds): medians, spreads, and speed-ups as the median of the per-round
ratios with their range. Target (issue 8): subspace at least 1.3x faster than dense.

What bounds it on two CPU cores: XLM-R_S's encoder needs about 630 GFLOP a step at 32 x 128 (8 layers of
3.1M matmul weights, 4096 tokens, forward + backward), seconds on two cores, against the table's fixed
0.2-0.3 s; at 4 x 128 the encoder's step is about 0.6 s and the same saving weighs more.
`python tools/bench/profile_step.py` (XLM-R_S S+R, dense, 32 x 128, 2 threads, busy machine, 2026-11-24)
showed where a step goes: of 23.7 s, the encoder's matmuls (mm, addmm, bmm) took 13.0 s and dropout's
masks (bernoulli_) 1.6 s, while what the dense table adds is in fused AdamW (2.3 s against subspace's
1.05 s for the encoder alone) and zeroing its gradient (fill_, 0.55 s). The papers' speed-ups are on
GPUs, where the encoder's matmuls are cheap and the table's memory-bound update weighs more.
"""

from __future__ import annotations

import functools

from builders import compose, time_group

TITLE = "S+R pre-training step: XLM-R_S subspace and HashFormer-Proj against the dense table"
STRATEGIES = {"dense (baseline)": "dense", "subspace f=3": "subspace_3", "HashFormer-Proj": "md5_proj"}
SIZES = [(32, 128), (4, 128)]


def run(ctx) -> list[dict]:
    rows = []
    for size in [(4, 32)] if ctx.smoke else SIZES:
        models = {label: functools.partial(compose, "ShuffleRandom", "xlmr_s", embedding, 250002, ctx.smoke)
                  for label, embedding in STRATEGIES.items()}
        rows += [{"model": "XLM-R_S", **row} for row in time_group(
            ctx, models, size, uniform=tuple(STRATEGIES), peers={"vs dense": "dense (baseline)"})]
        ctx.report(rows)
    return rows
