"""Framework overhead: a lit-embed training step through the Lightning Trainer, configured as
`lit-embed fit` runs it, against a plain PyTorch loop on the same model and batch.

The model: RoBERTa_S + 3-sub-embedding with MLM (`configs/experiments/subspace/roberta_s_3se.yaml`),
batches of 32 x 128 tokens; and the tiny backbone (`configs/backbone/tiny.yaml`, 8 x 32 tokens),
whose step takes milliseconds, so the fixed cost per step shows. The Trainer is built from
`configs/trainer/cpu.yaml` (`gpu.yaml` with --device cuda): EfficiencyMonitor and ResultsWriter
callbacks, TensorBoard logging every 5 steps, progress bar, checkpointing, the module's training_step
with its logged loss and accuracy. The plain loop runs the module's forward (the loss), backward, the
same AdamW and schedule (and fp16 autocast with a gradient scaler where the Trainer's precision is
16-mixed). Both read one pre-collated batch from a DataLoader; a step's time is the interval between
the starts of consecutive steps, so it holds everything a loop does between two steps. Rounds of
Lightning steps and plain steps alternate; the first interval of every round (the optimiser's state
is allocated there) is left out; medians. The batches are windows of real English text (`real_text.py`);
what the framework adds does not depend on the ids, so no uniform-id row is timed. Target (issue 8): the
Lightning step within 5% of the plain loop.
"""

from __future__ import annotations

import contextlib
import io
import logging
import statistics
import tempfile
import time

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from builders import CONFIGS, batch, from_config

TITLE = "Framework overhead: lit-embed training step through the Lightning Trainer against a plain PyTorch loop"


class StepClock(pl.Callback):
    """The clock at the start of every training step (device-synchronised)."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.starts: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.ctx.sync()
        self.starts.append(time.perf_counter())


def trainer_from_config(ctx, steps: int, root: str) -> tuple[pl.Trainer, StepClock]:
    """The Trainer of ``configs/trainer/{cpu,gpu}.yaml``, as the CLI builds it, for ``steps`` steps, plus a clock."""
    from jsonargparse import ArgumentParser

    name = "gpu" if ctx.device.startswith("cuda") else "cpu"
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(pl.Trainer, "trainer", fail_untyped=False)
    config = parser.parse_args(["--trainer", str(CONFIGS / "trainer" / f"{name}.yaml"), "--trainer.max_steps", str(steps),
                                "--trainer.default_root_dir", root, "--trainer.val_check_interval", "null"])
    trainer = parser.instantiate_classes(config).trainer
    clock = StepClock(ctx)
    trainer.callbacks.append(clock)
    return trainer, clock


def lightning_steps(model, loader, ctx, steps: int) -> tuple[list[float], str]:
    """Step intervals of ``trainer.fit`` (its progress bar and messages go nowhere), and its precision."""
    lightning_log = logging.getLogger("pytorch_lightning")
    level = lightning_log.level
    lightning_log.setLevel(logging.ERROR)
    try:
        with tempfile.TemporaryDirectory() as root, contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            trainer, clock = trainer_from_config(ctx, steps, root)
            trainer.fit(model, train_dataloaders=loader)
    finally:
        lightning_log.setLevel(level)
    return [b - a for a, b in zip(clock.starts, clock.starts[1:])][1:], str(trainer.precision)


def plain_steps(model, loader, ctx, steps: int, precision: str) -> list[float]:
    """The loop a PyTorch user writes: forward, backward, AdamW, schedule (with AMP where Lightning uses it)."""
    from lit_embed.models.optim import configure_adamw

    model.to(ctx.device).train()
    configured = configure_adamw(model, model.optim, steps)
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    amp = precision == "16-mixed"
    scaler = torch.amp.GradScaler(enabled=amp)
    starts = []
    for data in loader:
        ctx.sync()
        starts.append(time.perf_counter())
        data = {k: v.to(ctx.device, non_blocking=True) for k, v in data.items()}
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(ctx.device.split(":")[0], dtype=torch.float16, enabled=amp):
            loss, _, _ = model(data)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
    return [b - a for a, b in zip(starts, starts[1:])][1:]


def run(ctx) -> list[dict]:
    experiment = CONFIGS / "experiments" / "subspace" / "roberta_s_3se.yaml"
    cases = {"tiny backbone, 3-sub-embedding MLM": (True, (8, 32), 12 if not ctx.smoke else 4, 5)}
    if not ctx.smoke:
        cases["RoBERTa_S, 3-sub-embedding MLM"] = (False, (32, 128), 5, 3)
    rounds = 1 if ctx.smoke else None
    rows = []
    for label, (tiny, size, steps, case_rounds) in cases.items():
        model = from_config(experiment, smoke=tiny)
        loader = DataLoader([batch(model, size)] * steps, batch_size=None)
        seconds: dict[str, list[float]] = {"Lightning": [], "plain": []}
        for _ in range(rounds or case_rounds):
            intervals, precision = lightning_steps(model, loader, ctx, steps)
            seconds["Lightning"] += intervals
            seconds["plain"] += plain_steps(model, loader, ctx, steps, precision)
        plain, lightning = (statistics.median(seconds[k]) for k in ("plain", "Lightning"))
        common = {"model": label, "batch": f"{size[0]}x{size[1]}", "precision": precision}
        rows.append({**common, "loop": "plain PyTorch (baseline)", "ms per step": 1000 * plain,
                     "steps timed": len(seconds["plain"])})
        rows.append({**common, "loop": "Lightning Trainer (lit-embed fit)", "ms per step": 1000 * lightning,
                     "steps timed": len(seconds["Lightning"]), "overhead ms per step": 1000 * (lightning - plain),
                     "time vs plain": lightning / plain})
    return rows
