"""What fault tolerance costs: atomic checkpoint saves and resumable training loaders.

Checkpoint: a RoBERTa_S + 3-sub-embedding MLM checkpoint (25.8M weights and AdamW's two moments, as
Lightning saves it) written by Lightning's `TorchCheckpointIO` (the baseline: serialise to memory,
then write through fsspec) and by lit-embed's `AtomicCheckpointIO` (serialise into a temporary file
beside the target, fsync, rename), to the same folder. Loader: one epoch of the shipped sample
corpus (1106 blocks of 128 tokens, 16 per batch, RoBERTa masking) through a plain `DataLoader` with
the same sampler (the baseline) and through the `ResumableLoader` the data modules use, which records
its position after every batch; then the time to the first batch when resuming at the epoch's last
batch (the skipped batches' indices are drawn, their blocks are not read).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from harness import time_call

TITLE = "Fault tolerance: atomic checkpoint saves and resumable loaders against Lightning's defaults"


def checkpoint_rows(ctx) -> list[dict]:
    from lightning_fabric.plugins.io import TorchCheckpointIO

    from lit_embed.checkpoints.atomic_io import AtomicCheckpointIO

    params = 200_000 if ctx.smoke else 25_765_376 + 50_265  # RoBERTa_S 3se with its decoder bias
    weights = torch.randn(params)
    checkpoint = {"state_dict": {"w": weights}, "optimizer_states": [{"exp_avg": weights.clone(), "exp_avg_sq": weights.clone()}]}
    rows, baseline = [], None
    with tempfile.TemporaryDirectory() as folder:
        for name, io in (("Lightning TorchCheckpointIO (baseline)", TorchCheckpointIO()), ("AtomicCheckpointIO", AtomicCheckpointIO())):
            path = Path(folder) / "last.ckpt"
            timing = time_call(lambda io=io, path=path: io.save_checkpoint(checkpoint, path), ctx, warmup=1, repeat=3)
            megabytes = path.stat().st_size / 2**20
            baseline = baseline or timing["seconds"]
            rows.append({"what": "save last.ckpt", "how": name, "MB": megabytes, "seconds": timing["seconds"],
                         "time vs baseline": timing["seconds"] / baseline})
    return rows


def loader_rows(ctx) -> list[dict]:
    import functools

    from torch.utils.data import DataLoader, DistributedSampler
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lit_embed.data.collate import MaskedLMCollator
    from lit_embed.data.corpus import CorpusDataModule
    from lit_embed.data.loading import IndexedRows, ResumableLoader

    dm = CorpusDataModule("all-MiniLM-L6-v2", files=["sample-corpus"], max_length=128, val_size=0.05, batch_size=16)
    dm.setup("fit")
    rows = IndexedRows(dm.train_set)
    if ctx.smoke:
        rows.rows = dm.train_set.select(range(64))
    collate = MaskedLMCollator(dm.text_encoder, functools.partial(torch.randint, 30522))
    sampler = DistributedSampler(rows, num_replicas=1, rank=0, shuffle=True, seed=0)
    counter = {"n": 0}
    plain = DataLoader(rows, batch_size=16, sampler=sampler, collate_fn=collate)
    resumable = ResumableLoader(StatefulDataLoader(rows, batch_size=16, sampler=sampler, collate_fn=collate),
                                consumed=lambda: counter["n"])

    def epoch(loader):
        def go():
            counter["n"] = 0
            for _ in loader:
                counter["n"] += 1
        return go

    base = time_call(epoch(plain), ctx, warmup=1, repeat=5)["seconds"]
    ours = time_call(epoch(resumable), ctx, warmup=1, repeat=5)["seconds"]
    batches = len(plain)
    out = [
        {"what": "one epoch of batches", "how": "DataLoader (baseline)", "batches": batches, "seconds": base},
        {"what": "one epoch of batches", "how": "ResumableLoader", "batches": batches, "seconds": ours,
         "time vs baseline": ours / base},
    ]
    # a position at the last batch of the epoch: resuming skips batches-1 batches of indices
    counter["n"] = 0
    iterator = iter(resumable)
    for _ in range(batches - 1):
        next(iterator)
        counter["n"] += 1
    position = resumable.position()
    del iterator

    def first_batch(restore: bool) -> float:
        start = time.perf_counter()
        if restore:
            resumable.restore(position)
        next(iter(resumable))
        return time.perf_counter() - start

    fresh = min(first_batch(False) for _ in range(3))
    resumed = min(first_batch(True) for _ in range(3))
    out += [
        {"what": "first batch", "how": "fresh epoch (baseline)", "batches": 1, "seconds": fresh},
        {"what": "first batch", "how": f"resumed after {batches - 1} batches", "batches": 1, "seconds": resumed,
         "time vs baseline": resumed / fresh},
    ]
    return out


def run(ctx) -> list[dict]:
    return checkpoint_rows(ctx) + loader_rows(ctx)
