"""A mistake in a command's arguments: the error, a close match, where help is, exit 2, and no usage block."""

from __future__ import annotations

import pytest

from lit_embed.commands import main
from lit_embed.commands.parsing import close_match
from tests.helpers import CONFIGS

DEMO = str(CONFIGS / "demo.yaml")
TYPO = str(CONFIGS / "dmeo.yaml")


def status(argv: list[str]) -> int:
    """The exit status of ``lit-embed ARGV`` run in this process."""
    try:
        return main(argv)
    except SystemExit as stopped:
        return stopped.code


@pytest.mark.parametrize("argv, command, suggestion", [
    (["fit", "--config", DEMO, "--trainer.max_step", "3"], "lit-embed fit", "did you mean --trainer.max_steps?"),
    (["test", "--config", TYPO], "lit-embed test", f"did you mean {DEMO}?"),
    (["params", "--config", TYPO], "lit-embed params", f"did you mean {DEMO}?"),
    (["compress", "--config", TYPO], "lit-embed compress", f"did you mean {DEMO}?"),
    (["report", "runs", "--digitz", "3"], "lit-embed report", "did you mean --digits?"),
    (["export", "--ckpt", "x.ckpt", "--out", "y", "--overwrit"], "lit-embed export", "did you mean --overwrite?"),
    (["sweep", "--config", str(CONFIGS / "sweeps" / "demo.yaml"), "--dryrun"], "lit-embed sweep",
     "did you mean --dry-run?"),
])
def test_a_mistyped_option_or_file_gets_one_error_a_close_match_and_where_help_is(argv, command, suggestion, capsys):
    assert status(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"{command}: error: ")
    assert err[1:] == [f"  {suggestion}", f"(`{command} --help` lists the options)"]


def test_nothing_close_suggests_nothing(capsys):
    assert status(["fit", "--config", DEMO, "--completely_unrelated", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "usage" not in err[0] and err[1] == "(`lit-embed fit --help` lists the options)"


@pytest.mark.parametrize("message, options, expected", [
    ("unrecognized arguments: --seed 3", ["--seed_everything", "--config"], None),  # too far to guess
    ("unrecognized arguments: --confg x.yaml", ["--seed_everything", "--config"], "did you mean --config?"),
    ("unrecognized arguments: --confg=x.yaml", ["--config"], "did you mean --config?"),
    ("File does not exist: '/no/such/folder/demo.yaml'", [], None),  # no folder to look in
    ("the model needs a task", ["--config"], None),  # not a typo at all
])
def test_close_match_guesses_only_what_is_close(message, options, expected):
    assert close_match(message, options) == expected
