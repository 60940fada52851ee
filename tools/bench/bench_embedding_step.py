"""Embedding training step (forward, backward, AdamW step) of every strategy against nn.Embedding.

Each strategy maps a batch of 32 x 128 codes (random vocabulary ids, or a hash strategy's random
codes: words are hashed once each in the data pipeline, see the tokenise + hash benchmark) to
vectors, takes a fixed random gradient back, and steps lit-embed's AdamW (the papers' settings).
The baseline is `nn.Embedding(V, d)` with dense gradients and the same AdamW; the hash strategies'
cost does not depend on V, only their baseline's does. Strategies as in `configs/embedding/`:
subspace with radix codes, HashFormer Emb (50265 buckets), Pool (T=128, k=10), Add and Proj
(T=128), ProFormer (T=420). Each strategy's steps alternate with the baseline's (a warm-up, then 7
rounds, medians), so a busy machine slows both alike. The last row of each size is the baseline
with PyTorch's default AdamW (a loop of elementwise kernels on the CPU), which lit-embed used
before it took the fused kernel. Target (issue 8): subspace at least 3x faster than nn.Embedding
at 250002 x 512.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable

import torch
from torch import nn

from harness import time_interleaved

TITLE = "Embedding step: every strategy against nn.Embedding (forward, backward, AdamW)"


def strategies(vocab_size: int, hidden: int) -> dict[str, Callable[[], nn.Module]]:
    from lit_embed.embeddings import (
        DenseEmbedding,
        HashAdd,
        HashEmbedding,
        HashPool,
        HashProj,
        ProFormerEmbedding,
        SubspaceEmbedding,
    )

    return {
        "dense (lit-embed)": lambda: DenseEmbedding(vocab_size, hidden),
        "subspace f=3": lambda: SubspaceEmbedding(vocab_size, hidden, num_tables=3),
        "subspace f=8": lambda: SubspaceEmbedding(vocab_size, hidden, num_tables=8),
        "HashFormer-Emb, 50265 buckets": lambda: HashEmbedding(None, hidden, num_buckets=50265),
        "HashFormer-Pool, T=128, k=10": lambda: HashPool(None, hidden),
        "HashFormer-Add, T=128": lambda: HashAdd(None, hidden),
        "HashFormer-Proj, T=128": lambda: HashProj(None, hidden),
        "ProFormer, T=420": lambda: ProFormerEmbedding(None, hidden),
    }


UNFUSED = "nn.Embedding, PyTorch's default AdamW (unfused)"


def unfused_adamw(module: nn.Module) -> torch.optim.Optimizer:
    """lit-embed's AdamW settings with PyTorch's default implementation (what lit-embed used before issue 8)."""
    from lit_embed.models.optim import OptimConfig

    config = OptimConfig()
    return torch.optim.AdamW(module.parameters(), lr=config.lr, betas=config.betas, eps=config.eps,
                             weight_decay=config.weight_decay)


def step_timer(module: nn.Module, codes: torch.Tensor, hidden: int, ctx, optimizer=None) -> Callable[[], None]:
    """Forward ``codes``, back-propagate a fixed random gradient, step the optimiser (default: lit-embed's AdamW)."""
    from lit_embed.models.optim import OptimConfig, configure_adamw

    module.to(ctx.device).train()
    codes = codes.to(ctx.device)
    grad = torch.randn(*codes.shape[:2], hidden, generator=torch.Generator().manual_seed(0)).to(ctx.device)
    optimizer = optimizer or configure_adamw(module, OptimConfig(), 10_000)["optimizer"]

    def step():
        optimizer.zero_grad(set_to_none=True)
        module(codes).backward(grad)
        optimizer.step()

    return step


def run(ctx) -> list[dict]:
    shapes = [(1000, 32)] if ctx.smoke else [(50265, 512), (50265, 768), (250002, 512), (250002, 768)]
    size = (4, 16) if ctx.smoke else (32, 128)
    rows = []
    for vocab_size, hidden in shapes:
        shape = f"{vocab_size} x {hidden}"
        ids = torch.randint(vocab_size, size, generator=torch.Generator().manual_seed(0))
        baseline = nn.Embedding(vocab_size, hidden)
        base_step = step_timer(baseline, ids, hidden, ctx)
        base_seconds: list[float] = []
        base_row = {"V x d": shape, "strategy": "nn.Embedding (baseline)", "embedding params": vocab_size * hidden}
        rows.append(base_row)
        candidates = strategies(vocab_size, hidden)
        candidates[UNFUSED] = functools.partial(nn.Embedding, vocab_size, hidden)
        for name, build in candidates.items():
            module = build()
            codes = module.code_sampler()(size) if getattr(module, "vocab_size", vocab_size) is None else ids
            step = step_timer(module, codes, hidden, ctx, unfused_adamw(module) if name == UNFUSED else None)
            timing = time_interleaved({"baseline": base_step, name: step}, ctx, warmup=1, repeat=7)
            base, own = timing["baseline"]["seconds"], timing[name]["seconds"]
            base_seconds.append(base)
            params = module.num_embedding_parameters() if hasattr(module, "num_embedding_parameters") else module.weight.numel()
            rows.append({"V x d": shape, "strategy": name, "embedding params": params, "ms per step": 1000 * own,
                         "nn.Embedding ms, same rounds": 1000 * base, "speed-up vs nn.Embedding": base / own})
            del module, step
        base_row["ms per step"] = 1000 * statistics.median(base_seconds)
        del baseline, base_step
    return rows
