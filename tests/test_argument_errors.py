"""A mistake in a command's arguments: the error, a close match, where help is, exit 2, and no usage block."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lit_embed.commands import compress, helptext, main
from lit_embed.commands.parsing import check_names, close_match
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


#: One of each kind of argument error, for every command that imports torch or Lightning: (argv, first line of stderr).
EARLY = [
    (["fit", "--trainer.max_step", "3", "--config", DEMO], "lit-embed fit: error: unrecognized arguments: --trainer.max_step 3"),
    (["validate", "--config", DEMO, "--ckpt_pth=x.ckpt"], "lit-embed validate: error: unrecognized arguments: --ckpt_pth=x.ckpt"),
    (["test", "--modle.init_args.lr", "1"], "lit-embed test: error: unrecognized arguments: --modle.init_args.lr 1"),
    (["predict", "--config", TYPO], f"lit-embed predict: error: Parser key \"config\": File does not exist: '{TYPO}'"),
    (["fit", "-c", "dmeo.yaml"], "lit-embed fit: error: Parser key \"config\": File does not exist: "),
    (["analyze", "--ckpt", "x.ckpt", "--max_texts", "3"], "lit-embed analyze: error: unrecognized arguments: --max_texts 3"),
    (["compress", "--ckpt", "x", "--out", "y", "--retension", "0.5"],
     "lit-embed compress: error: unrecognized arguments: --retension 0.5"),
    (["compress", f"--config={TYPO}"], f"lit-embed compress: error: Parser key \"config\": File does not exist: '{TYPO}'"),
    (["compress", "--method", "svd", "--rank", "3", "--k", "2"], "lit-embed compress: error: unrecognized arguments: "
     "--k 2 (method 'svd' takes --rank; --k is an option of --method pca, sparse_coding)"),
    (["compress", "--config", "configs/compress/unk.yaml", "--k", "2"], "lit-embed compress: error: unrecognized "
     "arguments: --k 2 (method 'unk' takes no options; --k is an option of --method pca, sparse_coding)"),
    (["compress", "--method=svdd", "--ckpt", "x"], "lit-embed: error: method='svdd' is not known: did you mean 'svd'?"),
    (["export", "--ckp", "x.ckpt", "--out", "y"], "lit-embed export: error: unrecognized arguments: --ckp x.ckpt"),
    (["data", "check", "--config", DEMO, "--trainer.max_step", "3"],
     "lit-embed data check: error: unrecognized arguments: --trainer.max_step 3"),
    (["data", "check", "--config", TYPO], "lit-embed data check: error: Parser key \"config\": File does not exist: "),
    (["data", "chek", "--config", DEMO], "lit-embed: error: usage: lit-embed data check --config FILE"),
    (["fitt", "--config", DEMO], "lit-embed: error: unknown command 'fitt': did you mean fit? one of analyze, compress, convert, data, export, fit, params, plugins, predict, report, sweep, test, validate"),
]


def test_argument_errors_answer_before_torch_or_lightning_is_imported(cached):
    """Every case in one fresh process (none imports anything heavy, so none changes what the next one finds), with
    the help cached (built in another process) as a user's is after the first command."""
    code = f"""
import contextlib, io, sys
from lit_embed.commands import main
for argv in {[argv for argv, _ in EARLY]!r}:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as stopped:
            status = stopped.code
    heavy = sorted(m for m in ('torch', 'pytorch_lightning', 'lightning', 'transformers') if m in sys.modules)
    print(status, heavy, err.getvalue().splitlines()[0])
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=CONFIGS.parent,
                          env={**os.environ, "LIT_EMBED_PLUGINS": "0"})  # none installed, as on a fresh machine
    lines = done.stdout.splitlines()
    assert len(lines) == len(EARLY), done.stderr[-2000:]
    for line, (argv, expected) in zip(lines, EARLY):
        assert line.startswith(f"2 [] {expected}"), (argv, line)


@pytest.fixture
def cached(monkeypatch) -> helptext.Help:
    """The commands' help as a fresh process caches it (built once per test session, in its private cache), without
    the test plugin a machine may have installed beside these tests."""
    monkeypatch.setenv("LIT_EMBED_PLUGINS", "0")
    found = helptext.cached_help()
    assert found is not None
    return found


@pytest.mark.parametrize("command", ["fit", "validate", "test", "predict", "compress"])
def test_every_option_a_command_lists_passes_the_early_check(command, cached):
    for flag in helptext.options(cached.texts[command]):
        if flag not in ("--help", "--config", "--method"):  # a method's name is checked (below): "1" is none
            check_names([command, flag, "1"], cached)
            check_names([command, f"{flag}=1"], cached)


def test_every_option_a_compression_method_lists_passes_the_early_check(cached):
    assert {"sparse_coding", "svd", "fit", "pq"} <= set(cached.methods)
    for method in cached.methods:
        for flag in helptext.options(cached.method(method)):
            if flag not in ("--help", "--config", "--method"):
                check_names(["compress", "--method", method, flag, "1"], cached)


@pytest.mark.parametrize("argv", [
    ["compress", "--method", "svd", "--rank", "3", "--k", "2"],
    ["compress", "--method", "unk", "--rank", "3"],
    ["compress", "--method", "fit", "--strategy", "x.yaml", "--k", "3"],
])
def test_the_early_line_for_a_method_option_is_the_parsers(argv, cached, capsys):
    with pytest.raises(SystemExit):
        check_names(argv, cached)
    early = capsys.readouterr().err
    with pytest.raises(SystemExit):
        compress.main([*argv[1:], "--ckpt", "x", "--out", "y"])  # the command's own parser, after the import
    assert capsys.readouterr().err.splitlines()[0] == early.splitlines()[0]


@pytest.mark.parametrize("argv", [
    ["fit", "--config", DEMO, "--model.init_args.learning_rate", "1e-3", "--data.init_args.batch_size=4"],
    ["fit", "--model.encoder.hidden_size", "8", "--trainer.callbacks+=LearningRateMonitor",
     "--trainer.callbacks.logging_interval", "step", "--trainer.logger.init_args.name", "x"],
    ["compress", "--data.init_args.batch_size", "4", "--k+", "3", "--no_untie"],
    ["compress", "--method", "aq", "--epochs", "2"],  # a method's own options: its parser knows them
    ["compress", "--method=pq", "--groups", "2", "--backend", "torch"],
    ["fit", "-c", "{trainer: {max_steps: 3}}", "--config={seed_everything: 1}"],  # a config given inline
    ["fit", "--print_config=skip_null", "--config", DEMO],
    ["predict", "--config", DEMO, "--", "--not_an_option"],
    ["fit", "--config", "dmeo.yaml", "--help"],  # the help answers
    ["params", "--config", DEMO, "--json", "--data.init_args.batch_size", "4"],  # its help is written by hand
])
def test_what_a_parser_takes_passes_the_early_check(argv, cached):
    """Keys below an option that takes a class or a mapping, configs inline, and anything after ``--`` are the
    parser's to judge, after the import."""
    check_names(argv, cached)


def test_the_early_check_reads_the_cache_only_where_lightning_is_not_imported_yet(cached, monkeypatch, capsys):
    """Where this process has imported Lightning (a Python session, these tests) its parser answers as soon; where
    no help is cached yet (a first run: a --help builds it) or it cannot be (a plugin that fails to import, say), the
    parser judges after the import."""
    typo = ["fit", "--trainer.max_step", "3"]
    monkeypatch.setattr(helptext, "cached_help", lambda **_: pytest.fail("read where Lightning is imported"))
    check_names(typo)
    monkeypatch.delitem(sys.modules, "pytorch_lightning")  # as in a fresh `lit-embed` process
    monkeypatch.setattr(helptext, "cached_help", lambda **_: cached)
    with pytest.raises(SystemExit):
        check_names(typo)
    assert "unrecognized arguments: --trainer.max_step 3" in capsys.readouterr().err
    asked: list[dict] = []
    monkeypatch.setattr(helptext, "cached_help", lambda **how: asked.append(how))  # nothing cached yet
    check_names(typo)
    check_names(["compress", "--method", "svdd"])
    assert asked == [{"build": False}] * 2  # a run never waits to build the cache: its parser says it as soon


def test_a_mistyped_checkpoint_path_suggests_the_nearest_run_folder(tmp_path, monkeypatch, capsys):
    """Each missing part of the path is matched against the names beside it; nothing close suggests nothing."""
    from lit_embed.errors import nearest_path

    (tmp_path / "runs" / "demo" / "version_0" / "checkpoints").mkdir(parents=True)
    (tmp_path / "runs" / "demo_finetune").mkdir()
    monkeypatch.chdir(tmp_path)
    assert nearest_path("runs/dmeo") == Path("runs/demo")
    assert nearest_path("rnus/demo/versoin_0") == Path("runs/demo/version_0")
    assert nearest_path(tmp_path / "runs" / "demo_fintune") == tmp_path / "runs" / "demo_finetune"
    assert nearest_path("runs/demo") is None and nearest_path("elsewhere/x") is None
    for argv in (["export", "--ckpt", "runs/dmeo", "--out", "out"], ["analyze", "--ckpt", "runs/demo/versoin_0"]):
        assert main(argv) == 2
        assert "does not exist (did you mean runs/demo" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
