"""Embedding training step (forward, backward, optimiser step) of every strategy against the best of
the ways an expert would train a full V x d table.

Each set-up, on one torch thread, maps a batch of 32 x 128 codes to vectors, takes a fixed random
gradient back, and steps its optimiser with lit-embed's AdamW settings (the papers'). The codes, the
headline: windows of real English text read on this machine (`real_text.py`: WordPiece ids, or a hash
strategy's codes of its words; words are hashed once each in the data pipeline, see the tokenise + hash
benchmark); the labelled second rows: uniformly random ids (or random codes), the touched-row peers'
worst case. "unique rows" is the number of distinct ids in the batch.

The peers, each a full table: `nn.Embedding(V, d)` with a dense gradient and lit-embed's fused AdamW
(issue 8's baseline); `nn.Embedding(V, d, sparse=True)` with `torch.optim.SparseAdam` (sparse
gradients, Adam on the touched rows, no weight decay: SparseAdam has none); and a dense table
trained by AdamW on the touched rows only (the batch's unique ids gathered, the gradient computed for
those rows alone, PyTorch's fused AdamW kernel stepping the gathered rows and their moments, which
are scattered back). The last two are "lazy" Adam: a row the batch misses keeps its moments and skips
weight decay, which dense AdamW does not; lit-embed's strategies are trained with dense AdamW.
Tables: 50265 x 512 and 250002 x 512 (RoBERTa_S, XLM-R_S); 50265 x 768 and 250002 x 768 with `BENCH_SLOW=1`.
Strategies as in `configs/embedding/`: lit-embed's dense, subspace with radix codes, HashFormer Emb
(50265 buckets), Pool (T=128, k=10), Add and Proj (T=128), ProFormer (T=420); the hash strategies'
cost does not depend on V. The last row is nn.Embedding with PyTorch's default AdamW (a loop of
elementwise kernels on the CPU), which lit-embed used before issue 8.

Time: the peers take turns step by step (a warm-up, then 7 rounds, medians) and the fastest is the
best peer; every other row then takes turns with the best peer the same way, and "speed-up vs best
peer" is the median over those rounds of the best peer's time over the row's ("speed-up range": the
lowest and highest), so a busy machine slows both alike. Memory: each set-up runs two steps (the second holds the table, its optimiser state and the
step's gradient at once) in a process of its own, after two steps of the same set-up on a 1000-row
table (so that what loads on first use is not counted); "step memory MB" is the peak resident set
size (VmHWM, lowered to the resident size through /proc/self/clear_refs before the module is built)
less that resident size, CUDA's peak allocated bytes less those allocated before on a GPU. "memory
vs best peer" divides by the lowest peer figure (real-text rows only: memory does not depend on the ids).

The physical limit: "MB a step must move" counts, in 4-byte floats, what a step cannot avoid reading or
writing once: the output and its gradient (2 x tokens x d), the batch's codes, the rows of a table a
forward reads (the batch's unique rows, for the tables larger than the caches), and for every parameter
the optimiser steps, its weight, gradient and two moments read and the weight and moments written, plus
the gradient's write (8 accesses; all V x d parameters for AdamW on a dense table, the U x d touched ones
for the lazy peers, Q x d for subspace). The machine's memory bandwidth is measured in the same run,
before each table size, with the benchmark's threads (`harness.memory_bandwidth`: the fastest of 7 copies
of 512 MB); "ms at bandwidth" is the bytes over it, and "% of limit" that over the step's median time.
The hash strategies' projections are bound by arithmetic rather than memory, so their "% of limit" is low
by construction; for those that are one matrix product (Proj, Add, ProFormer) "GFLOP a step" counts its
floating-point operations, forward and the weight's gradient (4 x distinct codes x features x d; the bits need no
gradient), and "ms at GEMM rate" is them at the machine's float32 matrix-product rate, measured in the same run at
the forward's shape (`harness.gemm_rate`: the fastest of 7 products of 1194 x 128 by 128 x d, real text's distinct
codes at 32 x 128): the arithmetic's floor, to set beside the peer's whole step. Target (issue 8): subspace at
least 3x faster than nn.Embedding at 250002 x 512.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import nn

from builders import IDS
from harness import (
    child_main,
    gemm_rate,
    in_children,
    memory_bandwidth,
    memory_of,
    ratio_range,
    speedup,
    spread_cell,
    time_interleaved,
)

TITLE = "Embedding step: every strategy against the best peer (nn.Embedding + fused AdamW, SparseAdam, touched-row AdamW)"
THREADS = 1  # steadier figures on a shared machine; the memory bandwidth is measured with the same
SIZE, SMOKE_SIZE = (32, 128), (4, 16)
#: A set-up: the module, and the optimiser it is stepped with (given the module).
Setup = tuple[Callable[[], nn.Module], Callable[[nn.Module], object]]


def adamw(module: nn.Module):
    """lit-embed's AdamW (fused where the device has the kernel), as every strategy trains."""
    from lit_embed.models.optim import OptimConfig, configure_adamw

    return configure_adamw(module, OptimConfig(), 10_000)["optimizer"]


def unfused_adamw(module: nn.Module):
    """lit-embed's AdamW settings with PyTorch's default implementation (what lit-embed used before issue 8)."""
    from lit_embed.models.optim import OptimConfig

    c = OptimConfig()
    return torch.optim.AdamW(module.parameters(), lr=c.lr, betas=c.betas, eps=c.eps, weight_decay=c.weight_decay)


def sparse_adam(module: nn.Module):
    from lit_embed.models.optim import OptimConfig

    c = OptimConfig()
    return torch.optim.SparseAdam(list(module.parameters()), lr=c.lr, betas=c.betas, eps=c.eps)


class TouchedRowsAdamW(nn.Module):
    """A dense V x d table whose AdamW reads and writes only the rows a batch touches; it is its own optimiser.

    The forward gathers the batch's unique rows into a leaf tensor, so backward makes a U x d gradient
    (U unique ids) instead of a V x d one; :meth:`step` gathers those rows' AdamW moments, runs
    PyTorch's fused AdamW kernel (foreach where the device has none) on the U rows with one shared
    step count (bias correction as SparseAdam's), and scatters rows and moments back.
    """

    def __init__(self, vocab_size: int, hidden_size: int, init_std: float = 0.02) -> None:
        super().__init__()
        from lit_embed.models.optim import OptimConfig

        self.config = OptimConfig()
        self.register_buffer("weight", torch.empty(vocab_size, hidden_size).normal_(0.0, init_std))
        self.register_buffer("exp_avg", torch.zeros(vocab_size, hidden_size))
        self.register_buffer("exp_avg_sq", torch.zeros(vocab_size, hidden_size))
        self.register_buffer("steps", torch.zeros((), dtype=torch.float32))
        self.touched: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        unique, inverse = torch.unique(ids, return_inverse=True)
        rows = self.weight.index_select(0, unique).requires_grad_()
        self.touched = unique, rows
        return nn.functional.embedding(inverse, rows)

    @torch.no_grad()
    def step(self) -> None:
        from torch.optim.adamw import adamw as adamw_kernel

        from lit_embed.models.optim import FUSED_DEVICES

        unique, rows = self.touched
        exp_avg, exp_avg_sq = self.exp_avg.index_select(0, unique), self.exp_avg_sq.index_select(0, unique)
        fused = rows.device.type in FUSED_DEVICES
        c = self.config
        adamw_kernel([rows], [rows.grad], [exp_avg], [exp_avg_sq], [], [self.steps], fused=fused, foreach=not fused,
                     amsgrad=False, beta1=c.betas[0], beta2=c.betas[1], lr=c.lr, weight_decay=c.weight_decay,
                     eps=c.eps, maximize=False)
        for table, new in ((self.weight, rows), (self.exp_avg, exp_avg), (self.exp_avg_sq, exp_avg_sq)):
            table.index_copy_(0, unique, new)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.touched = None


def peers(vocab_size: int, hidden: int) -> dict[str, Setup]:
    return {
        "nn.Embedding, fused AdamW": (lambda: nn.Embedding(vocab_size, hidden), adamw),
        "nn.Embedding(sparse=True), SparseAdam": (lambda: nn.Embedding(vocab_size, hidden, sparse=True), sparse_adam),
        "dense table, AdamW on touched rows": (lambda: TouchedRowsAdamW(vocab_size, hidden), lambda module: module),
    }


def strategies(vocab_size: int, hidden: int) -> dict[str, Setup]:
    """lit-embed's strategies (configs/embedding), and nn.Embedding with the unfused AdamW last."""
    from lit_embed.embeddings import (
        DenseEmbedding,
        HashAdd,
        HashEmbedding,
        HashPool,
        HashProj,
        ProFormerEmbedding,
        SubspaceEmbedding,
    )

    builds = {
        "dense (lit-embed)": lambda: DenseEmbedding(vocab_size, hidden),
        "subspace f=3": lambda: SubspaceEmbedding(vocab_size, hidden, num_tables=3),
        "subspace f=8": lambda: SubspaceEmbedding(vocab_size, hidden, num_tables=8),
        "HashFormer-Emb, 50265 buckets": lambda: HashEmbedding(None, hidden, num_buckets=50265),
        "HashFormer-Pool, T=128, k=10": lambda: HashPool(None, hidden),
        "HashFormer-Add, T=128": lambda: HashAdd(None, hidden),
        "HashFormer-Proj, T=128": lambda: HashProj(None, hidden),
        "ProFormer, T=420": lambda: ProFormerEmbedding(None, hidden),
    }
    setups: dict[str, Setup] = {name: (build, adamw) for name, build in builds.items()}
    setups["nn.Embedding, PyTorch's default AdamW (unfused)"] = (lambda: nn.Embedding(vocab_size, hidden), unfused_adamw)
    return setups


def codes_of(module: nn.Module, vocab_size: int, ids: str, ctx) -> torch.Tensor:
    """A batch of codes for ``module`` (:data:`builders.IDS`): real-text or uniform ids; a hash strategy's codes
    of real text's words, or its random codes."""
    import real_text

    size = SMOKE_SIZE if ctx.smoke else SIZE
    if getattr(module, "vocab_size", vocab_size) is not None:
        rows = real_text.text_ids(size, vocab_size) if ids == "text" else real_text.uniform_ids(size, vocab_size)
        return torch.from_numpy(rows)
    if ids == "text":
        return torch.from_numpy(real_text.text_codes(module.text_encoder(None), size))
    return module.code_sampler()((size[0], size[1] - 2))


def prepare(setup: Setup, vocab_size: int, hidden: int, ctx, ids: str = "text") -> tuple[nn.Module, Callable[[], None], torch.Tensor]:
    """The module, one training step of it (forward a fixed batch, back-propagate a fixed random gradient, step
    the optimiser) and the batch's codes."""
    build, make_optimizer = setup
    module = build().to(ctx.device).train()
    codes = codes_of(module, vocab_size, ids, ctx).to(ctx.device)
    grad = torch.randn(*codes.shape[:2], hidden, generator=torch.Generator().manual_seed(0)).to(ctx.device)
    optimizer = make_optimizer(module)

    def step():
        module(codes).backward(grad)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # at the end: set-ups taking turns hold no gradients

    return module, step, codes


def parameters(module: nn.Module) -> int:
    if hasattr(module, "num_embedding_parameters"):
        return module.num_embedding_parameters()
    return module.weight.numel()


def measure_memory(job: dict, ctx) -> dict:
    """Two steps of one set-up in this process, after two of it on a 1000-row table: its step memory."""
    vocab_size, hidden = job["shape"]

    def two_steps(vocab_size: int) -> None:
        setup = {**peers(vocab_size, hidden), **strategies(vocab_size, hidden)}[job["label"]]
        _, step, _ = prepare(setup, vocab_size, hidden, ctx)
        step()
        step()

    return {"step memory MB": memory_of(lambda: two_steps(vocab_size), ctx.device, lambda: two_steps(1000))}


def shapes(ctx) -> list[tuple[int, int]]:
    """RoBERTa_S's and XLM-R_S's tables; their BERT-base widths (768) with ``BENCH_SLOW=1`` (three 250002 x 768
    peers with their AdamW moments hold 7 GB at once)."""
    if ctx.smoke:
        return [(1000, 32)]
    return [(50265, 512), (250002, 512)] + ([(50265, 768), (250002, 768)] if os.environ.get("BENCH_SLOW") else [])


LAZY = ("nn.Embedding(sparse=True), SparseAdam", "dense table, AdamW on touched rows")
#: Set-ups whose forward reads rows of a table larger than the caches (the rest hold a few thousand rows).
TABLES = (*LAZY, "nn.Embedding, fused AdamW", "dense (lit-embed)", "HashFormer-Emb, 50265 buckets",
          "nn.Embedding, PyTorch's default AdamW (unfused)")


def step_bytes(name: str, module: nn.Module, codes: torch.Tensor, hidden: int) -> int:
    """The bytes a step of set-up ``name`` cannot avoid moving (see the module's docstring)."""
    tokens = codes.shape[0] * codes.shape[1]
    unique = len(torch.unique(codes.reshape(tokens, -1), dim=0))
    stepped = unique * hidden if name in LAZY else sum(p.numel() for p in module.parameters())
    rows_read = unique * hidden if name in TABLES else 0
    return 4 * (2 * tokens * hidden + rows_read + 8 * stepped) + codes.element_size() * codes.numel()


def step_flops(module: nn.Module, codes: torch.Tensor, hidden: int) -> int | None:
    """The floating-point operations of a one-product strategy's step (see the module's docstring), else ``None``."""
    from lit_embed.embeddings.hashformer import ProjectedBits

    if not isinstance(module, ProjectedBits):
        return None
    distinct = len(torch.unique(codes.reshape(-1, codes.shape[-1]), dim=0))
    features = module.features(torch.zeros(1, module.num_bits, device=codes.device)).shape[-1]
    return 4 * distinct * features * hidden


def limit_columns(name: str, module: nn.Module, codes: torch.Tensor, hidden: int, seconds: float, bandwidth: dict,
                  gemm: dict) -> dict:
    moved = step_bytes(name, module, codes, hidden)
    at_limit = moved / (bandwidth["GB/s"] * 1e9)
    columns = {"MB a step must move": moved / 2**20, "ms at bandwidth": 1000 * at_limit, "% of limit": 100 * at_limit / seconds}
    flops = step_flops(module, codes, hidden)
    if flops is not None:
        columns.update({"GFLOP a step": flops / 1e9, "ms at GEMM rate": 1000 * flops / (gemm["GFLOP/s"] * 1e9)})
    return columns


def time_shape(vocab_size: int, hidden: int, ids: str, ctx, bandwidth: dict, gemm: dict) -> list[dict]:
    """One table size, one kind of ids: the peers take turns, then every strategy with the best of them."""
    shape = f"{vocab_size} x {hidden}"
    rows = []
    peer_steps, peer_modules, peer_codes = {}, {}, {}
    for name, setup in peers(vocab_size, hidden).items():
        peer_modules[name], peer_steps[name], peer_codes[name] = prepare(setup, vocab_size, hidden, ctx, ids)
    timing = time_interleaved(peer_steps, ctx, warmup=1, repeat=7)
    best = min(timing, key=lambda name: timing[name]["seconds"])
    best_step = peer_steps[best]

    def row(name: str, who: str, module: nn.Module, codes: torch.Tensor, timing: dict, base: str) -> dict:
        ratio, own = speedup(timing, base, name), timing[name]
        return {"V x d": shape, "ids": IDS[ids], "unique rows": len(torch.unique(codes)) if codes.dim() == 2 else None,
                "who": who, "strategy": name, "embedding params": parameters(module),
                "ms per step": 1000 * own["seconds"], "spread": spread_cell(own), "rounds": own["repeats"],
                "best peer ms, same rounds": 1000 * timing[base]["seconds"],
                "speed-up vs best peer": ratio["median"], "speed-up range": ratio_range(ratio),
                **limit_columns(name, module, codes, hidden, own["seconds"], bandwidth, gemm)}

    for name in peer_steps:
        rows.append({**row(name, "peer", peer_modules[name], peer_codes[name], timing, best),
                     "note": "best peer (time)" if name == best else None})
    for name in [n for n in peer_steps if n != best]:
        del peer_steps[name], peer_modules[name]  # only the best peer's table stays
    for name, setup in strategies(vocab_size, hidden).items():
        naive = name.startswith("nn.Embedding")
        if naive and ids != "text":
            continue  # its cost does not depend on the ids, and it is the slowest by far
        module, step, codes = prepare(setup, vocab_size, hidden, ctx, ids)
        timing = time_interleaved({"best peer": best_step, name: step}, ctx, warmup=1, repeat=7)
        rows.append(row(name, "peer (naive)" if naive else "lit-embed", module, codes, timing, "best peer"))
        del module, step
    return rows


def run(ctx) -> list[dict]:
    rows = []
    for vocab_size, hidden in shapes(ctx):
        bandwidth = memory_bandwidth(ctx)
        gemm = gemm_rate(ctx, *((1194, 128) if not ctx.smoke else (64, 16)), hidden)
        for ids in IDS:
            shape_rows = time_shape(vocab_size, hidden, ids, ctx, bandwidth, gemm)
            for row in shape_rows:
                row["memory GB/s (copy)"] = bandwidth["GB/s"]
                row["GEMM GFLOP/s"] = gemm["GFLOP/s"]
            rows += shape_rows
            ctx.report(rows)
    text_rows = [row for row in rows if row["ids"] == IDS["text"]]
    jobs = [{"shape": [int(n) for n in row["V x d"].split(" x ")], "label": row["strategy"]} for row in text_rows]
    for row, memory in zip(text_rows, in_children(__file__, jobs, ctx, measure_memory)):
        row.update(memory)
    for shape in {row["V x d"] for row in text_rows}:
        group = [row for row in text_rows if row["V x d"] == shape]
        lowest = min((row for row in group if row["who"] == "peer"), key=lambda row: row["step memory MB"])
        lowest["note"] = ", ".join(filter(None, (lowest.get("note"), "best peer (memory)")))
        for row in group:
            if lowest["step memory MB"] > 0:  # in one process (smoke size) freed memory is reused: figures may be 0
                row["memory vs best peer"] = row["step memory MB"] / lowest["step memory MB"]
    return rows


if __name__ == "__main__":
    child_main(measure_memory)
