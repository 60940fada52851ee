"""Run the zoo demo end to end and redraw its figure, ``docs/assets/zoo_demo.png`` (issue 28).

The demo sweep (``configs/sweeps/zoo.yaml``: every strategy at 10%, 1% and 0.1% of the dense table, pre-trained, then
fine-tuned with 3 seeds, offline on the CPU) runs what is not done yet in ``--folder``; then ``lit-embed report`` writes
its tables to ``FOLDER/report.md`` and the Pareto figure to ``FOLDER/pareto.png`` (its TensorBoard image beside it),
copied to ``--figure``. The wall time and the machine's load
(``/proc/loadavg``) at the start and the end are printed: the runtime says little without them.

    python tools/zoo_demo.py                       # runs/sweeps/zoo, docs/assets/zoo_demo.png
    python tools/zoo_demo.py --folder /tmp/zoo --figure /tmp/zoo.png
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from lit_embed.commands import main as lit_embed
from lit_embed.files import write_atomic

ROOT = Path(__file__).resolve().parent.parent


def load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", default="runs/sweeps/zoo", help="the sweep's folder (default runs/sweeps/zoo)")
    parser.add_argument("--figure", default=str(ROOT / "docs" / "assets" / "zoo_demo.png"), help="the PNG to write")
    args = parser.parse_args()
    print(f"load average at the start: {load()}", flush=True)
    began = time.monotonic()
    status = lit_embed(["sweep", "--config", str(ROOT / "configs" / "sweeps" / "zoo.yaml"), "--folder", args.folder])
    took = time.monotonic() - began
    print(f"sweep: exit {status}, {took / 60:.1f} min wall; load average at the end: {load()}", flush=True)
    if status:
        return status
    figure = Path(args.folder) / "pareto.png"  # with its TensorBoard event file, which stays in the sweep folder
    status = lit_embed(["report", args.folder, "--output", str(Path(args.folder) / "report.md"), "--figure", str(figure)])
    if status == 0:
        Path(args.figure).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.figure, figure.read_bytes())
        print(f"copied {figure} to {args.figure}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
