"""Pre-training step (forward, backward, AdamW step) of the BERT-base-size HashFormers against BERT-MLM.

The models are built from the shipped experiment configs (`configs/experiments/hashformers/`) and
fed batches of the same shape (sequences x tokens): BERT-MLM (dense 50265 x 768 table, MLM with the
tied decoder, the baseline), BERT-S+R (dense, Shuffle+Random), and HashFormer-MD-Emb (50K) and
-MD-Proj (Shuffle+Random on MD5 codes). The paper (Table 3, V100, 512 tokens) reports S+R 2.1x and
Proj 2.4x faster pre-training than MLM. On a CPU the batch is 4 x 128 tokens (16 x 512 on a GPU); each
model's steps alternate with the baseline's (3 rounds, medians), so a busy machine slows both alike:
compare each row with the baseline time of its own rounds. Our MLM scores only the 15% predicted
positions (the paper's HuggingFace MLM scores all 512), so S+R gains less here than in the paper.
"""

from __future__ import annotations

import statistics

from builders import CONFIGS, batch, from_config, step_timer
from harness import time_call

TITLE = "Pre-training step: HashFormers (Shuffle+Random) against BERT-MLM, BERT-base size"
VARIANTS = {
    "BERT-MLM, dense (baseline)": "bert_mlm",
    "BERT-S+R, dense": "bert_sr",
    "HashFormer-MD-Emb (50K), S+R": "md5_emb50k",
    "HashFormer-MD-Proj, S+R": "md5_proj",
}


def build(name: str, smoke: bool):
    return from_config(CONFIGS / "experiments" / "hashformers" / f"{name}.yaml", smoke)


def run(ctx) -> list[dict]:
    """Each model's steps alternate with the baseline's, so a busy machine slows both alike."""
    size = (4, 32) if ctx.smoke else (16, 512) if ctx.device.startswith("cuda") else (4, 128)
    rounds = 1 if ctx.smoke else 3
    labels = list(VARIANTS)
    baseline = build(VARIANTS[labels[0]], ctx.smoke)
    base_step = step_timer(baseline, batch(baseline, size), ctx)
    base_step()
    rows = []
    for label in labels:
        model = baseline if label == labels[0] else build(VARIANTS[label], ctx.smoke)
        step = base_step if model is baseline else step_timer(model, batch(model, size), ctx)
        step()
        own, base = [], []
        for _ in range(rounds):
            base.append(time_call(base_step, ctx, warmup=0, repeat=1)["seconds"])
            own.append(base[-1] if model is baseline else time_call(step, ctx, warmup=0, repeat=1)["seconds"])
        seconds = statistics.median(own)
        rows.append({
            "model": label, "batch": f"{size[0]}x{size[1]}", "params": model.parameter_counts()["total_params"],
            "ms per sequence": 1000 * seconds / size[0],
            "BERT-MLM ms per sequence, same rounds": 1000 * statistics.median(base) / size[0],
            "speed-up vs BERT-MLM": statistics.median(base) / seconds,
        })
        if model is not baseline:
            del model, step
    return rows
