"""A callback the DDP tests add to real ``lit-embed`` runs: what each rank saw and holds, in a file per rank."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytorch_lightning as pl
import torch

from lit_embed.distributed import persistent_buffers

#: Texts every rank hashes with its data module's text encoder (the codes must agree across ranks).
PROBE_TEXTS = ["The owl crosses the river at night.", "Kitchens, gardens and schools; unseen-wordz 42!"]


class Probe(pl.Callback):
    """Writes ``OUT/rank{R}.pt`` at the end of a run (or when killing it): per training batch its
    step, loss and block indices; the strategy's persistent buffers; the trainable weights; the
    logged metrics; the codes of :data:`PROBE_TEXTS`; the step training started from.

    Args:
        out: folder of the files.
        kill_at_step: after this optimiser step, every rank writes its file and the whole job is
            killed with SIGKILL (as a node failure would), mid-epoch.
    """

    def __init__(self, out: str, kill_at_step: int | None = None) -> None:
        self.out = Path(out)
        self.kill_at_step = kill_at_step
        self.steps: list[dict] = []
        self.started_at: int | None = None
        self.estimated_steps: float | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.started_at = trainer.global_step
        self.estimated_steps = float(trainer.estimated_stepping_batches)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        index = batch["index"].tolist() if "index" in batch else None
        self.steps.append({"step": trainer.global_step, "batch_idx": batch_idx, "loss": float(loss), "index": index})
        if self.kill_at_step is not None and trainer.global_step >= self.kill_at_step:
            self.dump(trainer, pl_module)
            trainer.strategy.barrier("probe")  # every rank has written its file
            if trainer.is_global_zero:
                os.killpg(os.getpgid(0), signal.SIGKILL)
            signal.pause()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.dump(trainer, pl_module)

    def dump(self, trainer, pl_module) -> None:
        datamodule = trainer.datamodule
        encoder = getattr(datamodule, "text_encoder", None)
        record = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "accumulate": trainer.accumulate_grad_batches,
            "started_at": self.started_at,
            "estimated_steps": self.estimated_steps,
            "global_step": trainer.global_step,
            "steps": self.steps,
            "buffers": persistent_buffers(pl_module.embedding),
            "weights": {n: p.detach().cpu().clone() for n, p in pl_module.named_parameters() if p.requires_grad},
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
            "codes": [c.tolist() for c in encoder.encode(PROBE_TEXTS)] if encoder is not None else None,
        }
        self.out.mkdir(parents=True, exist_ok=True)
        torch.save(record, self.out / f"rank{trainer.global_rank}.pt")


def load(out: str | Path) -> list[dict]:
    """The records of every rank, in rank order."""
    files = sorted(Path(out).glob("rank*.pt"))
    return [torch.load(f, weights_only=False) for f in files]
