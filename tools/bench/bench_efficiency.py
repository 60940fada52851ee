"""What measuring time per sample costs: MLM training steps of RoBERTa_S + 3-sub-embedding with the
EfficiencyMonitor's hooks around forward + backward, against the same steps unmeasured.

On a GPU the monitor synchronises the device before each clock reading, which stops the host from
queueing the next step's kernels early; this is the price of a correct figure. The monitor's own
figure (forward + backward per sample) is given beside the whole step's (with the optimiser step).
Measured and unmeasured steps alternate on one model; step figures are medians, the monitor's its own mean.
The batch is a window of real English text (`real_text.py`); what the monitor costs does not depend on the
ids, so no uniform-id row is timed.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from builders import CONFIGS, batch, from_config
from harness import time_interleaved

TITLE = "Time-per-sample measurement: EfficiencyMonitor against unmeasured MLM steps"


def step_timer(model, data: dict, ctx, monitor=None):
    from lit_embed.models.optim import configure_adamw

    model.to(ctx.device).train()
    data = {k: v.to(ctx.device) for k, v in data.items()}
    optimizer = configure_adamw(model, model.optim, 10_000)["optimizer"]

    def step():
        optimizer.zero_grad(set_to_none=True)
        if monitor is not None:
            monitor.on_train_batch_start(None, model, data, 0)
        loss, _, _ = model(data)
        loss.backward()
        if monitor is not None:
            monitor.on_after_backward(None, model)
        optimizer.step()

    return step


def run(ctx) -> list[dict]:
    """Measured and unmeasured steps alternate, so a load change on the machine hits both alike."""
    from lit_embed.callbacks import EfficiencyMonitor

    size = (4, 32) if ctx.smoke else (32, 128)
    warmup = 1 if ctx.smoke else 2
    model = from_config(CONFIGS / "experiments" / "subspace" / "roberta_s_3se.yaml", ctx.smoke)
    data = batch(model, size)
    monitor = EfficiencyMonitor(warmup_steps=warmup)
    monitor.setup(SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(ctx.device))), model, "fit")
    steps = {"unmeasured (baseline)": step_timer(model, data, ctx), "EfficiencyMonitor": step_timer(model, data, ctx, monitor)}
    timing = time_interleaved(steps, ctx, warmup=warmup, repeat=7)
    plain, measured = (timing[name]["seconds"] for name in steps)
    timer = monitor.timers["train"]
    label = f"{size[0]}x{size[1]}"
    return [
        {"steps": "unmeasured (baseline)", "batch": label, "seconds per step": plain,
         "whole step ms/sample": 1000 * plain / size[0]},
        {"steps": "EfficiencyMonitor", "batch": label, "seconds per step": measured,
         "whole step ms/sample": 1000 * measured / size[0],
         "monitor's ms/sample (forward + backward)": 1000 * timer.seconds / timer.samples,
         "time vs unmeasured": measured / plain},
    ]
