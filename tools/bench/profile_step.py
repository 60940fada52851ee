"""Where a pre-training step spends its time: torch.profiler over one step per strategy, by phase and op.

    python tools/bench/profile_step.py                                   # XLM-R_S S+R, dense and subspace, 32 x 128
    python tools/bench/profile_step.py --backbone roberta_s --objective MaskedLM --embedding dense subspace_3
    python tools/bench/profile_step.py --device cuda --batch 16x512

Prints each phase's time (forward, backward, optimiser) for every strategy side by side, then the
costliest ops of each: what bounds a speed-up that a benchmark shows.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))

from builders import batch, compose  # noqa: E402
from harness import Context, markdown_table  # noqa: E402

PHASES = ("forward", "backward", "optimizer")


def profiled_step(model, data: dict, ctx: Context, warmup: int = 2):
    """A profile of one training step (after ``warmup`` unprofiled ones), its phases labelled."""
    from lit_embed.models.optim import configure_adamw

    model.to(ctx.device).train()
    data = {k: v.to(ctx.device) for k, v in data.items()}
    optimizer = configure_adamw(model, model.optim, 10_000)["optimizer"]

    def step():
        optimizer.zero_grad(set_to_none=True)
        with record_function("forward"):
            loss = model(data)[0]
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            optimizer.step()
        ctx.sync()

    for _ in range(warmup):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        step()
    return prof


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="xlmr_s", help="a configs/backbone file (default xlmr_s)")
    parser.add_argument("--objective", default="ShuffleRandom", choices=["ShuffleRandom", "MaskedLM"])
    parser.add_argument("--embedding", nargs="+", default=["dense", "subspace_3"], help="configs/embedding files")
    parser.add_argument("--vocab-size", type=int, default=None, help="default: 250002 for xlmr_s, else 50265")
    parser.add_argument("--batch", default="32x128", help="sequences x tokens")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, default=15, help="ops listed per strategy")
    args = parser.parse_args(argv)
    size = tuple(int(n) for n in args.batch.lower().split("x"))
    if len(size) != 2:
        parser.error(f"--batch {args.batch!r} must be sequences x tokens, like 32x128")
    vocab_size = args.vocab_size or (250002 if args.backbone.startswith("xlmr") else 50265)
    ctx = Context(device=args.device)
    sort = "self_cuda_time_total" if ctx.device.startswith("cuda") else "self_cpu_time_total"
    phases, tables = [], {}
    for embedding in args.embedding:
        model = compose(args.objective, args.backbone, embedding, vocab_size)
        prof = profiled_step(model, batch(model, size), ctx)
        events = {e.key: e for e in prof.key_averages()}
        row = {"strategy": embedding}
        for phase in PHASES:
            row[f"{phase} ms"] = events[phase].cpu_time_total / 1000 if phase in events else None
        row["step ms"] = sum(value for key, value in row.items() if key.endswith(" ms") and value)
        phases.append(row)
        tables[embedding] = prof.key_averages().table(sort_by=sort, row_limit=args.rows)
        del model, prof
    print(f"{args.backbone}, {args.objective}, batch {size[0]}x{size[1]}, {args.device}, "
          f"{torch.get_num_threads()} torch threads\n")
    print(markdown_table(phases) + "\n")
    for embedding, table in tables.items():
        print(f"== {embedding}\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
