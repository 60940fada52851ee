"""The CLI's answers as data, and the text of the README and the docs pages, for tests that compare them."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

README = (REPO / "README.md").read_text()
DOCS = REPO / "docs"


@functools.cache
def run_params(path: Path, *extra: str) -> dict:
    """``lit-embed params --json`` on ``path`` (once per session: README and paper tables share it)."""
    return params_json(["params", "--config", str(path), "--json", *extra])


def params_json(argv: list[str]) -> dict:
    from lit_embed.commands import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return json.loads(out.getvalue())


def drive(cases: list[tuple[str, list[str]]], cwd: Path, env: dict[str, str], listing: Path) -> dict[str, dict]:
    """Each ``(id, argv)`` run in turn as the console script runs it, all in one fresh process (``cli_driver.py``)
    in ``cwd`` with ``env``, the cases written to ``listing``: by id, its ``status``, ``stderr`` and stdout's tail."""
    listing.write_text(json.dumps([{"id": case, "argv": argv, "cwd": str(cwd)} for case, argv in cases]))
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("cli_driver.py")), str(listing)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return {r["id"]: r for r in map(json.loads, done.stdout.splitlines()) if r}


def page(name: str) -> str:
    """The text of the docs page ``docs/<name>.md`` (the front door, README.md, is ``README``)."""
    return (DOCS / f"{name}.md").read_text()


def section(name: str, title: str) -> str:
    """The ``## title`` section of the docs page ``name``."""
    return page(name).split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def code_blocks(language: str, text: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def fit_demo(root: Path, *extra: str, config: Path | None = None) -> Path:
    """``lit-embed fit`` of the demo (or ``config``) logging under ``root`` without a progress bar; its checkpoint."""
    from lit_embed.commands import main

    args = ["fit", "--config", str(config or REPO / "configs" / "demo.yaml"), "--trainer.default_root_dir", str(root),
            "--trainer.logger.init_args.save_dir", str(root), "--trainer.enable_progress_bar", "false", *extra]
    assert main(args) == 0
    return next(root.rglob("*.ckpt"))
