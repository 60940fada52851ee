"""Peak memory of training each strategy at XLM-R_S size, and checkpoint bytes on disk, against dense.

Each strategy pre-trains XLM-R_S (`configs/backbone/xlmr_s.yaml`, vocabulary 250002) with
Shuffle+Random, the objective every strategy supports, through the Lightning Trainer: 2 steps of 32
x 128 tokens (the second holds weights, gradients, AdamW's state and activations at once), each
strategy in a process of its own so that peaks do not mix (on a GPU in fp16 mixed precision, as
`configs/trainer/gpu.yaml`). Peak memory: the process's peak resident set size on the CPU (it
includes what PyTorch and the libraries take before any model, given as "before the model"), CUDA's
peak allocated bytes on a GPU. (The RSS peak is the process's own, VmHWM: `getrusage`'s ru_maxrss
carries the parent's resident size across fork and exec, so a child of a large parent would report
the parent's.) Checkpoints: `trainer.save_checkpoint`, everything a resumed run
needs (weights, AdamW's state, the strategy's buffers), and weights only. The batches are windows of real
English text (`real_text.py`); memory does not depend on the ids, so no uniform-id row is measured.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import torch

from harness import child_main, in_children

TITLE = "Memory: peak training memory and checkpoint bytes of every strategy at XLM-R_S size, against dense"
STRATEGIES = {
    "dense (baseline)": "dense",
    "subspace f=3": "subspace_3",
    "subspace f=8": "subspace_8",
    "HashFormer-Emb, 50265 buckets": "md5_emb50k",
    "HashFormer-Pool": "md5_pool",
    "HashFormer-Add": "md5_add",
    "HashFormer-Proj": "md5_proj",
    "ProFormer": "proformer",
}


def measure(label: str, ctx) -> dict:
    """Train one strategy briefly in this process; its peak memory and checkpoint sizes."""
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader

    from lit_embed.callbacks import EfficiencyMonitor

    from builders import batch, compose

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    device, smoke = ctx.device, ctx.smoke
    monitor = EfficiencyMonitor(warmup_steps=0)
    gpu = device.startswith("cuda")
    peak = monitor.peak_memory_bytes  # CUDA's peak allocated bytes, or this process's peak RSS (VmHWM)
    before = 0 if gpu else peak()
    model = compose("ShuffleRandom", "xlmr_s", STRATEGIES[label], 250002, smoke)
    size = (4, 32) if smoke else (32, 128)
    loader = DataLoader([batch(model, size)] * 2, batch_size=None)
    trainer = pl.Trainer(accelerator="gpu" if gpu else "cpu", devices=[torch.device(device).index or 0] if gpu else 1,
                         precision="16-mixed" if gpu else "32-true", max_steps=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[monitor])
    trainer.fit(model, train_dataloaders=loader)
    row = {"strategy": label, "params": model.parameter_counts()["total_params"],
           "peak memory MB": peak() / 2**20}
    if before:
        row["before the model, MB"] = before / 2**20
    with tempfile.TemporaryDirectory() as folder:
        for name, weights_only in (("checkpoint MB", False), ("weights-only checkpoint MB", True)):
            path = Path(folder) / "model.ckpt"
            trainer.save_checkpoint(path, weights_only=weights_only)
            row[name] = path.stat().st_size / 2**20
            path.unlink()
    return row


def run(ctx) -> list[dict]:
    rows = in_children(__file__, list(STRATEGIES), ctx, measure)  # a process per strategy (this one at smoke size)
    dense = rows[0]
    for row in rows:
        for key in ("peak memory MB", "checkpoint MB"):
            row[f"{key.removesuffix(' MB')} vs dense"] = row[key] / dense[key]
    return rows


if __name__ == "__main__":
    child_main(measure)
