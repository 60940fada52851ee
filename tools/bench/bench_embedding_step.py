"""Embedding training step (forward, backward, optimiser step) of every strategy against the best of
the ways an expert would train a full V x d table.

Each set-up maps a batch of 32 x 128 codes (random vocabulary ids, or a hash strategy's random codes:
words are hashed once each in the data pipeline, see the tokenise + hash benchmark) to vectors, takes
a fixed random gradient back, and steps its optimiser with lit-embed's AdamW settings (the papers').
The peers, each a full table: `nn.Embedding(V, d)` with a dense gradient and lit-embed's fused AdamW
(issue 8's baseline); `nn.Embedding(V, d, sparse=True)` with `torch.optim.SparseAdam` (sparse
gradients, Adam on the touched rows, no weight decay: SparseAdam has none); and a dense table
trained by AdamW on the touched rows only (the batch's unique ids gathered, the gradient computed for
those rows alone, PyTorch's fused AdamW kernel stepping the gathered rows and their moments, which
are scattered back). The last two are "lazy" Adam: a row the batch misses keeps its moments and skips
weight decay, which dense AdamW does not; lit-embed's strategies are trained with dense AdamW.
Strategies as in `configs/embedding/`: lit-embed's dense, subspace with radix codes, HashFormer Emb
(50265 buckets), Pool (T=128, k=10), Add and Proj (T=128), ProFormer (T=420); the hash strategies'
cost does not depend on V. The last row is nn.Embedding with PyTorch's default AdamW (a loop of
elementwise kernels on the CPU), which lit-embed used before issue 8.

Time: the peers take turns step by step (a warm-up, then 7 rounds, medians) and the fastest is the
best peer; every other row then takes turns with the best peer the same way, and "speed-up vs best
peer" divides the best peer's median of those rounds by the row's, so a busy machine slows both
alike. Memory: each set-up runs two steps (the second holds the table, its optimiser state and the
step's gradient at once) in a process of its own, after two steps of the same set-up on a 1000-row
table (so that what loads on first use is not counted); "step memory MB" is the peak resident set
size (VmHWM, lowered to the resident size through /proc/self/clear_refs before the module is built)
less that resident size, CUDA's peak allocated bytes less those allocated before on a GPU. "memory
vs best peer" divides by the lowest peer figure. What bounds the result: uniform random ids touch about
as many rows as the batch has tokens (4096 for 32 x 128), the worst case for the touched-row peers;
text, Zipf-distributed, touches fewer. Target (issue 8): subspace at least 3x faster than
nn.Embedding at 250002 x 512.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from harness import child_main, in_children, memory_of, time_interleaved

TITLE = "Embedding step: every strategy against the best peer (nn.Embedding + fused AdamW, SparseAdam, touched-row AdamW)"
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


def prepare(setup: Setup, vocab_size: int, hidden: int, ctx) -> tuple[nn.Module, Callable[[], None]]:
    """The module and one training step of it: forward a fixed batch, back-propagate a fixed random
    gradient, step the optimiser."""
    build, make_optimizer = setup
    module = build().to(ctx.device).train()
    size = SMOKE_SIZE if ctx.smoke else SIZE
    if getattr(module, "vocab_size", vocab_size) is None:
        codes = module.code_sampler()(size)
    else:
        codes = torch.randint(vocab_size, size, generator=torch.Generator().manual_seed(0))
    codes = codes.to(ctx.device)
    grad = torch.randn(*size, hidden, generator=torch.Generator().manual_seed(0)).to(ctx.device)
    optimizer = make_optimizer(module)

    def step():
        optimizer.zero_grad(set_to_none=True)
        module(codes).backward(grad)
        optimizer.step()

    return module, step


def parameters(module: nn.Module) -> int:
    if hasattr(module, "num_embedding_parameters"):
        return module.num_embedding_parameters()
    return module.weight.numel()


def measure_memory(job: dict, ctx) -> dict:
    """Two steps of one set-up in this process, after two of it on a 1000-row table: its step memory."""
    vocab_size, hidden = job["shape"]

    def two_steps(vocab_size: int) -> None:
        setup = {**peers(vocab_size, hidden), **strategies(vocab_size, hidden)}[job["label"]]
        _, step = prepare(setup, vocab_size, hidden, ctx)
        step()
        step()

    return {"step memory MB": memory_of(lambda: two_steps(vocab_size), ctx.device, lambda: two_steps(1000))}


def shapes(ctx) -> list[tuple[int, int]]:
    return [(1000, 32)] if ctx.smoke else [(50265, 512), (50265, 768), (250002, 512), (250002, 768)]


def time_shape(vocab_size: int, hidden: int, ctx) -> list[dict]:
    shape = f"{vocab_size} x {hidden}"
    rows = []
    peer_steps, peer_params = {}, {}
    for name, setup in peers(vocab_size, hidden).items():
        module, peer_steps[name] = prepare(setup, vocab_size, hidden, ctx)
        peer_params[name] = parameters(module)
    timing = time_interleaved(peer_steps, ctx, warmup=1, repeat=7)
    best = min(timing, key=lambda name: timing[name]["seconds"])
    best_step, best_seconds = peer_steps[best], timing[best]["seconds"]
    for name in peer_params:
        rows.append({"V x d": shape, "who": "peer", "strategy": name, "embedding params": peer_params[name],
                     "ms per step": 1000 * timing[name]["seconds"], "best peer ms, same rounds": 1000 * best_seconds,
                     "speed-up vs best peer": best_seconds / timing[name]["seconds"],
                     "note": "best peer (time)" if name == best else None})
    del peer_steps, module  # only the best peer's table stays
    for name, setup in strategies(vocab_size, hidden).items():
        module, step = prepare(setup, vocab_size, hidden, ctx)
        timing = time_interleaved({"best peer": best_step, name: step}, ctx, warmup=1, repeat=7)
        base, own = timing["best peer"]["seconds"], timing[name]["seconds"]
        who = "peer (naive)" if name.startswith("nn.Embedding") else "lit-embed"
        rows.append({"V x d": shape, "who": who, "strategy": name, "embedding params": parameters(module),
                     "ms per step": 1000 * own, "best peer ms, same rounds": 1000 * base,
                     "speed-up vs best peer": base / own})
        del module, step
    return rows


def run(ctx) -> list[dict]:
    rows = []
    for vocab_size, hidden in shapes(ctx):
        rows += time_shape(vocab_size, hidden, ctx)
    jobs = [{"shape": [int(n) for n in row["V x d"].split(" x ")], "label": row["strategy"]} for row in rows]
    for row, memory in zip(rows, in_children(__file__, jobs, ctx, measure_memory)):
        row.update(memory)
    for shape in {row["V x d"] for row in rows}:
        group = [row for row in rows if row["V x d"] == shape]
        lowest = min((row for row in group if row["who"] == "peer"), key=lambda row: row["step memory MB"])
        lowest["note"] = ", ".join(filter(None, (lowest.get("note"), "best peer (memory)")))
        for row in group:
            if lowest["step memory MB"] > 0:  # in one process (smoke size) freed memory is reused: figures may be 0
                row["memory vs best peer"] = row["step memory MB"] / lowest["step memory MB"]
    return rows


if __name__ == "__main__":
    child_main(measure_memory)
