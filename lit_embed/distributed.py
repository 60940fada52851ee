"""What lit-embed needs from torch.distributed under Lightning's DDP, in one place.

* State that defines a model (cluster codes, LSH n-grams, hash keys) is computed on global rank 0
  and broadcast to every rank (:func:`share_buffers`): identical by construction, on any number of
  nodes, with or without a shared filesystem, and whatever floating-point differences the
  machines have.
* The global batch of a paper config is split into devices and accumulation steps for the world
  size at hand (:func:`plan_global_batch`).
* Per-rank state (each rank's data position) is gathered into the checkpoint rank 0 writes
  (:func:`gather_objects`).

Every function is a no-op (or trivial) without a trainer or in a single process, so the same code
runs on a laptop CPU and on many nodes.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import nn

from lit_embed.errors import ConfigError

log = logging.getLogger(__name__)


def is_distributed(trainer) -> bool:
    """Whether ``trainer`` runs more than one process (collectives are needed)."""
    return trainer is not None and trainer.world_size > 1 and torch.distributed.is_initialized()


def persistent_buffers(module: nn.Module) -> dict[str, torch.Tensor]:
    """The persistent buffers of ``module`` by state-dict name: the state that defines it besides its weights."""
    names = {name for name, _ in module.named_buffers()}
    return {name: value.detach().cpu() for name, value in module.state_dict().items() if name in names}


def share_buffers(trainer, module: nn.Module) -> None:
    """Give every rank global rank 0's persistent buffers of ``module`` (a collective: call it on every rank).

    The buffers travel as one pickled object (``broadcast_object_list``), so they may differ in shape
    between ranks beforehand (an LSH vocabulary fitted on rank 0 only); buffers a module lists in
    ``sized_by_checkpoint`` take rank 0's sizes on load.
    """
    if not is_distributed(trainer):
        return
    state = trainer.strategy.broadcast(persistent_buffers(module) if trainer.is_global_zero else None, src=0)
    if not trainer.is_global_zero:
        missing = set(state) - set(persistent_buffers(module))
        if missing:
            raise RuntimeError(f"rank {trainer.global_rank} has no buffers {sorted(missing)[:3]} that rank 0 has")
        module.load_state_dict(state, strict=False)


def gather_objects(trainer, obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (a collective); ``[obj]`` in a single process."""
    if not is_distributed(trainer):
        return [obj]
    gathered: list[Any] = [None] * trainer.world_size
    torch.distributed.all_gather_object(gathered, obj)
    return gathered


def plan_global_batch(global_batch: int, world_size: int, max_per_device: int) -> tuple[int, int]:
    """``(per_device, accumulation)`` with ``per_device * accumulation * world_size == global_batch``.

    The per-device batch is the largest divisor of ``global_batch / world_size`` that fits
    ``max_per_device`` (fewest accumulation steps, so the fewest optimiser-free passes).
    """
    if global_batch < 1 or max_per_device < 1:
        raise ConfigError(f"global_batch_size={global_batch} and batch_size={max_per_device} must be positive")
    if global_batch % world_size:
        fits = [n for n in range(1, global_batch + 1) if global_batch % n == 0]
        raise ConfigError(
            f"global_batch_size={global_batch} does not split over {world_size} devices: use a device count "
            f"that divides it ({', '.join(map(str, fits[:8]))}, ...) or another global batch"
        )
    per_rank = global_batch // world_size
    accumulation = math.ceil(per_rank / max_per_device)
    while per_rank % accumulation:
        accumulation += 1
    return per_rank // accumulation, accumulation


def apply_global_batch(trainer, global_batch: int, max_per_device: int) -> int:
    """Set the trainer's gradient accumulation for ``global_batch``; returns the per-device batch.

    Called in a data module's ``setup``, before Lightning builds the optimiser and its schedule, so
    ``trainer.estimated_stepping_batches`` counts optimiser steps of the global batch.
    """
    if trainer is None:
        return max_per_device
    per_device, accumulation = plan_global_batch(global_batch, trainer.world_size, max_per_device)
    configured = trainer.accumulate_grad_batches  # 1 unless set, or ours from an earlier setup
    if configured not in (1, accumulation):
        raise ConfigError(
            f"trainer.accumulate_grad_batches={configured} conflicts with data.global_batch_size={global_batch}, "
            f"which sets it ({trainer.world_size} devices x {per_device} x {accumulation}): set only one of them"
        )
    trainer.accumulate_grad_batches = accumulation
    log.info(
        "global batch %d = %d device(s) x %d per device x %d accumulation step(s)",
        global_batch, trainer.world_size, per_device, accumulation,
    )
    return per_device


__all__ = ["apply_global_batch", "gather_objects", "is_distributed", "persistent_buffers", "plan_global_batch", "share_buffers"]
