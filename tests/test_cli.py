"""The command line: every config builds, `params` reproduces the papers' counts, bad input fails clearly."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.numpy import load_file

from lit_embed._compat import no_weight_initialisation
from lit_embed.commands import main
from lit_embed.commands.lightning import LitEmbedCLI
from lit_embed.measures.accounting import parameter_report
from tests.helpers import CONFIGS, TINY_CANINE, TINY_CANINE_TABLES
from tests.helpers.cli import params_json, run_params

ON_CPU = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "auto",
          "--trainer.precision", "32-true", "--trainer.logger", "false"]

# Table 1 of the subspace papers (k-sub-embedding Table 1 / CIKM poster Table 1), d = 512.
PAPER_EMBEDDING_PARAMS = {
    "roberta_s": 25_735_680,   # 25.7M
    "roberta_s_2se": 115_200,  # 115k
    "roberta_s_3se": 18_944,   # 18.9k
    "roberta_s_4se": 7_680,
    "roberta_s_6se": 3_584,
    "roberta_s_8se": 2_048,    # 2k
    "roberta_s_3se_equal_q50": 25_600,   # 25.6k (Table 3)
    "roberta_s_3se_equal_q100": 51_200,  # 51.2k (Table 3); naive k-means sizes its tables by the matrix (below)
    "xlmr_s": 128_001_024,     # 128M
    "xlmr_s_3se": 32_256,      # 32k
    "xlmr_s_3se_clustered": 65_536,
}
PAPER_TOTAL_MILLIONS = {"roberta_s": 51, "xlmr_s": 154}  # "26M" for every sub-embedding model


def experiment_configs() -> list[Path]:
    return sorted((CONFIGS / "experiments").rglob("*.yaml"))


def offline_overrides(path: Path, minilm_path: str) -> list[str]:
    """A config whose encoder is a hub model (``pretrained:``) builds here with the packaged MiniLM in its place,
    and one whose corpus is files the user downloads (CC-100) with the shipped sample corpus, read whole, in their
    place."""
    import yaml

    config = yaml.safe_load(path.read_text())
    overrides = []
    encoder = config["model"]["init_args"].get("encoder")
    if encoder == "../../backbone/canine_c.yaml":  # google/canine-c: a tiny CANINE in its place
        overrides += ["--model.init_args.encoder", TINY_CANINE, "--model.init_args.embedding", TINY_CANINE_TABLES]
    if isinstance(encoder, dict) and encoder.get("init_args", {}).get("pretrained"):
        overrides += ["--model.init_args.encoder.init_args.pretrained", minilm_path, "--model.init_args.vocab_size", "30522"]
    data = config.get("data")
    data = yaml.safe_load((path.parent / data).read_text()) if isinstance(data, str) else data or {}
    files = (data.get("init_args") or {}).get("files")
    if files and files != ["sample-corpus"]:
        overrides += ["--data.init_args.files", "[sample-corpus]"]
        if (data.get("init_args") or {}).get("token_budgets"):  # budgets name the files replaced
            overrides += ["--data.init_args.token_budgets", "null"]
    return overrides


@pytest.mark.parametrize("path", [*sorted(CONFIGS.glob("demo*.yaml")), *experiment_configs()], ids=lambda p: p.stem)
def test_every_experiment_config_parses_and_builds(path, tmp_path, monkeypatch, minilm_path):
    """Each config builds its model, data module and trainer at its paper's size. torch's and transformers' random
    initialisers are left out (half of this test's time): what is checked is what the config builds, not the values
    drawn (each strategy's initialisation is the contract tests' and the trainings')."""
    monkeypatch.chdir(tmp_path)
    with no_weight_initialisation():
        cli = LitEmbedCLI(args=["--config", str(path), *ON_CPU, *offline_overrides(path, minilm_path)], run=False)
    assert cli.model is not None and cli.datamodule is not None and cli.trainer is not None
    report = parameter_report(cli.model)
    assert 0.0 <= report["pcr_all"] <= 1.0 and 0.0 <= report["pcr_emb"] <= 1.0 and 0.0 < report["poep"] <= 1.0
    # Every shipped run writes results.json with the papers' figures, without extra work.
    callbacks = {type(c).__name__ for c in cli.trainer.callbacks}
    assert {"EfficiencyMonitor", "ResultsWriter"} <= callbacks, f"{path.name}: add them to its trainer callbacks"


@pytest.mark.parametrize("name", sorted(PAPER_EMBEDDING_PARAMS))
def test_params_reproduce_table_1(name):
    report = run_params(CONFIGS / "experiments" / "subspace" / f"{name}.yaml")
    assert report["embedding_params"] == PAPER_EMBEDDING_PARAMS[name]
    millions = report["total_params"] / 1e6
    assert round(millions) == PAPER_TOTAL_MILLIONS.get(name, 26)
    base = "xlmr_s" if name.startswith("xlmr") else "roberta_s"
    assert report["baseline_embedding_params"] == PAPER_EMBEDDING_PARAMS[base]
    assert report["pcr_emb"] == pytest.approx(1 - report["embedding_params"] / report["baseline_embedding_params"])


def test_params_sizes_naive_kmeans_tables_by_the_clustering_of_the_given_matrix(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LIT_EMBED_CACHE", str(tmp_path))
    config = str(CONFIGS / "experiments" / "subspace" / "roberta_s_3se_kmeans_q100.yaml")
    assert main(["params", "--config", config]) == 2  # roberta-base's matrix is on the hub, which is off here
    assert "could not load pretrained model 'roberta-base'" in capsys.readouterr().err
    given = ["--model.init_args.vocab_size", "30522", "--model.init_args.embedding.init_args.table_size", "20",
             "--model.init_args.embedding.init_args.assignment.init_args.source", "all-MiniLM-L6-v2",
             "--model.init_args.embedding.init_args.assignment.init_args.max_iter", "2"]
    report = params_json(["params", "--config", config, "--json", *given])
    cached = list((tmp_path / "assignments").glob("*.safetensors"))
    assert len(cached) == 1
    rows = load_file(cached[0])["codes"].max(0) + 1  # each table holds the largest index it must
    assert rows[0] <= 20 < rows[2]
    assert report["embedding_params"] == int(rows @ [170, 170, 172]) > 20 * 512
    assert params_json(["params", "--config", config, "--json", *given]) == report  # from the cache
    assert list((tmp_path / "assignments").glob("*.safetensors")) == cached


def test_params_prints_a_readable_table(capsys):
    assert main(["params", "--config", str(CONFIGS / "experiments/subspace/roberta_s_3se.yaml")]) == 0
    out = capsys.readouterr().out
    assert "18,944 (18.9K)" in out and "PCR_Emb" in out and "99.93%" in out


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*/*.yaml")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_piece_config_parses(path):
    """Pieces are exercised through the experiments; each also parses on its own."""
    import yaml

    piece = yaml.safe_load(path.read_text())
    assert isinstance(piece, dict) and piece
    group = path.parent.name
    if group in ("backbone", "embedding", "data"):
        assert "class_path" in piece
    if group == "trainer":
        import inspect

        from pytorch_lightning import Trainer

        assert set(piece) <= set(inspect.signature(Trainer).parameters)


# -- bad input: a clear message naming the value and the fix, a non-zero exit --------------------------


def demo_args(*extra: str) -> list[str]:
    return ["--config", str(CONFIGS / "demo.yaml"), *extra]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model.init_args.embedding.init_args.table_size", "10"], "Q=10 gives 10^3=1000 codes for 30522 tokens: raise Q to at least 32"),
        (["--model.init_args.embedding.init_args.num_tables", "0"], "num_tables=0 must be at least 1"),
        (["--model.init_args.embedding.init_args.num_tables", "65"], "num_tables=65 exceeds hidden_size=64"),
        (["--model.init_args.vocab_size", "null"],
         "SubspaceEmbedding needs the vocabulary size: set model.init_args.vocab_size (50265 for RoBERTa's tokenizer)"),
        (["--model.init_args.vocab_size", "null", "--model.init_args.embedding", str(CONFIGS / "embedding" / "md5_add.yaml")],
         "MaskedLM predicts vocabulary ids, which HashAdd does not have: pre-train it with lit_embed.models.ShuffleRandom"),
        (["--model.init_args.embedding", str(CONFIGS / "embedding" / "md5_add.yaml")],
         "HashAdd hashes an unlimited vocabulary, so vocab_size must be unset (got 30522)"),
    ],
)
def test_bad_strategy_arguments_exit_non_zero_with_the_fix(extra, message, capsys):
    assert main(["params", *demo_args(*extra)]) == 2
    assert message in capsys.readouterr().err


def test_unknown_strategy_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["params", *demo_args("--model.init_args.embedding", "lit_embed.embeddings.NoSuchEmbedding")])
    assert exit_info.value.code != 0
    assert "NoSuchEmbedding" in capsys.readouterr().err


def test_params_counts_known_hub_models_offline_without_their_weights():
    # LINE's Japanese DistilBERT (the sparse-coding paper's JGLUE model): Table 8's 25.17M embedding parameters.
    report = run_params(CONFIGS / "experiments" / "finetune" / "jglue" / "jsts.yaml")
    assert report["embedding_params"] == 32768 * 768 and report["total_params"] == 68_087_808


# -- a CLI that shows itself -----------------------------------------------------------------------------


def test_help_lists_every_command_and_help_version_and_report_import_no_torch(tmp_path):
    """``--help``, ``--version`` and ``report`` answer without torch or Lightning (what made them take seconds)."""
    import json
    import subprocess
    import sys

    from lit_embed.commands import COMMANDS, LIGHTNING_COMMANDS
    from lit_embed.runs.results import RESULTS_FILE
    from lit_embed.storage.files import write_json_atomic

    write_json_atomic(tmp_path / "run" / RESULTS_FILE, {"format": 1, "label": "demo", "task": None, "seed": 0,
                                                       "metrics": {"val/loss": 6.8}})
    probe = (
        "import contextlib, io, json, sys\n"
        "from lit_embed.commands import main\n"
        "outs = []\n"
        "for argv in (['--help'], ['--version'], ['report', sys.argv[1]]):\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        outs.append([main(argv), out.getvalue()])\n"
        "heavy = [m for m in ('torch', 'pytorch_lightning', 'transformers', 'datasets') if m in sys.modules]\n"
        "print(json.dumps({'outs': outs, 'heavy': heavy}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, check=True)
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["heavy"] == []
    (status, help_text), (version_status, version), (report_status, report) = answer["outs"]
    assert status == version_status == report_status == 0
    assert all(command.summary for command in COMMANDS.values()), "give every command a docstring: its line of help"
    for name in (*LIGHTNING_COMMANDS, *COMMANDS):
        line = next((line for line in help_text.splitlines() if line.split()[:1] == [name]), None)
        assert line is not None and len(line.split()) > 3, f"{name} is not listed with its line of help"
    assert version.startswith("lit-embed 0.1.0 (torch ") and "pytorch-lightning" in version
    assert "| demo (pre-training) | 6.8 |" in report


def test_params_help_is_short_and_names_json(capsys):
    assert main(["params", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--json" in out and "--config FILE" in out and len(out.splitlines()) < 20


def test_no_command_prints_the_commands_and_exits_2(capsys):
    assert main([]) == 2
    assert "commands:" in capsys.readouterr().err


def test_assemble_builds_what_the_command_builds_from_a_file_or_a_dict_and_runs_it_alike(tmp_path, monkeypatch):
    """``assemble`` (given configs/demo.yaml, or its content as a dict) builds what LitEmbedCLI builds for ``lit-embed fit
    --config configs/demo.yaml``: the same classes, callbacks in the same order, logger, hyper-parameters and seeded
    weights, each run in a folder of its own; :meth:`Assembled.run` and the command hand trainer.fit the run built."""
    import pytorch_lightning as pl
    import torch
    import yaml

    from lit_embed.commands.lightning import assemble

    monkeypatch.chdir(tmp_path)
    fitted = []
    monkeypatch.setattr(pl.Trainer, "fit", lambda trainer, model, datamodule=None, **kwargs: fitted.append(
        (trainer, model, datamodule)))
    demo, quiet = CONFIGS / "demo.yaml", ["--trainer.enable_progress_bar", "false"]
    reference = LitEmbedCLI(args=["fit", "--config", str(demo), *quiet])  # runs (fit) as it is built
    content = yaml.safe_load(demo.read_text())
    for key in ("encoder", "embedding"):  # the files it names, relative to the working folder in a dict
        content["model"]["init_args"][key] = str(CONFIGS / content["model"]["init_args"][key])
    built = [assemble(demo, *quiet), assemble(content, *quiet)]
    built[1].run()
    assert main(["fit", "--config", str(demo), *quiet]) == 0
    assert fitted[:2] == [(reference.trainer, reference.model, reference.datamodule),
                          (built[1].trainer, built[1].model, built[1].datamodule)] and len(fitted) == 3

    def described(trainer, model, data):
        return (type(model), type(model.embedding), type(data), [type(c) for c in trainer.callbacks],
                [type(logger) for logger in trainer.loggers], trainer.max_steps, dict(model.hparams))

    for trainer, model, data in [*((run.trainer, run.model, run.datamodule) for run in built), fitted[2]]:
        assert described(trainer, model, data) == described(reference.trainer, reference.model, reference.datamodule)
        assert all(torch.equal(value, model.state_dict()[key]) for key, value in reference.model.state_dict().items())
    assert len({run.trainer.log_dir for run in built} | {reference.trainer.log_dir, fitted[2][0].log_dir}) == 4
