"""Run lit-embed's benchmarks and write their figures beside the baselines measured in the same run.

    python tools/bench/run.py                      # every benchmark, on the CPU
    python tools/bench/run.py cluster memory       # some of them
    python tools/bench/run.py --device cuda        # on a GPU, synchronised timings
    python tools/bench/run.py --threads 1          # one torch thread: steadier figures on a busy machine
    python tools/bench/run.py --smoke --no-write   # smallest sizes, nothing written (CI's smoke test)
    python tools/bench/run.py --headlines          # the benchmarks behind the headlines (headlines.py), 15 rounds
    python tools/bench/run.py --rounds 15 cluster  # every interleaved timing over 15 rounds (default: each benchmark's)
    python tools/bench/run.py --device cuda --quick   # the GPU kit: tests and GPU figures in 7 minutes (kit.py)

Each benchmark writes ``results/<name>.<device>.json`` (again after every complete group of rows, marked
partial until it ends); ``RESULTS.md`` is rebuilt from all of them.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]  # the benchmarks' modules; this checkout's lit-embed, installed or not

import headlines  # noqa: E402
from record import save  # noqa: E402

from harness import RESULTS, Context, environment, markdown_table  # noqa: E402

#: Interleaved rounds of the headline set: the issue's targets are medians and ranges over at least 15.
HEADLINE_ROUNDS = 15


def available() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (default all): {', '.join(available())}")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, default=None, help="torch's intra-op threads (default: one per core)")
    parser.add_argument("--smoke", action="store_true", help="smallest sizes, one repeat: checks the suite runs")
    parser.add_argument("--no-write", action="store_true", help="print the tables, write no result files")
    parser.add_argument("--headlines", action="store_true",
                        help=f"run the benchmarks the headlines read (headlines.py), with --rounds {HEADLINE_ROUNDS} unless given")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds of every timing that takes turns (default: each benchmark's own, 3 to 10)")
    parser.add_argument("--quick", action="store_true", help="with --device cuda: the GPU kit (see kit.py)")
    parser.add_argument("--budget", type=float, default=None, help="with --quick: the kit's seconds in all (default 420)")
    parser.add_argument("--out", default=None, help="with --quick: also copy the log and results here (default $OUT)")
    args = parser.parse_args(argv)
    if not args.quick and (args.budget is not None or args.out is not None):
        parser.error("--budget and --out are the GPU kit's: give them with --device cuda --quick")
    if args.device.startswith("cuda"):
        from kit import gpu_count

        if not gpu_count():
            what = "the GPU kit (--quick)" if args.quick else f"--device {args.device}"
            print(f"No GPU is present (torch sees no CUDA device): {what} needs one, so nothing was run or written; "
                  f"run it on a GPU machine, or leave out --device for the CPU benchmarks.", file=sys.stderr)
            return 2
    if args.quick:
        import kit

        if not args.device.startswith("cuda") or args.names or args.smoke:
            parser.error("--quick is the GPU kit: give it with --device cuda alone (and --budget/--out)")
        return kit.main(args.budget, args.out, RESULTS)
    if args.headlines:
        if args.names:
            parser.error(f"--headlines runs {headlines.benchmarks()}: give no names with it")
        args.names = headlines.benchmarks()
        args.rounds = args.rounds or HEADLINE_ROUNDS
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds {args.rounds} must be at least 1")
    unknown = sorted(set(args.names) - set(available()))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}: choose from {available()}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads {args.threads} must be at least 1")
    import torch

    cores = torch.get_num_threads()
    for name in args.names or available():
        module = importlib.import_module(f"bench_{name}")
        print(f"== {name}: {module.TITLE}", flush=True)
        torch.set_num_threads(args.threads or getattr(module, "THREADS", cores))
        options = ((["--device", args.device] if args.device != "cpu" else []) + (["--threads", str(args.threads)] if args.threads else [])
                   + (["--rounds", str(args.rounds)] if args.rounds else []))
        ctx = Context(device=args.device, smoke=args.smoke, rounds=args.rounds)
        payload = {
            "title": module.TITLE,
            "description": (module.__doc__ or "").strip(),
            "date": datetime.date.today().isoformat(),
            "command": " ".join(["python tools/bench/run.py", name, *options]),
            "environment": environment(ctx),
            "rounds": args.rounds,  # of every interleaved timing; None: each benchmark's own
        }
        path = RESULTS / f"{name}.{args.device.replace(':', '')}.json"
        if not args.no_write:
            ctx.partial = lambda rows, payload=payload, path=path: save(path, payload, rows, complete=False)
        rows = module.run(ctx)
        print(markdown_table(rows), flush=True)
        if not args.no_write:
            save(path, payload, rows, complete=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
