"""`lit-embed report --figure`: the zoo's Pareto figure and table from run folders (results.json written by the
project's writer), its frontier and error bars, the PNG and its TensorBoard image, and bad input."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from PIL import Image

from lit_embed.commands import main
from lit_embed.measures.accounting import compression
from lit_embed.reports.pareto import (
    POST_HOC,
    POST_HOC_WORD,
    PRETRAINED,
    TAG,
    Point,
    beats,
    draw,
    frontier,
    kinds,
    points_of,
    references,
    styles,
    ties,
)
from lit_embed.runs.results import RESULTS_FILE
from lit_embed.storage.files import write_json_atomic

DENSE = 1_953_408  # 30522 x 64
#: Made-up models: method (strategy), label, embedding parameters, test accuracy per seed; efficiency or None.
MODELS = [
    ("DenseEmbedding", "dense", DENSE, {0: 0.80, 1: 0.82, 2: 0.84}),
    ("HashingTrickEmbedding", "hashing 10%", 195_328, {0: 0.78, 1: 0.80, 2: 0.79}),
    ("HashingTrickEmbedding", "hashing 1%", 19_520, {0: 0.60, 1: 0.64, 2: 0.62}),
    ("ROBEEmbedding", "robe 10%", 195_360, {0: 0.70, 1: 0.71, 2: 0.75}),  # beaten by hashing at fewer parameters
    ("ROBEEmbedding", "robe 0.1%", 1_952, {0: 0.30, 1: 0.36}),             # two seeds only
]
EFFICIENCY = {"train": {"ms_per_sample": 2.5}, "infer": {"ms_per_sample": 0.5}, "peak_memory_mb": 900.0, "device": "cpu"}


def write_run(root: Path, method: str, label: str, embedding: int, seed: int | None, accuracy: float | None,
              task: str | None = "topics", efficiency: dict | None = EFFICIENCY) -> Path:
    folder = root / f"{label}-{task}-{seed}".replace(" ", "_").replace("%", "pct")
    metrics = {} if accuracy is None else {"test/accuracy": accuracy, "val/accuracy": accuracy - 0.01, "test/loss": 0.5}
    write_json_atomic(folder / RESULTS_FILE, {
        "format": 1, "status": "complete", "label": label, "task": task, "seed": seed, "strategy": method,
        "parameters": {"total_params": 80_000 + embedding, "embedding_params": embedding, "baseline_total_params": 80_000 + DENSE,
                       "baseline_embedding_params": DENSE, **compression(embedding, 80_000 + embedding, DENSE, 80_000 + DENSE),
                       "embedding_bytes": 4 * embedding, "baseline_embedding_bytes": 4 * DENSE},
        "efficiency": efficiency,
        "metrics": metrics,
    })
    return folder


def zoo(root: Path) -> Path:
    for method, label, embedding, scores in MODELS:
        for seed, accuracy in scores.items():
            efficiency = None if label == "robe 0.1%" else EFFICIENCY  # a run without the efficiency callback
            write_run(root, method, label, embedding, seed, accuracy, efficiency=efficiency)
        write_run(root, method, label, embedding, None, None, task=None)  # its pre-training run: no task score
    return root


def rows(text: str) -> dict[str, list[str]]:
    """The Pareto table's rows of a Markdown report, by model."""
    part = text.split("Pareto: task score against embedding bytes", 1)[1]
    lines = [line for line in part.splitlines() if line.startswith("|")][2:]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return {row[2]: row for row in cells}


def point(label: str, size: int, *scores: float, path: str = PRETRAINED, method: str = "m") -> Point:
    return Point(method, label, size, dict(enumerate(scores)), path)


def test_a_point_beats_another_only_beyond_the_seeds_noise():
    """A paired one-sided t-test over common seeds: 0.5 ahead with a spread of 1.7 is noise; a steady lead is not; one
    common seed is never beyond noise."""
    low = point("low", 10, 0.70, 0.72, 0.74)
    assert beats(point("steady", 10, 0.80, 0.81, 0.83), low) and not beats(low, point("steady", 10, 0.80, 0.81, 0.83))
    noisy = point("noisy", 10, 0.70 + 0.017, 0.72 - 0.012, 0.74 + 0.010)  # 0.5 ahead on average, spread 1.5
    assert not beats(noisy, low)
    assert not beats(point("one seed", 10, 0.99), point("other", 10, 0.10))
    assert beats(point("all ahead by 0.1", 10, 0.8, 0.8), point("b", 10, 0.7, 0.7))  # no spread, all ahead


def test_frontier_keeps_what_no_cheaper_point_beats_beyond_noise_draws_ties_and_never_joins_paths():
    points = [
        point("cheap", 100, 0.60, 0.62, 0.64),
        point("dominated", 1000, 0.40, 0.42, 0.41),  # the cheaper 'cheap' beats it at every seed
        point("tie", 5000, 0.61, 0.64, 0.63),  # more bytes, no better beyond noise: a tie with 'cheap'
        point("gain", 9000, 0.80, 0.83, 0.82),  # beats every cheaper frontier point
        point("other path", 10, 0.10, 0.11, 0.12, path=POST_HOC),  # cheaper than all, never compared with them
        point("post hoc best", 2000, 0.90, 0.91, 0.92, path=POST_HOC),
    ]
    best = frontier(points)
    assert [p.label for p in best] == ["cheap", "tie", "gain", "other path", "post hoc best"]
    assert ties(points) == {"cheap": [], "tie": ["cheap"], "gain": [], "other path": [], "post hoc best": []}
    assert frontier([]) == [] and [p.label for p in frontier([point("only", 7, 0.0)])] == ["only"]


def test_figure_and_table_give_the_frontier_error_bars_and_efficiency_per_method_and_budget(tmp_path, capsys):
    runs = zoo(tmp_path / "runs")
    figure = tmp_path / "out" / "pareto.png"
    assert main(["report", str(runs), "--figure", str(figure)]) == 0
    captured = capsys.readouterr()
    table = rows(captured.out)
    assert set(table) == {label for _, label, _, _ in MODELS}  # pre-training runs make no point
    for method, label, embedding, scores in MODELS:
        values = [100 * s for s in scores.values()]
        mean, std = statistics.mean(values), statistics.stdev(values)
        assert table[label][:4] == [PRETRAINED, method, label, f"{4 * embedding:,}"]
        assert table[label][4] == f"{100 * embedding / DENSE:.3g}%"  # of the path's uncompressed model's bytes
        assert table[label][5:8] == [f"{mean:.1f} ± {std:.1f}", f"{statistics.mean(scores.values()) / 0.82:.3f}", str(len(scores))]
    frontier_rows = {label: row[8] for label, row in table.items() if row[8] != "–"}
    # robe 10% is beaten by hashing 10% at every seed with fewer bytes; hashing 10% beats hashing 1% (every seed ahead);
    # dense leads hashing 10% by 0.02, 0.02, 0.05: t = 3.0 on 2 degrees of freedom, p = 0.048, just beyond noise
    assert frontier_rows == {"robe 0.1%": "yes", "hashing 1%": "yes", "hashing 10%": "yes", "dense": "yes"}
    assert table["dense"][9:] == ["900", "2.5", "0.5"]
    assert table["robe 0.1%"][9:] == ["not measured"] * 3
    assert "score: topics accuracy x 100, mean ± std over seeds (the figure's error bars: ± one std); chance 16.7" in captured.out
    with Image.open(figure) as image:
        assert image.format == "PNG" and image.size == (990, 605)  # 9 x 5.5 inches at 110 dpi
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(figure.parent), size_guidance={"images": 0})
    events.Reload()
    (image_event,) = events.Images(TAG)
    assert (image_event.width, image_event.height) == (990, 605)
    assert image_event.encoded_image_string == figure.read_bytes()
    assert f"wrote {figure}" in captured.err


def test_a_benchmark_point_is_its_average_over_the_tasks_per_seed(tmp_path, capsys):
    runs = tmp_path / "runs"
    glue = {"sst2": ("accuracy", {0: 0.90, 1: 0.92}), "cola": ("matthews", {0: 0.40, 1: 0.30})}
    for task, (metric, scores) in glue.items():
        for seed, value in scores.items():
            folder = write_run(runs, "SubspaceEmbedding", "3se", 18_944, seed, None, task=task)
            results = folder / RESULTS_FILE
            write_json_atomic(results, {**json.loads(results.read_text()), "metrics": {f"test/{metric}": value}})
    assert main(["report", str(runs), "--figure", str(tmp_path / "glue.png")]) == 0
    out = capsys.readouterr().out
    per_seed = [100 * (0.90 + 0.40) / 2, 100 * (0.92 + 0.30) / 2]
    assert rows(out)["3se"][5] == f"{statistics.mean(per_seed):.1f} ± {statistics.stdev(per_seed):.1f}"
    assert "score: GLUE average x 100" in out


def test_figure_in_the_sweep_folder_or_beside_the_output_when_no_file_is_named(tmp_path, capsys):
    runs = zoo(tmp_path / "runs")
    output = tmp_path / "tables" / "report.md"
    output.parent.mkdir()
    assert main(["report", str(runs), "-o", str(output), "--figure"]) == 0
    assert (output.parent / "pareto.png").is_file() and "Pareto" in output.read_text()
    assert main(["report", str(runs), "--figure"]) == 2  # a run folder is no place for it: say where instead
    assert "--figure without a file name draws beside --output or in the one sweep folder given" in capsys.readouterr().err


@pytest.mark.parametrize(("setup", "argv", "message"), [
    ("zoo", ["--figure", "{tmp}/pareto.jpg"], "the figure is a PNG; give a file name ending in .png"),
    ("zoo", ["--figure", "{tmp}/folder.png"], "is a folder: give a file name ending in .png"),
    ("pretraining only", ["--figure", "{tmp}/p.png"], "--figure: no model has both a task score and parameter counts"),
    ("zoo", ["--figure", "{runs}/dense-topics-0/results.json.png"], None),  # beside a file it read: fine
    ("zoo", ["--figure", "{tmp}/p.png", "--digits", "9"], "--digits=9: use 0 to 6"),
])
def test_bad_figure_requests_are_refused_with_one_line_and_nothing_written(setup, argv, message, tmp_path, capsys):
    runs = tmp_path / "runs"
    if setup == "zoo":
        zoo(runs)
    else:
        write_run(runs, "DenseEmbedding", "dense", DENSE, 0, None, task=None)
    (tmp_path / "folder.png").mkdir()
    args = [a.format(tmp=tmp_path, runs=runs) for a in argv]
    status = main(["report", str(runs), *args])
    err = capsys.readouterr().err
    if message is None:
        assert status == 0 and Path(args[1]).is_file()
        return
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not [p for p in tmp_path.rglob("*.png") if p.is_file()] and not list(tmp_path.rglob("events.out.tfevents.*"))


def test_the_figure_never_replaces_a_file_the_report_read(tmp_path, capsys):
    runs = zoo(tmp_path / "runs")
    results = runs / "dense-topics-0" / RESULTS_FILE
    before = results.read_bytes()
    (tmp_path / "link.png").symlink_to(results)  # a .png name that is the results.json it reads
    assert main(["report", str(runs), "--figure", str(tmp_path / "link.png")]) == 2
    assert "which this command reads: the output would replace it; choose another --figure" in capsys.readouterr().err
    assert results.read_bytes() == before


def test_a_variant_a_sweep_stage_names_is_a_line_of_its_own_beside_its_strategys():
    """The zoo's post-hoc cells (a stage labelled ``{strategy} {budget} post-hoc``) are not points of the pre-trained
    strategy's line."""
    def run(label: str, parameters: int, variant: str) -> dict:
        return {"label": label, "_task": "topics", "strategy": "QREmbedding", "variant": variant,
                "parameters": {"embedding_params": parameters, "embedding_bytes": 4 * parameters}}

    runs = [run("qr 1pct", 19_500, ""), run("qr 10pct", 195_000, ""), run("qr 1pct post-hoc", 117_000, "post-hoc")]
    points = points_of(runs, {"qr 1pct": {0: 0.5}, "qr 10pct": {0: 0.6}, "qr 1pct post-hoc": {0: 0.7}})
    assert {p.label: p.method for p in points} == {"qr 1pct": "QREmbedding", "qr 10pct": "QREmbedding",
                                                   "qr 1pct post-hoc": "QREmbedding post-hoc"}


def test_each_path_is_a_panel_with_its_reference_and_each_method_one_colour_and_marker_everywhere():
    """Pre-trained and post-hoc points in two panels; the dense table of each is its reference line, not a frontier
    compared across paths; a strategy's post-hoc line keeps its colour and marker; 20 methods, 20 styles."""
    def run(label: str, size: int, strategy: str, variant: str = "") -> dict:
        return {"label": label, "_task": "topics", "strategy": strategy, "variant": variant,
                "parameters": {"embedding_bytes": size}}

    runs = [run("dense", 7_800_000, "DenseEmbedding"), run("qr 10%", 780_000, "QREmbedding"),
            run("dense post-hoc", 46_000_000, "DenseEmbedding", "post-hoc"),
            run("qr 10% post-hoc", 4_600_000, "QREmbedding", "post-hoc")]
    scores = {"dense": {0: 0.3, 1: 0.32}, "qr 10%": {0: 0.2, 1: 0.25}, "dense post-hoc": {0: 0.8, 1: 0.82},
              "qr 10% post-hoc": {0: 0.7, 1: 0.75}}
    points = points_of(runs, scores)
    assert {p.label: p.path for p in points} == {"dense": PRETRAINED, "qr 10%": PRETRAINED,
                                                 "dense post-hoc": POST_HOC, "qr 10% post-hoc": POST_HOC}
    assert {p.path: p.label for p in references(points).values()} == {PRETRAINED: "dense", POST_HOC: "dense post-hoc"}
    figure = draw(points, "topics accuracy", guess=1 / 6)
    panels = [a for a in figure.axes if a.get_title()]
    assert [a.get_title() for a in panels] == [PRETRAINED, POST_HOC]
    colour = {a.get_title(): {c.get_label(): (c.lines[0].get_color(), c.lines[0].get_marker()) for c in a.containers
                              if c.get_label() == "QREmbedding"} for a in panels}
    assert colour[PRETRAINED] == colour[POST_HOC] != {}
    many = [Point(f"method {i}", f"m{i}", 10 + i, {0: 0.5}) for i in range(20)]
    assert len(set(styles(many).values())) == 20


def compress_output(root: Path, method: str, strategy: str, label: str, embedding: int, scores: dict[int, float],
                    options: dict | None = None) -> None:
    """A ``lit-embed compress`` output (its report.json) whose model was tested on every seed, each test logging in a
    folder of the output's (as the output's config.yaml has it); ``strategy``: the class its model holds."""
    folder = root / label.replace(" ", "_")
    details = {"strategy": strategy} if method == "fit" else {}
    write_json_atomic(folder / "report.json", {"method": method, "options": options or {}, "details": details})
    for seed, accuracy in scores.items():
        write_run(folder, strategy, label, embedding, seed, accuracy)


def test_each_compress_method_is_one_series_one_row_one_colour_and_marker_though_methods_share_a_class(tmp_path, capsys):
    """int8 and int4 hold one strategy class, as do svd and a fitted ALBERT factorisation: each is a method of its own
    (the method the user chose), a series, a row, a colour and a marker of its own; a method at three budgets stays one
    series; the post-hoc dense table is the panel's reference."""
    root = tmp_path / "runs"
    compress_output(root, "dense", "DenseEmbedding", "dense post-hoc", DENSE, {0: 0.80, 1: 0.82})
    compress_output(root, "int8", "ScalarQuantizedEmbedding", "int8 post-hoc", DENSE // 4, {0: 0.80, 1: 0.81})
    compress_output(root, "int4", "ScalarQuantizedEmbedding", "int4 post-hoc", DENSE // 8, {0: 0.78, 1: 0.80})
    for share in (10, 3, 1):
        compress_output(root, "sparse_coding", "SparseCodedEmbedding", f"sparse_coding {share}pct post-hoc",
                        DENSE * share // 100, {0: 0.5 + share / 100, 1: 0.52 + share / 100}, {"k": 3, "budget": share / 100})
    compress_output(root, "svd", "FactorizedEmbedding", "svd 10pct post-hoc", DENSE // 10, {0: 0.7, 1: 0.72})
    compress_output(root, "fit", "FactorizedEmbedding", "albert 10pct post-hoc", DENSE // 10, {0: 0.6, 1: 0.65},
                    {"strategy": "../embedding/albert_factorized.yaml", "budget": 0.1})
    assert main(["report", str(root), "--figure", str(tmp_path / "pareto.png")]) == 0
    table = rows(capsys.readouterr().out)
    assert {label: row[1] for label, row in table.items()} == {
        "dense post-hoc": "dense", "int8 post-hoc": "int8", "int4 post-hoc": "int4",
        **{f"sparse_coding {share}pct post-hoc": "sparse coding" for share in (10, 3, 1)},
        "svd 10pct post-hoc": "svd", "albert 10pct post-hoc": "fit FactorizedEmbedding albert_factorized"}
    assert {row[0] for row in table.values()} == {POST_HOC}
    assert table["int4 post-hoc"][4] == "12.5%"  # of the dense reference's bytes: the compress method "dense"

    from lit_embed.runs.results import load_results

    runs = [{**load_results(file.parent), "_task": "topics"} for file in sorted(root.rglob(RESULTS_FILE))]
    scores: dict = {}
    for run in runs:
        scores.setdefault(run["label"], {})[run["seed"]] = run["metrics"]["test/accuracy"]
    (panel,) = [a for a in draw(points_of(runs, scores), "topics accuracy").axes if a.get_title()]
    series = {c.get_label(): c for c in panel.containers}
    assert set(series) == {"dense", "int8", "int4", "sparse coding", "svd", "FactorizedEmbedding albert_factorized"}
    assert len(series["sparse coding"].lines[0].get_xdata()) == 3  # one line through its three budgets
    looks = {name: (c.lines[0].get_color(), c.lines[0].get_marker()) for name, c in series.items()}
    assert looks["int8"][0] != looks["int4"][0] and looks["int8"][1] != looks["int4"][1]
    assert len({colour for colour, _ in looks.values()}) == len({marker for _, marker in looks.values()}) == len(looks)


def test_a_model_fine_tuned_from_a_compress_output_is_a_point_of_that_method(tmp_path):
    """The zoo's post-hoc cells fine-tune MiniLM from a compress output (``model.init_args.checkpoint``): int8 and int4
    are two lines though one class; a fitted strategy keeps the colour and marker of its pre-trained line."""
    def run(label: str, size: int, strategy: str, method: str | None = None, fitted: str | None = None) -> dict:
        config = {}
        if method is not None:
            output = tmp_path / label.replace(" ", "_")
            write_json_atomic(output / "report.json", {"method": method, "details": {"strategy": fitted} if fitted else {}})
            config = {"model": {"init_args": {"checkpoint": str(output / "model.ckpt")}}}
        return {"label": label, "_task": "topics", "strategy": strategy, "variant": "post-hoc" if method else "",
                "run_dir": str(tmp_path / "finetune" / label / "version_0"), "config": config,
                "parameters": {"embedding_bytes": size}}

    runs = [run("robe 10%", 780_000, "ROBEEmbedding"), run("int8 post-hoc", 11_000_000, "ScalarQuantizedEmbedding", "int8"),
            run("int4 post-hoc", 6_000_000, "ScalarQuantizedEmbedding", "int4"),
            run("robe 10% post-hoc", 4_600_000, "ROBEEmbedding", "fit", "ROBEEmbedding")]
    (tmp_path / "finetune" / "robe 10%").mkdir(parents=True)
    (tmp_path / "finetune" / "robe 10%" / "report.json").write_text("another tool's")  # not a compress output
    points = points_of(runs, {r["label"]: {0: 0.5, 1: 0.6} for r in runs})
    assert {p.label: p.method for p in points} == {"robe 10%": "ROBEEmbedding", "int8 post-hoc": "int8 post-hoc",
                                                   "int4 post-hoc": "int4 post-hoc", "robe 10% post-hoc": "fit ROBEEmbedding post-hoc"}
    look = styles(points)
    assert look["int8 post-hoc"][0] != look["int4 post-hoc"][0] and look["int8 post-hoc"][1] != look["int4 post-hoc"][1]
    assert look["fit ROBEEmbedding post-hoc"] == look["ROBEEmbedding"]


def test_a_method_is_one_legend_entry_on_both_paths_though_only_its_fit_names_its_config():
    """The pre-trained run records its class; the post-hoc fit names the config it fitted where the name says more
    (``subspace_3``): one method, one name, colour and marker, unless two configs of one class were fitted."""
    def point(method: str, label: str) -> Point:
        return Point(method, label, 1000, {0: 0.5}, path=POST_HOC if POST_HOC_WORD in method.split(" ") else PRETRAINED)

    points = [point("SubspaceEmbedding", "subspace 10%"), point("fit SubspaceEmbedding subspace_3 post-hoc", "s post-hoc"),
              point("DPQEmbedding", "dpq 10%"), point("fit DPQEmbedding post-hoc", "dpq post-hoc"),
              point("fit DPQEmbedding dpq_vq post-hoc", "dpq_vq post-hoc"), point("svd post-hoc", "svd post-hoc"),
              point("fit FactorizedEmbedding albert_factorized post-hoc", "albert post-hoc")]
    assert kinds(points) == {"SubspaceEmbedding": "SubspaceEmbedding subspace_3",
                             "fit SubspaceEmbedding subspace_3 post-hoc": "SubspaceEmbedding subspace_3",
                             "DPQEmbedding": "DPQEmbedding", "fit DPQEmbedding post-hoc": "DPQEmbedding",
                             "fit DPQEmbedding dpq_vq post-hoc": "DPQEmbedding dpq_vq", "svd post-hoc": "svd",
                             "fit FactorizedEmbedding albert_factorized post-hoc": "FactorizedEmbedding albert_factorized"}
    look = styles(points)
    assert look["SubspaceEmbedding"] == look["fit SubspaceEmbedding subspace_3 post-hoc"]
    assert look["DPQEmbedding"] != look["fit DPQEmbedding dpq_vq post-hoc"] and look["svd post-hoc"] != look["DPQEmbedding"]
    figure = draw(points, "topics accuracy")
    labels = [label for axes in figure.axes for label in axes.get_legend_handles_labels()[1]]
    assert labels.count("SubspaceEmbedding subspace_3") == 2 and "SubspaceEmbedding" not in labels
