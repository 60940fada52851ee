"""`lit-embed report`: the papers' tables from fixture run folders (and from real runs), bad input."""

from __future__ import annotations

import csv
import io
import json
import re
import statistics
from pathlib import Path

import pytest

from lit_embed.commands import main
from lit_embed.data.tasks import XNLI_LANGUAGES
from lit_embed.measures.accounting import compression
from lit_embed.reports.papers import Report
from lit_embed.runs.results import RESULTS_FILE, STATUSES, load_results
from lit_embed.storage.files import write_json_atomic
from tests.helpers import REPO

ROBERTA_S = {"arch": "roberta", "layers": 8, "hidden": 512, "heads": 8, "ffn": 2048}
DENSE = (51_482_112, 25_735_680)  # RoBERTa_S: total, embedding (k-sub-embedding Table 1)
SUB3 = (25_765_376, 18_944)       # + 3-sub-embedding
# The metrics each GLUE task logs (issue 4's names) and a base score per task.
GLUE_METRICS = {
    "mnli": {"matched/accuracy": 0.80, "mismatched/accuracy": 0.79},
    "qnli": {"accuracy": 0.88}, "qqp": {"f1": 0.86, "accuracy": 0.89}, "rte": {"accuracy": 0.66},
    "sst2": {"accuracy": 0.90}, "mrpc": {"accuracy": 0.85, "f1": 0.89}, "cola": {"matthews": 0.40},
    "stsb": {"spearman": 0.87, "pearson": 0.88},
}
#: What HashFormers' tables show (the runs below follow its protocol: results.json's "paper").
HEADLINE = {"mnli": "matched/accuracy", "qnli": "accuracy", "qqp": "f1", "rte": "accuracy", "sst2": "accuracy",
            "mrpc": "accuracy", "cola": "matthews", "stsb": "spearman"}


def parameters(counts: tuple[int, int]) -> dict:
    total, embedding = counts
    return {"total_params": total, "embedding_params": embedding, "baseline_total_params": DENSE[0],
            "baseline_embedding_params": DENSE[1], **compression(embedding, total, DENSE[1], DENSE[0])}


def write_run(root: Path, label: str, task: str | None, seed: int | None, metrics: dict, counts=DENSE,
              efficiency: dict | None = None, backbone: dict = ROBERTA_S, paper: str | None = "hashformers") -> Path:
    folder = root / f"{label}-{task}-{seed}"
    write_json_atomic(folder / RESULTS_FILE, {
        "format": 1, "label": label, "task": task, "seed": seed, "backbone": backbone, "paper": paper,
        "parameters": parameters(counts), "efficiency": efficiency, "metrics": metrics,
    })
    return folder


def score(label: str, task: str, seed: int) -> float:
    """A made-up score: the task's base, lower for the compressed model, varying with the seed."""
    return GLUE_METRICS[task][HEADLINE[task]] - (0.05 if label == "3se" else 0.0) + 0.01 * seed - 0.002 * seed**2


def glue_runs(root: Path, skip: set[tuple[str, str, int]] = frozenset()) -> list[Path]:
    folders = []
    for label, counts in (("roberta_s", DENSE), ("3se", SUB3)):
        for task, metrics in GLUE_METRICS.items():
            for seed in (0, 1, 2):
                if (label, task, seed) in skip:
                    continue
                logged = {f"test/{name}": value for name, value in metrics.items()}
                logged[f"test/{HEADLINE[task]}"] = score(label, task, seed)
                logged["test/loss"] = 0.5
                folders.append(write_run(root, label, task, seed, logged, counts))
    return folders


def report(folders: list[Path], baseline: Path | None = None, digits: int = 1) -> Report:
    return Report([load_results(f) for f in folders], load_results(baseline) if baseline else None, digits)


def table(tables, title_start: str):
    return next(t for t in tables if t.title.startswith(title_start))


def row(table, name: str) -> dict[str, str]:
    found = next(r for r in table.rows if r[0] == name)
    return dict(zip(table.header, found))


def cell(values: list[float]) -> str:
    return f"{100 * statistics.fmean(values):.1f} ± {100 * statistics.stdev(values):.1f}"


def test_glue_table_has_the_papers_columns_mean_and_std_over_seeds_and_notes_a_missing_seed(tmp_path):
    folders = glue_runs(tmp_path, skip={("3se", "cola", 2)})
    glue = table(report(folders).tables(), "GLUE")
    assert glue.header == ["Model", "MNLI", "QNLI", "QQP", "RTE", "SST", "MRPC", "CoLA", "STS", "Avg"]
    assert [r[0] for r in glue.rows] == ["roberta_s", "3se"]
    base, mine = row(glue, "roberta_s"), row(glue, "3se")
    assert base["MNLI"] == cell([score("roberta_s", "mnli", s) for s in (0, 1, 2)])  # matched accuracy
    assert base["QQP"] == cell([score("roberta_s", "qqp", s) for s in (0, 1, 2)])    # F1, not accuracy
    assert mine["CoLA"] == cell([score("3se", "cola", s) for s in (0, 1)]) + "*"
    assert "3se / CoLA: 2 of 3 seeds (missing seed 2)" in glue.notes
    # the average over the 8 tasks; its std over the seeds that ran every task (0 and 1 for 3se)
    means = [statistics.fmean(score("3se", t, s) for s in ((0, 1) if t == "cola" else (0, 1, 2))) for t in HEADLINE]
    per_seed = [statistics.fmean(score("3se", t, s) for t in HEADLINE) for s in (0, 1)]
    assert mine["Avg"] == f"{100 * statistics.fmean(means):.1f} ± {100 * statistics.stdev(per_seed):.1f}"
    assert "scores on the test split" in glue.notes


@pytest.mark.parametrize(("paper", "mrpc", "cola"), [("hashformers", "accuracy", "matthews"), ("sparse-coding", "f1", "matthews"),
                                                    (None, "f1", "matthews")])
def test_each_task_shows_the_metric_of_the_paper_its_runs_followed(paper, mrpc, cola, tmp_path):
    """The task table says what each paper's tables show (the runs record their paper); the first metric
    where the run followed none."""
    metrics = {"test/accuracy": 0.81, "test/f1": 0.87, "test/matthews": 0.41}
    folders = [write_run(tmp_path, "m", task, 0, metrics, paper=paper) for task in ("mrpc", "cola")]
    glue = table(report(folders).tables(), "GLUE")
    assert row(glue, "m")["MRPC"] == f"{100 * metrics[f'test/{mrpc}']:.1f}"
    assert row(glue, "m")["CoLA"] == f"{100 * metrics[f'test/{cola}']:.1f}"


def test_a_missing_task_is_shown_and_the_average_left_out(tmp_path):
    folders = glue_runs(tmp_path, skip={("3se", "rte", s) for s in (0, 1, 2)})
    glue = table(report(folders).tables(), "GLUE")
    assert row(glue, "3se")["RTE"] == "–" and row(glue, "3se")["Avg"] == "–"
    assert "3se: no RTE result" in glue.notes and "3se: no average without every task of the table" in glue.notes
    assert row(glue, "roberta_s")["Avg"] != "–"


def test_memory_table_gives_prr_per_task_and_on_the_average_with_pcr_against_the_baseline(tmp_path):
    folders = glue_runs(tmp_path)
    baseline = folders[0]
    memory = table(report(folders, baseline, digits=2).tables(), "Memory efficiency")
    assert memory.header == ["Model", "MNLI", "QNLI", "QQP", "RTE", "SST", "MRPC", "CoLA", "STS", "GLUE Avg",
                             "#Total Params", "#Emb Params", "PCR (All)", "PCR (Emb)", "PoEP"]
    mine = row(memory, "3se")
    cola = [statistics.fmean(score(label, "cola", s) for s in (0, 1, 2)) for label in ("3se", "roberta_s")]
    assert mine["CoLA"] == f"{100 * cola[0] / cola[1]:.2f}"
    averages = [statistics.fmean(statistics.fmean(score(label, t, s) for s in (0, 1, 2)) for t in HEADLINE)
                for label in ("3se", "roberta_s")]
    assert mine["GLUE Avg"] == f"{100 * averages[0] / averages[1]:.2f}"  # HashFormers: PRR of the average
    assert (mine["#Total Params"], mine["#Emb Params"]) == ("25.8M", "18.9K")
    assert (mine["PCR (All)"], mine["PCR (Emb)"], mine["PoEP"]) == ("50.0", "99.9", "0.07")
    assert row(memory, "roberta_s")["CoLA"] == "100.00" and row(memory, "roberta_s")["PCR (All)"] == "0.0"


def test_without_a_baseline_the_memory_table_says_prr_needs_one(tmp_path):
    memory = table(report(glue_runs(tmp_path)).tables(), "Memory efficiency")
    assert "CoLA" not in memory.header and "PCR (Emb)" in memory.header
    assert any("PRR (performance retention) needs a baseline" in note for note in memory.notes)
    assert row(memory, "3se")["PCR (Emb)"] == "99.9"  # against the dense strategy each run recorded


def test_x_100_applies_to_the_scores_the_note_names_and_to_nothing_else(tmp_path):
    metrics = {"val/accuracy": 0.219, "val/loss": 6.799, "val/perplexity": 897.07}
    pretraining = table(report([write_run(tmp_path, "demo", None, 0, metrics)]).tables(), "Pre-training")
    cells = row(pretraining, "demo (pre-training)")
    assert cells["val/accuracy"] == "21.9" and cells["val/loss"] == "6.799" and cells["val/perplexity"] == "897.1"
    assert pretraining.notes == ["x 100: val/accuracy; the others as logged; mean ± std over seeds"]


def test_every_score_like_metric_is_shown_x_100_and_nothing_else(tmp_path):
    """val/score (what selects checkpoints: here the task's first metric) is the number val/accuracy is: one convention
    shows both x 100, and test/score with them; a loss stays as logged."""
    metrics = {"val/accuracy": 0.875, "val/score": 0.875, "test/accuracy": 0.85, "test/score": 0.85, "val/loss": 0.4}
    found = table(report([write_run(tmp_path, "mine", "topics", 0, metrics, paper=None)]).tables(), "Other tasks")
    cells = row(found, "mine (topics)")
    assert cells["val/score"] == cells["val/accuracy"] == "87.5" and cells["test/score"] == cells["test/accuracy"] == "85.0"
    assert cells["val/loss"] == "0.4"
    assert found.notes == ["x 100: test/accuracy, test/score, val/accuracy, val/score; the others as logged; "
                           "mean ± std over seeds"]


def test_xnli_table_by_language_and_protocol(tmp_path):
    folders = []
    for label, task, drop in (("xlmr_s", "xnli", 0.0), ("3se", "xnli_translate_train_all", 0.04)):
        for seed in (0, 1):
            metrics = {f"test/{lang}/accuracy": 0.70 - 0.01 * i - drop + 0.002 * seed for i, lang in enumerate(XNLI_LANGUAGES)}
            metrics["test/average/accuracy"] = statistics.fmean(metrics.values())
            folders.append(write_run(tmp_path, label, task, seed, metrics))
    tables = report(folders, folders[0]).tables()
    xnli = table(tables, "XNLI")
    assert xnli.header == ["Model", *XNLI_LANGUAGES, "Avg"]
    assert [r[0] for r in xnli.rows] == ["xlmr_s", "3se [xnli_translate_train_all]"]
    assert row(xnli, "xlmr_s")["de"] == cell([0.70 - 0.03 + 0.002 * s for s in (0, 1)])
    expected = statistics.fmean(0.70 - 0.01 * i + 0.001 for i in range(15))
    assert row(xnli, "xlmr_s")["Avg"].startswith(f"{100 * expected:.1f} ± ")
    memory = table(tables, "Memory efficiency")  # PRR needs the baseline on the same protocol
    assert "baseline 'xlmr_s [xnli_translate_train_all]' has no en result: no PRR" in memory.notes


def test_jglue_table_takes_spearman_for_jsts(tmp_path):
    folders = [write_run(tmp_path, "distilbert", task, seed, {f"test/{m}": value + 0.01 * seed, "test/pearson": 0.1})
               for task, m, value in (("jcola", "accuracy", 0.77), ("JSTS", "spearman", 0.85), ("jnli", "accuracy", 0.88))
               for seed in (0, 1, 2)]
    jglue = table(report(folders).tables(), "JGLUE")
    assert jglue.header == ["Model", "JCoLA", "JSTS", "JNLI", "Avg"]
    assert row(jglue, "distilbert")["JSTS"] == cell([0.85, 0.86, 0.87])


def test_speed_table_gives_time_per_sample_and_speed_up(tmp_path):
    def efficiency(train, infer, device="cpu"):
        return {"train": {"ms_per_sample": train}, "infer": {"ms_per_sample": infer}, "peak_memory_mb": 900.0, "device": device}

    base = write_run(tmp_path, "bert_mlm", None, 0, {"val/loss": 2.0}, efficiency=efficiency(24.9, 4.6))
    fast = write_run(tmp_path, "proj", None, 0, {"val/loss": 2.5}, counts=SUB3, efficiency=efficiency(10.6, 1.8))
    other = write_run(tmp_path, "proj_gpu", None, 0, {"val/loss": 2.5}, counts=(1, 1), efficiency=efficiency(1.0, 1.0, "H100"))
    tables = report([base, fast, other], base).tables()
    speed = table(tables, "Training and inference speed")
    assert speed.header == ["Model", "Runs", "Train (ms/sample)", "Train speed-up", "Infer (ms/sample)",
                            "Infer speed-up", "Peak memory (MB)", "Device", "Load/core"]
    assert row(speed, "proj (pre-training)")["Train speed-up"] == "2.3x"  # 24.9 / 10.6
    assert row(speed, "proj (pre-training)")["Infer speed-up"] == "2.6x"  # 4.6 / 1.8: HashFormers' Proj
    assert row(speed, "bert_mlm (pre-training)")["Train (ms/sample)"] == "24.9"
    assert any("proj_gpu (pre-training) and the baseline ran on different devices" in n for n in speed.notes)
    pretraining = table(tables, "Pre-training")
    assert row(pretraining, "proj (pre-training)")["val/loss"] == "2.5"
    assert row(speed, "proj (pre-training)")["Load/core"] == "–"  # results written before loads were recorded
    assert any(n.startswith("no load recorded (results written before lit-embed recorded it) for proj (pre-training)")
               for n in speed.notes)


@pytest.mark.parametrize(("mine", "theirs", "marked"), [([7.0, 12.0], [0.0, 0.4], True), ([1.1, 1.5], [0.9, 1.0], False),
                                                        ([2.2, 2.2], [1.1, 1.1], True), ([2.0, 2.0], [1.1, 1.1], False)])
def test_a_speed_up_whose_runs_ran_at_unlike_loads_is_marked_and_the_loads_said(tmp_path, mine, theirs, marked):
    """The issue's case: a method timed at load 7-12 beside a baseline at 0 on 2 cores. Loads more than 0.5 per core
    apart mark both speed-ups and say the two loads; within the margin, nothing (2.2 vs 1.1 on 2 cores: 0.55 apart)."""
    def efficiency(ms, load):
        return {"train": {"ms_per_sample": ms}, "infer": {"ms_per_sample": ms / 4}, "peak_memory_mb": 900.0,
                "device": "cpu", "load": {"load_1min": load, "cores": 2}}

    base = write_run(tmp_path, "dense", None, 0, {"val/loss": 2.0}, efficiency=efficiency(24.0, theirs))
    method = write_run(tmp_path, "proj", None, 0, {"val/loss": 2.5}, counts=SUB3, efficiency=efficiency(8.0, mine))
    speed = table(report([base, method], base).tables(), "Training and inference speed")
    cells = row(speed, "proj (pre-training)")
    assert (cells["Train speed-up"], cells["Infer speed-up"]) == (("3.0x†", "3.0x†") if marked else ("3.0x", "3.0x"))
    assert cells["Load/core"] == f"{sum(mine) / 4:.2f}" and row(speed, "dense (pre-training)")["Load/core"] == f"{sum(theirs) / 4:.2f}"
    said = [n for n in speed.notes if n.startswith("†")]
    assert said == ([f"† proj (pre-training) ran at a load of {sum(mine) / 4:.2f} per core, the baseline at "
                     f"{sum(theirs) / 4:.2f}, more than 0.5 apart: its speed-ups measure the machine's other work as well "
                     f"as the methods"] if marked else [])


def test_an_own_task_gets_prr_against_its_uncompressed_model_among_the_runs(tmp_path):
    """No --baseline: each task's one dense-table label is its reference (PRR 100 for itself); a task without one, or with
    two, gets none (–); --baseline names the reference where it ran the task."""
    def run(label, task, seed, accuracy, strategy):
        folder = write_run(tmp_path, label, task, seed, {"test/score": accuracy, "val/score": accuracy + 0.1}, paper=None)
        results = load_results(folder)
        results.pop("run_dir")
        write_json_atomic(folder / RESULTS_FILE, {**results, "strategy": strategy})
        return folder

    folders = [run("minilm", "reviews", seed, 0.80 + 0.02 * seed, "DenseEmbedding") for seed in (0, 1)]
    folders += [run("robe_10", "reviews", seed, 0.70 + 0.02 * seed, "ROBEEmbedding") for seed in (0, 1)]
    folders += [run("robe_10", "tickets", 0, 0.5, "ROBEEmbedding")]  # no uncompressed model on this task
    found = table(report(folders).tables(), "Other tasks")
    assert found.header[-1] == "PRR"
    assert row(found, "minilm (reviews)")["PRR"] == "100.0"
    assert row(found, "robe_10 (reviews)")["PRR"] == f"{100 * 0.71 / 0.81:.1f}"  # mean score over the reference's
    assert row(found, "robe_10 (tickets)")["PRR"] == "–"
    assert found.notes[-1] == ("PRR (%): the task's score (test split where logged, else validation; mean over seeds) over "
                               "its uncompressed model's: reviews: minilm")
    folders += [run("bert", "reviews", 0, 0.9, "DenseEmbedding")]  # two dense models: which is meant is not known
    assert "PRR" not in table(report(folders).tables(), "Other tasks").header
    chosen = table(report(folders, folders[-1]).tables(), "Other tasks")  # unless --baseline says
    assert row(chosen, "minilm (reviews)")["PRR"] == f"{100 * 0.81 / 0.9:.1f}"


def test_formats_markdown_csv_and_latex(tmp_path, capsys):
    folders = glue_runs(tmp_path)
    assert main(["report", str(tmp_path), "--baseline", str(folders[0]), "--format", "csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == ["# GLUE: scores x 100, mean ± std over seeds"]
    assert rows[1][:3] == ["Model", "MNLI", "QNLI"] and rows[2][0] == "roberta_s"
    assert main(["report", str(tmp_path), "--format", "latex"]) == 0
    latex = capsys.readouterr().out
    assert r"\begin{tabular}{lrrrrrrrrr}" in latex and r"$\pm$" in latex and r"\#Total Params" in latex
    out = tmp_path / "tables.md"
    assert main(["report", *map(str, folders), "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("### GLUE") and "| roberta_s |" in text and "| 3se |" in text


def test_report_of_real_runs_against_the_dense_baseline_is_the_docs(demo_runs, capsys):
    from tests.helpers.cli import README, page

    assert main(["report", str(demo_runs["subspace"]), "--baseline", str(demo_runs["dense"])]) == 0
    out = capsys.readouterr().out
    for text in (README, page("results")):  # the front door shows the results page's example
        example = text.split("gives this memory table:\n\n```\n", 1)[1].split("```", 1)[0]
        assert example.strip() and example in out  # 32 x 64 embedding parameters of 81,664 for the demo
    assert "| dense (pre-training) | 1 |" in out and "| subspace (pre-training) | 1 |" in out


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("no_results", "no results.json. The run did not finish"),
        ("not_json", "is not valid JSON"),
        ("one_label_two_models", "runs labelled 'x' are different models"),
        ("same_cell_twice", "are both 'x' on task 'cola' with seed 0: a cell holds one run per seed"),
        ("other_backbone", "has backbone bert 12x768 (12 heads, FFN 3072) but"),
        ("empty_folder", "no results.json"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(setup, message, tmp_path, capsys):
    good = write_run(tmp_path, "x", "cola", 0, {"test/matthews": 0.4})
    argv = ["report", str(good)]
    if setup == "no_results":
        (tmp_path / "crashed").mkdir()
        argv.append(str(tmp_path / "crashed"))
    elif setup == "not_json":
        (tmp_path / "broken").mkdir()
        (tmp_path / "broken" / RESULTS_FILE).write_text("{")
        argv.append(str(tmp_path / "broken"))
    elif setup == "one_label_two_models":
        argv.append(str(write_run(tmp_path, "x", "sst2", 0, {"test/accuracy": 0.9}, counts=SUB3)))
    elif setup == "same_cell_twice":
        twin = tmp_path / "twin"
        twin.mkdir()
        (twin / RESULTS_FILE).write_text((good / RESULTS_FILE).read_text())
        argv.append(str(twin))
    elif setup == "other_backbone":
        bert = {"arch": "bert", "layers": 12, "hidden": 768, "heads": 12, "ffn": 3072}
        argv += ["--baseline", str(write_run(tmp_path, "bert", "cola", 0, {"test/matthews": 0.5}, backbone=bert))]
    elif setup == "empty_folder":
        (tmp_path / "empty").mkdir()
        argv = ["report", str(tmp_path / "empty")]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_baseline_without_parameter_counts_still_gives_prr(tmp_path):
    base = write_run(tmp_path, "hf_model", "cola", 0, {"test/matthews": 0.5})
    results = load_results(base)
    results["parameters"] = None  # e.g. a module that is not a lit-embed EmbeddingModule
    write_json_atomic(base / RESULTS_FILE, results)
    mine = write_run(tmp_path, "3se", "cola", 0, {"test/matthews": 0.4}, counts=SUB3)
    memory = table(report([base, mine], base).tables(), "Memory efficiency")
    assert row(memory, "3se")["CoLA"] == "80.0" and row(memory, "3se")["PCR (Emb)"] == "99.9"
    assert any("has no parameter counts" in note for note in memory.notes)


def test_predictions_and_runs_that_did_not_complete_beside_a_run_are_left_out_and_shown(tmp_path, capsys):
    """`lit-embed predict` writes a results.json of its own (in its folder beside the fit's run folder):
    it holds no scores and is not a second run of the cell. A run of every status but complete (of the seed of the
    complete one, and of another seed) is never averaged in: the report shows it, with its status and why."""
    fit = write_run(tmp_path, "3se", "rte", 0, {"val/accuracy": 0.6})
    predicted = write_run(tmp_path / "p", "3se", "rte", 0, {})
    write_json_atomic(predicted / RESULTS_FILE, {**load_results(predicted), "command": "predict"})
    others = {}
    for seed, status in enumerate(STATUSES):
        if status == "complete":
            continue
        others[status] = write_run(tmp_path / status, "3se", "rte", seed, {"val/accuracy": float("nan")})
        write_json_atomic(others[status] / RESULTS_FILE, {**load_results(others[status]), "status": status,
                                                          "detail": f"why {status}"})
    assert main(["report", str(fit), str(predicted), *map(str, others.values())]) == 0
    captured = capsys.readouterr()
    assert "| 3se | 60.0 | 60.0 |" in captured.out  # one seed: the complete run's
    assert f"left out {len(others)} run(s) that did not complete" in captured.err
    left_out = captured.out.split("### Runs left out: they did not complete")[1]
    for status, folder in others.items():
        assert f"| {folder} | 3se | rte | {STATUSES.index(status)} | {status} | why {status} |" in left_out
    assert main(["report", str(others["diverged"])]) == 0  # nothing complete: only the table of what is left out
    out = capsys.readouterr().out
    assert out.startswith("### Runs left out") and "| diverged | why diverged |" in out


def test_a_tasks_own_higher_is_better_metrics_are_scores(tmp_path, capsys):
    """A config's own task may name any torchmetrics function; results.json lists its scores (higher is better)."""
    run = write_run(tmp_path, "mine", "reviews", 0, {"test/cohen_kappa": 0.5, "test/mean_squared_error": 0.25})
    write_json_atomic(run / RESULTS_FILE, {**load_results(run), "scores": ["cohen_kappa"]})
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "| mine (reviews) | 50.0 | 0.25 |" in out and "x 100: test/cohen_kappa; the others as logged" in out


# -- results.json of the wrong shape: every key report and the sweeps read, x the wrong types ------------------------

#: A results.json with every key report and the sweeps read, each holding what ResultsWriter writes there.
WHOLE_RESULTS = {
    "format": 1, "status": "complete", "command": "fit", "label": "3se", "task": "rte", "seed": 1, "paper": "hashformers",
    "backbone": ROBERTA_S, "parameters": parameters(SUB3),
    "efficiency": {"train": {"ms_per_sample": 1.5}, "infer": {"ms_per_sample": 0.5}, "peak_memory_mb": 120.0,
                   "device": "cpu"},
    "metrics": {"test/accuracy": 0.7, "val/score": 0.72}, "scores": ["accuracy"],
    "checkpoint": {"monitor": "val/score", "mode": "max", "best": "checkpoints/best.ckpt", "best_score": 0.72},
    "config": {"model": {"class_path": "lit_embed.models.SequenceClassifier"}},
}
#: Each key (a path into the file) and what it holds, written out here as the test's own statement of the format
#: ("?": null allowed too).
KEYS = {
    ("label",): "text", ("status",): "status", ("command",): "text?", ("task",): "text?", ("seed",): "whole?",
    ("paper",): "text?", ("backbone",): "mapping?", ("parameters",): "mapping?", ("efficiency",): "mapping?",
    ("metrics",): "mapping", ("scores",): "list?", ("checkpoint",): "mapping?",
    **{("backbone", key): "text" if key == "arch" else "whole" for key in ROBERTA_S},
    ("parameters", "total_params"): "whole", ("parameters", "embedding_params"): "whole",
    **{("parameters", key): "number" for key in ("pcr_all", "pcr_emb", "poep")},
    ("efficiency", "train"): "mapping?", ("efficiency", "infer"): "mapping?",
    ("efficiency", "train", "ms_per_sample"): "number?", ("efficiency", "infer", "ms_per_sample"): "number?",
    ("efficiency", "peak_memory_mb"): "number?", ("efficiency", "device"): "text",
    ("metrics", "test/accuracy"): "metric", ("scores", 0): "text",
    ("checkpoint", "monitor"): "text?", ("checkpoint", "best"): "text?", ("checkpoint", "best_score"): "metric?",
}
NAN, INF = float("nan"), float("inf")
#: Values of the wrong type for each kind (null left out where it is allowed); huge and non-finite numbers too.
WRONG = {
    "text": [None, 1, 2.5, True, ["x"], {"a": 1}],
    "status": [None, "done", 1, ["complete"]],
    "whole": [None, "3", 1.5, True, [1], {}, 10**30, -(10**30), NAN, INF],
    "number": [None, "x", True, [1.0], {}, NAN, INF, -INF, 10**30],
    "metric": [None, "0.7", False, [0.7], {"v": 0.7}, 10**30],
    "mapping": [None, "x", 1, 0.5, True, ["a"]],
    "list": ["accuracy", 1, {"a": 1}, True],
}


def shown(path: tuple) -> str:
    """The key as the message names it: ``parameters.total_params``, ``scores[0]``."""
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(path))


def malformed(path: tuple, value) -> dict:
    import copy

    results = copy.deepcopy(WHOLE_RESULTS)
    *parents, last = path
    holder = results
    for part in parents:
        holder = holder[part]
    holder[last] = value
    return results


@pytest.mark.parametrize("path", list(KEYS), ids=[shown(p) for p in KEYS])
def test_a_results_json_of_the_wrong_shape_is_refused_naming_the_file_and_the_key(path, tmp_path, capsys):
    """Every key report and the sweeps read, given every wrong type (and huge or non-finite numbers where a count or a
    figure must be finite): exit 2 naming the file and the key, never a traceback; a sweep takes the run as not done.
    The file as ResultsWriter writes it, and null where null is allowed, are read."""
    from lit_embed.sweeps.outcomes import finished_results

    kind = KEYS[path]
    wrong = [v for v in WRONG[kind.rstrip("?")] if not (v is None and kind.endswith("?"))]
    run = tmp_path / "run"
    for value in wrong:
        write_json_atomic(run / RESULTS_FILE, malformed(path, value))
        assert main(["report", str(run)]) == 2, value
        error = capsys.readouterr().err
        assert f"{run / RESULTS_FILE}: key {shown(path)!r} " in error and "Traceback" not in error, (value, error)
        sweep_run = type("Run", (), {"folder": tmp_path})()  # the sweep's reader looks in version folders under it
        (tmp_path / "version_0").mkdir(exist_ok=True)
        write_json_atomic(tmp_path / "version_0" / RESULTS_FILE, malformed(path, value))
        assert finished_results(sweep_run) is None, value
    accepted = [WHOLE_RESULTS] + ([malformed(path, None)] if kind.endswith("?") else [])
    for results in accepted:
        write_json_atomic(run / RESULTS_FILE, results)
        assert main(["report", str(run)]) == 0, capsys.readouterr().err
        capsys.readouterr()


@pytest.mark.parametrize(("case", "content", "message"), [
    ("not UTF-8", b'{"format": 1, "label": "caf\xe9"}', r"results\.json is not UTF-8 text \(byte 27\)"),
    ("nested absurdly deep", b"[" * 100_000 + b"]" * 100_000, r"results\.json nests its values too deep to read"),
    ("a number too long to read", b'{"format": 1, "label": "x", "seed": 1' + b"0" * 5000 + b"}",
     r"results\.json is not valid JSON \(Exceeds the limit"),
    ("a list, not a mapping", b'[{"format": 1}]', r"results\.json has format 'list', expected 1"),
    ("a count of 1e999", json.dumps(malformed(("parameters", "total_params"), 1e999)).encode(),
     r"key 'parameters\.total_params' is the number inf, not a whole number"),
    ("a NaN percentage", json.dumps(malformed(("parameters", "poep"), NAN)).encode(),
     r"key 'parameters\.poep' is nan, not a finite number"),
])
def test_a_results_json_that_cannot_be_read_is_refused_naming_the_file(case, content, message, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / RESULTS_FILE).write_bytes(content)
    assert main(["report", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert re.search(message, error) and "Traceback" not in error, error


def test_undefined_and_diverged_metrics_are_read_and_shown_as_such(tmp_path, capsys):
    """A metric may be NaN (a correlation of constant predictions) or infinite (a diverged loss): ResultsWriter writes
    them, report shows them ("nan", "inf"), averaged with others into NaN, and nested data report does not read (a
    config) may be as deep as JSON allows; a sweep does not choose a grid point by an undefined score."""
    from lit_embed.sweeps.plan import Select

    deep: object = "leaf"
    for _ in range(500):
        deep = {"x": deep}
    for seed, value in ((1, NAN), (2, 0.7)):
        results = {**malformed(("metrics", "test/accuracy"), value), "seed": seed, "config": deep}
        results["metrics"]["val/loss"] = INF
        write_json_atomic(tmp_path / f"seed{seed}" / RESULTS_FILE, results)
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 3se | nan ± nan |" in out and "inf" in out, out
    assert Select().best({"a": NAN, "b": 0.5, "c": None}) == "b" and Select("val/loss", "min").best({"a": -INF}) is None


@pytest.mark.parametrize("target", ["results.json", "sweep.json", "report.json"])
def test_report_never_writes_its_output_over_a_file_it_read(target, tmp_path, capsys):
    """--output replaces a file: never one report read (a run's results.json, a sweep's plan, a compress output's
    report.json); beside them it writes."""
    from lit_embed.sweeps.plan import MANIFEST, load_sweep, manifest

    run = write_run(tmp_path, "x", "cola", 0, {"test/matthews": 0.4})
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(json.dumps({"folder": str(tmp_path / "sweep"), "stages": {"a": {"config": str(REPO / "configs" / "demo.yaml")}}}))
    write_json_atomic(tmp_path / "sweep" / MANIFEST, manifest(load_sweep(sweep_file)))
    write_json_atomic(tmp_path / "compressed" / "report.json", {"source": "x", "method": "unk", "task": "cola", "retention": 0.5,
                                                                "coverage": {"tokens": 0.9, "sentences": 0.5, "examples": 10}})
    read = {"results.json": run / RESULTS_FILE, "sweep.json": tmp_path / "sweep" / MANIFEST,
            "report.json": tmp_path / "compressed" / "report.json"}[target]
    before = read.read_bytes()
    assert main(["report", str(tmp_path), "-o", str(read)]) == 2
    error = capsys.readouterr().err
    assert f"--output '{read}' is '{read}', which this command reads" in error, error
    assert read.read_bytes() == before
    assert main(["report", str(tmp_path), "-o", str(run / "tables.md")]) == 0
    assert "### " in (run / "tables.md").read_text()
def compress_output(root: Path, name: str, method: str, task: str, retention: float, cosines: dict[str, tuple],
                    identical: bool = True) -> Path:
    """A ``lit-embed compress`` report.json: ``cosines`` maps each k tried ("" for none) to (rare, common, all)."""
    by_k = {k: {"rare": rare, "common": common, "all": every, "common_rows_identical": identical}
            for k, (rare, common, every) in cosines.items()}
    chosen = next(iter(by_k.values()))
    write_json_atomic(root / name / "report.json", {
        "method": method, "task": task, "retention": retention, "k": next(iter(cosines)) or None,
        "cosine": chosen, "cosine_by_k": {k: c for k, c in by_k.items() if k}, "coverage": None})
    return root / name


def test_table_9_rows_by_method_and_k_columns_by_task_one_table_a_retention_means_over_seeds(tmp_path, capsys):
    for seed, shift in ((1, 0.0), (2, 0.02)):
        compress_output(tmp_path, f"cola-sc-{seed}", "sparse_coding", "cola", 1.0,
                        {"1": (0.70 + shift, 1.0, 0.9), "2": (0.75 + shift, 1.0, 0.92)})
    compress_output(tmp_path, "jcola-sc", "sparse_coding", "jcola", 1.0, {"2": (0.34, 1.0, 0.5)})
    compress_output(tmp_path, "cola-unk", "unk", "cola", 1.0, {"": (0.3555, 1.0, 0.8)})
    compress_output(tmp_path, "cola-aq", "aq", "cola", 1.0, {"": (0.7955, 0.7016, 0.7789)}, identical=False)
    compress_output(tmp_path, "cola-mine", "mine", "cola", 1.0, {"3": (0.5, 0.9, 0.6)}, identical=False)
    compress_output(tmp_path, "cola-half", "sparse_coding", "cola", 0.5, {"1": (0.6, 1.0, 0.7)})
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    full = out.split("### Cosine similarity of the rebuilt embeddings to the original ones, r(V_C) = 1 (x 100)")[1]
    half = out.split("### Cosine similarity of the rebuilt embeddings to the original ones, r(V_C) = 0.5 (x 100)")[1]
    assert out.index("r(V_C) = 0.5 (x 100)") < out.index("r(V_C) = 1 (x 100)")
    lines = [line for line in full.strip().split("\n\n")[0].splitlines() if line.startswith("| ")]
    assert lines == [
        "|  | CoLA | JCoLA |",
        "| <unk> | 35.55 | – |",
        "| sparse coding k=1 | 71.00 | – |",   # the mean of two seeds' 70 and 72
        "| sparse coding k=2 | 76.00 | 34.00 |",
        "| AQ (V_C ∪ V_R) | 77.89 | – |",
        "| AQ (V_C) | 70.16 | – |",
        "| AQ (V_R) | 79.55 | – |",
        "| mine k=3 (V_C ∪ V_R) | 60.00 | – |",
        "| mine k=3 (V_C) | 90.00 | – |",
        "| mine k=3 (V_R) | 50.00 | – |",
    ]
    assert "| sparse coding k=1 | 60.00 |" in half and "JCoLA" not in half.split("\n\n")[1]


def test_each_compress_method_strategy_and_budget_is_a_cosine_row_of_its_own_that_names_its_method():
    """Two strategies fitted by ``fit``, two configs of one strategy class (DPQ-SX, DPQ-VQ), svd at two budgets, int8 and
    int4 (one strategy class), and sparse coding at a budget are rows of their own, never averaged into one, each naming
    its method; a config's name is said where it says more than its class."""
    from lit_embed.reports.papers import cosine_tables

    def report(method: str, cosine: float, strategy: str | None = None, budget: float | None = None, k: str = "",
               config: str | None = None) -> dict:
        rows = {"all": cosine, "common": cosine, "rare": cosine, "common_rows_identical": False}
        return {"method": method, "retention": 0.5, "task": "topics", "details": {"strategy": strategy} if strategy else {},
                "options": {"budget": budget, "strategy": config}, "cosine": rows, "cosine_by_k": {k: rows} if k else {}}

    (table,) = cosine_tables([report("fit", 0.2, "HashingTrickEmbedding", 0.1, config="configs/embedding/hashing_trick.yaml"),
                              report("fit", 0.4, "ROBEEmbedding", 0.1),
                              report("fit", 0.3, "DPQEmbedding", 0.1, config="configs/embedding/dpq.yaml"),
                              report("fit", 0.35, "DPQEmbedding", 0.1, config="configs/embedding/dpq_vq.yaml"),
                              report("svd", 0.6, budget=0.1), report("svd", 0.5, budget=0.01), report("int8", 0.9),
                              report("int4", 0.8), report("sparse_coding", 0.7, budget=0.2, k="3")])
    names = {row[0].rsplit(" (", 1)[0] for row in table.rows}  # each row once per token set: (V_C ∪ V_R), (V_C), (V_R)
    assert names == {"fit HashingTrickEmbedding budget=0.1", "fit ROBEEmbedding budget=0.1", "fit DPQEmbedding budget=0.1",
                     "fit DPQEmbedding dpq_vq budget=0.1", "svd budget=0.1", "svd budget=0.01", "int8", "int4",
                     "sparse coding budget=0.2 k=3"}
