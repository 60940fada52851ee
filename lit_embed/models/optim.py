"""AdamW with warm-up and decay: the papers' optimisation, shared by every module."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from lit_embed.errors import ConfigError


@dataclass
class OptimConfig:
    """Optimiser and learning-rate schedule.

    Defaults are the k-sub-embedding paper's pre-training (Table 5): peak 2e-4, 24k warm-up steps,
    linear decay, weight decay 0.01, Adam betas (0.9, 0.98), eps 1e-6.

    Args:
        lr: peak learning rate.
        warmup: warm-up steps; a value below 1 is a fraction of the total steps (fine-tuning's 0.06).
        schedule: ``linear`` decay to 0, ``cosine_restarts`` (HashFormers' fine-tuning), or ``constant``.
        num_cycles: cycles of ``cosine_restarts`` after the warm-up, each from the peak down to 0 (HashFormers: 5).
    """

    lr: float = 2e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    warmup: float = 24000
    schedule: Literal["linear", "cosine_restarts", "constant"] = "linear"
    num_cycles: int = 1

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"lr={self.lr} must be positive")
        if self.warmup < 0:
            raise ConfigError(f"warmup={self.warmup} must be >= 0 (steps, or a fraction below 1)")
        if self.num_cycles < 1:
            raise ConfigError(f"num_cycles={self.num_cycles} must be 1 or more (the cosine's cycles after warm-up)")

    def warmup_steps(self, total_steps: int) -> int:
        return int(self.warmup * total_steps) if 0 < self.warmup < 1 else int(self.warmup)


def lr_factor(step: int, warmup: int, total: int, schedule: str, num_cycles: int = 1) -> float:
    """Multiplier of the peak learning rate at ``step``."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    if progress >= 1.0:
        return 0.0
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * ((num_cycles * progress) % 1.0)))


#: Devices with PyTorch's fused AdamW kernel: one pass over each tensor instead of a dozen.
FUSED_DEVICES = ("cpu", "cuda")


def configure_adamw(module: nn.Module, config: OptimConfig, total_steps: float | int, fused: bool = True):
    """AdamW (no decay on biases and norms) with a per-step schedule over ``total_steps``.

    With ``fused`` the fused kernel is used where the parameters' device has one: PyTorch's default (a loop of
    elementwise kernels per tensor) spends 1.5 s per step updating XLM-R_S's dense 250002 x 512 table
    on two CPU cores, the fused one 0.09 s (``tools/bench``: embedding_step).
    """
    decay, no_decay = [], []
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "LayerNorm" in name or name.endswith(".bias") else decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=config.betas,
        eps=config.eps,
        fused=(fused and all(p.device.type in FUSED_DEVICES for p in decay + no_decay)) or None,
    )
    total = int(total_steps) if math.isfinite(total_steps) else 10**9
    warmup = config.warmup_steps(total)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup, total, config.schedule, config.num_cycles)
    )
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
