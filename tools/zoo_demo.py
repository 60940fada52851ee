"""Run the zoo demo end to end and redraw its figure, ``docs/assets/zoo_demo.png`` (issue 28).

The demo sweep (``configs/sweeps/zoo.yaml``: every strategy asked at 10%, 1% and 0.1% of the dense table's bytes, the
cells its structure cannot meet left out, pre-trained, then
fine-tuned with 3 seeds, offline on the CPU) runs what is not done yet in ``--folder``; then ``lit-embed report`` writes
its tables to ``FOLDER/report.md`` and the Pareto figure to ``FOLDER/pareto.png`` (its TensorBoard image beside it),
copied to ``--figure``. The wall time and the machine's load
(``/proc/loadavg``) at the start and the end are printed, and the CPU time (user + sys, this process's and its
children's) per run, which a busy machine inflates less than the wall time: the runtime says little without them.
The runs go one after another in this process (``--launcher inline``: imports once), unless ``--launcher local``.

    python tools/zoo_demo.py                       # runs/sweeps/zoo, docs/assets/zoo_demo.png
    python tools/zoo_demo.py --folder /tmp/zoo --figure /tmp/zoo.png
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from lit_embed.commands import main as lit_embed
from lit_embed.storage.files import write_atomic

ROOT = Path(__file__).resolve().parent.parent


def load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cpu_seconds() -> float:
    """User + system CPU time of this process and of the children it waited for."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def ran_now(folder: Path, since: float) -> int:
    """How many of the sweep's runs ended since ``since`` (``time.monotonic()``): their status files written after."""
    start = time.time() - (time.monotonic() - since)
    found = 0
    for status in (folder / "logs").glob("*/*/status.json"):
        if status.stat().st_mtime >= start and json.loads(status.read_text()).get("state") == "exited":
            found += 1
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", default="runs/sweeps/zoo", help="the sweep's folder (default runs/sweeps/zoo)")
    parser.add_argument("--figure", default=str(ROOT / "docs" / "assets" / "zoo_demo.png"), help="the PNG to write")
    parser.add_argument("--launcher", default="inline", choices=["inline", "local"],
                        help="inline: every run in this process (default); local: a process per run")
    args = parser.parse_args()
    print(f"load average at the start: {load()}", flush=True)
    began, cpu = time.monotonic(), cpu_seconds()
    status = lit_embed(["sweep", "--config", str(ROOT / "configs" / "sweeps" / "zoo.yaml"), "--folder", args.folder,
                        "--launcher", args.launcher])
    took, cpu = time.monotonic() - began, cpu_seconds() - cpu
    ran = ran_now(Path(args.folder), began)
    print(f"sweep: exit {status}, {took / 60:.1f} min wall, {cpu / 60:.1f} min CPU (user + sys), {ran} runs ran "
          f"({took / max(ran, 1):.1f} s wall and {cpu / max(ran, 1):.1f} s CPU a run); load average at the end: {load()}",
          flush=True)
    if status:
        return status
    figure = Path(args.folder) / "pareto.png"  # with its TensorBoard event file, which stays in the sweep folder
    status = lit_embed(["report", args.folder, "--output", str(Path(args.folder) / "report.md"), "--figure", str(figure),
                        "--overwrite"])  # a resumed demo's folder holds the last report
    if status == 0:
        Path(args.figure).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.figure, figure.read_bytes())
        print(f"copied {figure} to {args.figure}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
