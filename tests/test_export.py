"""`lit-embed export`: every strategy's export loads with transformers alone and computes what lit-embed does."""

from __future__ import annotations

import ast
import functools
import inspect
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from lit_embed import embeddings
from lit_embed.checkpoints.format import FACTS, describe, load_model
from lit_embed.commands import main
from lit_embed.embeddings import (
    DenseEmbedding,
    EmbeddingStrategy,
    HashPool,
    HashProj,
    SparseCodedEmbedding,
    VocabTextEncoder,
)
from lit_embed.errors import ConfigError
from lit_embed.export.folder import MARKER, UNSUPPORTED, export
from lit_embed.models import MaskedLM, SequenceClassifier, ShuffleRandom
from tests.helpers import REPO, tiny_encoder

OLD = REPO / "tests" / "data" / "main-1efeeea"
#: Every strategy export supports (CANINE's is refused).
EXPORTABLE = [cls for cls in vars(embeddings).values() if isinstance(cls, type) and issubclass(cls, EmbeddingStrategy)
              and not inspect.isabstract(cls) and cls.__name__ not in UNSUPPORTED]
#: What writes files (a call of a function or method of these names).
WRITERS = {"open", "write", "write_text", "write_bytes", "save", "savez", "savez_compressed", "tofile", "save_file", "dump",
           "mkdir", "makedirs", "touch", "unlink", "remove", "rmdir", "rmtree", "rename", "replace", "fdopen", "mkstemp",
           "copyfile", "copy2", "copytree", "symlink_to", "hardlink_to", "save_pretrained"}
TOKENIZER = "all-MiniLM-L6-v2"
TEXTS = ["The cat sat on the mat.", "Hashing words needs no vocabulary"]


def _save(module, path):
    """A checkpoint as lit-embed writes it: weights and the facts that rebuild the model."""
    torch.save({"state_dict": module.state_dict(), FACTS: describe(module, TOKENIZER, None)}, path)
    return path


def _perturbed(module, seed: int):
    """Non-default weights, so that a weight the export drops or misplaces shows in the outputs."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return module.eval()


def _sparse_coded_classifier():
    embedding = functools.partial(SparseCodedEmbedding, num_common=200, k=3)
    module = SequenceClassifier("topics", encoder=tiny_encoder(16), embedding=embedding, vocab_size=30522)
    strategy, generator = module.embedding, torch.Generator().manual_seed(3)
    strategy.split(torch.randperm(30522, generator=generator)[:200])
    strategy.neighbours.copy_(torch.randint(0, 200, strategy.neighbours.shape, generator=generator))
    strategy.weights.copy_(torch.rand(strategy.weights.shape, generator=generator).softmax(-1))
    strategy.norms.copy_(torch.rand(strategy.norms.shape, generator=generator) + 0.5)
    return module


def _post_hoc_classifier(method: str, **options):
    """A classifier whose embedding ``lit-embed compress --method METHOD`` fitted to a random table (codes in buffers)."""
    from lit_embed.testing import contract_job, fitted

    (strategy,) = fitted(method, options, contract_job(30522, 16, seed=5)).values()
    module = SequenceClassifier("topics", encoder=tiny_encoder(16), embedding=DenseEmbedding, vocab_size=30522)
    module.embedding = strategy  # its config is read from it, as compress's output records it
    return _perturbed(module, 6)


def _dense_classifier(arch: str, pooler: bool):
    """A dense classifier of the demo task (six topics) on a tiny BERT or RoBERTa, with or without the pooler."""
    encoder = tiny_encoder(16, arch=arch, pooler=pooler, type_vocab_size=2 if arch == "bert" else 1)
    return _perturbed(SequenceClassifier("topics", encoder=encoder, embedding=DenseEmbedding, vocab_size=30522), 7)


#: name -> (how to get the checkpoint, the transformers class that loads its export)
CASES = {
    "dense": (lambda tmp: _save(_perturbed(MaskedLM(tiny_encoder(16), vocab_size=30522, embedding=DenseEmbedding), 1),
                                tmp / "dense.ckpt"), "AutoModel"),
    "subspace": (lambda tmp: OLD / "pretrain.ckpt", "AutoModel"),  # a trained 3-sub-embedding MaskedLM
    "subspace-classifier": (lambda tmp: OLD / "finetune.ckpt", "AutoModelForSequenceClassification"),
    "hash-proj": (lambda tmp: _save(_perturbed(ShuffleRandom(tiny_encoder(16), embedding=HashProj, baseline_vocab_size=30522), 2),
                                    tmp / "proj.ckpt"), "AutoModel"),
    "hash-pool": (lambda tmp: _save(_perturbed(ShuffleRandom(tiny_encoder(16), embedding=functools.partial(
        HashPool, chunk_bits=6)), 4), tmp / "pool.ckpt"), "AutoModel"),
    "unk-compressed": (lambda tmp: OLD / "compressed" / "model.ckpt", "AutoModelForSequenceClassification"),
    "sparse-coded": (lambda tmp: _save(_sparse_coded_classifier(), tmp / "sparse.ckpt"), "AutoModelForSequenceClassification"),
    "int4": (lambda tmp: _save(_post_hoc_classifier("int4"), tmp / "int4.ckpt"), "AutoModelForSequenceClassification"),
    "pq": (lambda tmp: _save(_post_hoc_classifier("pq", groups=4, codewords=16, iterations=2), tmp / "pq.ckpt"),
           "AutoModelForSequenceClassification"),
    "bert-classifier": (lambda tmp: _save(_dense_classifier("bert", True), tmp / "bert.ckpt"), "AutoModelForSequenceClassification"),
    "bert-classifier-no-pooler": (lambda tmp: _save(_dense_classifier("bert", False), tmp / "bert_np.ckpt"),
                                  "AutoModelForSequenceClassification"),
    "roberta-classifier": (lambda tmp: _save(_dense_classifier("roberta", True), tmp / "roberta.ckpt"),
                           "AutoModelForSequenceClassification"),
    "pq-materialised": (lambda tmp: tmp / "pq.ckpt", "AutoModelForSequenceClassification"),
}
#: The cases exported as their backbone's own transformers model (dense, or --materialise), loaded without custom code.
NATIVE = {"dense": "RobertaModel", "bert-classifier": "BertForSequenceClassification",
          "bert-classifier-no-pooler": "BertForSequenceClassification",
          "roberta-classifier": "RobertaForSequenceClassification", "pq-materialised": "RobertaForSequenceClassification"}


def _tampered(marker: str) -> dict:
    """name -> an edit of a hash export's strategy config in ``config.json`` that would write ``marker`` if the
    export's code called what it names (its file-writing helpers, torch.save) or built it from more than plain data."""
    write = {"class_path": "lit_embed.storage.files.write_atomic", "init_args": {"path": marker, "content": "ran"}}
    save = {"class_path": "torch.save", "init_args": {"obj": 1, "f": marker}}
    return {
        "a file writer as the strategy": lambda strategy: write,
        "another of the module's classes": lambda strategy: {"class_path": "x.LitEmbedModel", "init_args": {}},
        "an undeclared class inside": lambda strategy: {**strategy, "init_args": {**strategy["init_args"], "hasher": save}},
        "a class config in plain data": lambda strategy: {**strategy, "init_args": {**strategy["init_args"], "hasher": [save]}},
    }


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every case exported (the subspace classifier through the real CLI, in a subprocess) and loaded by
    transformers in one subprocess where lit_embed cannot be imported, cwd outside the repo; and copies of the
    hash-proj export whose config.json was edited (:func:`_tampered`), which loading must refuse."""
    tmp = tmp_path_factory.mktemp("export")
    jobs, checkpoints = [], {}
    for name, (make, auto) in CASES.items():
        checkpoints[name] = make(tmp)
        folder = tmp / name
        if name == "subspace-classifier":
            done = subprocess.run([sys.executable, "-m", "lit_embed.commands", "export", "--ckpt", str(checkpoints[name]),
                                   "--out", str(folder)], capture_output=True, text=True, cwd=REPO)
            assert done.returncode == 0, done.stderr
            assert "trust_remote_code=True" in done.stdout
        else:
            export(str(checkpoints[name]), str(folder), materialise=name.endswith("materialised"))
        job = {"folder": str(folder), "auto": auto, "out": str(tmp / f"{name}.pt"), "trust": name not in NATIVE}
        if name == "bert-classifier":
            job["pipeline"] = TEXTS
        if name.startswith("hash") or name in ("subspace-classifier", "bert-classifier"):
            job["texts"] = TEXTS
        else:
            ids = torch.randint(0, 30522, (2, 7), generator=torch.Generator().manual_seed(0))
            job["inputs"] = {"input_ids": ids.tolist(), "attention_mask": [[1] * 7, [1] * 5 + [0] * 2]}
        jobs.append(job)
    for number, edit in enumerate(_tampered(str(tmp / "PWNED")).values()):
        folder = tmp / f"tampered{number}"
        shutil.copytree(tmp / "hash-proj", folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "strategy": edit(config["strategy"])}))
        jobs.append({"folder": str(folder), "auto": "AutoModel", "refused": True, "out": str(tmp / f"tampered{number}.pt")})
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_MODULES_CACHE"] = str(tmp / "hf_modules")
    outside = tmp / "elsewhere"
    outside.mkdir()
    done = subprocess.run([sys.executable, str(REPO / "tests" / "helpers" / "export_loader.py"), str(tmp / "jobs.json")],
                          capture_output=True, text=True, cwd=outside, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "lit_embed imported: False" in done.stdout
    cases = {name: (checkpoints[name], tmp / name, torch.load(tmp / f"{name}.pt")) for name in CASES}
    refused = {name: torch.load(tmp / f"tampered{number}.pt")["error"] for number, name in enumerate(_tampered(""))}
    return {**cases, "refused": (refused, (tmp / "PWNED").exists())}


def test_an_edited_config_json_builds_only_the_strategy_the_export_declares(exported):
    """Loading runs the export's code with what config.json says: it builds the classes of the exported strategy from
    plain data, and nothing else, so an edited file cannot make it call a function (none of which writes files)."""
    refused, wrote = exported["refused"]
    assert not wrote
    for name, error in refused.items():
        assert error is not None and re.search(r"which this export does not build|which is not plain data", error), (name, error)


@pytest.mark.parametrize("strategy", EXPORTABLE, ids=lambda cls: cls.__name__)
def test_an_exports_code_holds_nothing_that_writes_files(strategy):
    """The generated modelling code of every strategy's export calls no file writer, and names lit-embed's
    writers only as functions that say lit-embed is needed."""
    from lit_embed.export.vendor import NEEDS_LIT_EMBED, module_source

    source = module_source(strategy, (REPO / "lit_embed/export/modeling_lit_embed.py").read_text(), ["x.Y"])
    tree = ast.parse(source)
    stubs = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)
             and ast.unparse(node.body[0]) == NEEDS_LIT_EMBED}
    called = [node.func for node in ast.walk(tree) if isinstance(node, ast.Call)]
    names = {f.id if isinstance(f, ast.Name) else f.attr for f in called if isinstance(f, (ast.Name, ast.Attribute))}
    assert not (names - stubs) & WRITERS, (names - stubs) & WRITERS
    assert {"write_atomic", "atomic_writer", "write_json_atomic", "write_codes"} & (names - stubs) == set()
    assert "DECLARED_CLASSES = frozenset(['x.Y'])" in source


@pytest.mark.parametrize("name", list(CASES))
def test_export_computes_what_lit_embed_computes(exported, name):
    checkpoint, folder, loaded = exported[name]
    module, _ = load_model(checkpoint)
    module.eval()
    inputs = loaded["inputs"]
    batch = {"codes": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
    with torch.no_grad():
        expected = module(batch) if isinstance(module, SequenceClassifier) else module.encode(batch).last_hidden_state
    assert torch.allclose(loaded["output"], expected, atol=1e-5), (loaded["output"] - expected).abs().max()
    if name.startswith("hash"):  # the folder's own hashing gives lit-embed's codes
        codes = module.text_encoder(None).encode(TEXTS)
        assert torch.equal(inputs["input_ids"][0, 1:-1], torch.as_tensor(codes[0]))
    elif name == "subspace-classifier":  # the folder's tokenizer gives lit-embed's codes
        encoder = VocabTextEncoder(TOKENIZER)
        expected_ids = [int(encoder.special_code("cls")), *encoder.encode(TEXTS[:1])[0], int(encoder.special_code("sep"))]
        assert inputs["input_ids"][0, : len(expected_ids)].tolist() == expected_ids
    else:
        assert (folder / "tokenizer.json").is_file()
    mask = os.umask(0o022)
    os.umask(mask)
    assert {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()} == {p.name: 0o666 & ~mask for p in folder.iterdir()}
    card = (folder / "README.md").read_text()
    assert "embedding params" in card and f"checkpoint: `{checkpoint.name}`" in card
    assert ("trust_remote_code=True" in card) == (name not in NATIVE) == ("custom_code" in card)
    assert loaded["class"] == NATIVE.get(name, loaded["class"]) and (name not in NATIVE) == (folder / "modeling_lit_embed.py").exists()
    for path in folder.iterdir():  # what an upload publishes names no folder of this machine
        if path.name not in (MARKER, "model.safetensors"):
            assert str(checkpoint.parent) not in path.read_text() and sys.prefix not in path.read_text(), path.name


@pytest.mark.parametrize("name", [name for name, (_, auto) in CASES.items() if auto == "AutoModelForSequenceClassification"])
def test_a_classifiers_export_names_the_tasks_labels_everywhere(exported, name):
    """id2label and label2id hold the task's names (not LABEL_0, LABEL_1), in the backbone's config that a custom-code
    export nests too; a native export is served by transformers' pipeline without trust_remote_code, by name."""
    checkpoint, folder, loaded = exported[name]
    module, _ = load_model(checkpoint)
    labels = dict(enumerate(module.task.labels))
    config = json.loads((folder / "config.json").read_text())
    for where in (config, config.get("backbone", config)):
        assert {int(i): label for i, label in where["id2label"].items()} == labels
        assert where["label2id"] == {label: i for i, label in labels.items()}
    if loaded["served"] is not None:
        assert [answer["label"] for answer in loaded["served"]] == [labels[i] for i in loaded["output"].argmax(-1).tolist()]


def test_materialise_refuses_a_strategy_without_a_table_before_writing(exported, tmp_path):
    checkpoint, _, _ = exported["hash-proj"]
    with pytest.raises(ConfigError, match="HashProj has no finite vocabulary to write out as a table; export it without --materialise"):
        export(str(checkpoint), str(tmp_path / "out"), materialise=True)
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_what_it_must_not_replace(exported, tmp_path, capsys):
    checkpoint, folder, _ = exported["dense"]
    assert main(["export", "--ckpt", str(checkpoint), "--out", str(folder)]) == 2
    assert "exists" in capsys.readouterr().err
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    assert main(["export", "--ckpt", str(checkpoint), "--out", str(foreign), "--overwrite"]) == 2
    assert f"not a lit-embed export (no {MARKER})" in capsys.readouterr().err
    assert (foreign / "notes.txt").read_text() == "keep"
    assert main(["export", "--ckpt", str(tmp_path / "missing.ckpt"), "--out", str(tmp_path / "x")]) == 2
    assert "missing.ckpt" in capsys.readouterr().err and not (tmp_path / "x").exists()
    again = tmp_path / "again"
    export(str(checkpoint), str(again))
    (again / "model.safetensors").write_bytes(b"stale")  # rewritten, whatever the clock's resolution
    assert main(["export", "--ckpt", str(checkpoint), "--out", str(again), "--overwrite"]) == 0
    assert (again / "model.safetensors").read_bytes() != b"stale"
    taken = json.loads((again / MARKER).read_text())["checkpoints_taken"]  # which file the export was made from
    assert [(r["what"], r["given"], r["file"], r["why"]) for r in taken] == [
        ("checkpoint", str(checkpoint), str(checkpoint.absolute()), "the file given")]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary folder left


@pytest.mark.parametrize("taken", ["an earlier export", "a folder of yours", "the checkpoint's folder"])
def test_export_refuses_a_taken_out_before_loading_anything(taken, tmp_path, monkeypatch, capsys):
    """Before the seconds of loading a checkpoint: an existing --out (with --overwrite, one that is no earlier export,
    or that holds the checkpoint itself)."""
    import lit_embed.runs.folders

    monkeypatch.setattr(lit_embed.runs.folders, "start_checkpoint", lambda ckpt: pytest.fail("export loaded the checkpoint"))
    ckpt = tmp_path / "run" / "model.ckpt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"not read")
    out, extra, message = {
        "an earlier export": (tmp_path / "old", [], "exists: choose another --out or pass --overwrite"),
        "a folder of yours": (tmp_path / "mine", ["--overwrite"], f"is not a lit-embed export (no {MARKER})"),
        "the checkpoint's folder": (ckpt.parent, ["--overwrite"], "which this command reads"),
    }[taken]
    out.mkdir(exist_ok=True)
    if taken == "an earlier export":
        (out / MARKER).write_text(json.dumps({"source": "x"}))
    assert main(["export", "--ckpt", str(ckpt), "--out", str(out), *extra]) == 2
    assert message in capsys.readouterr().err
    assert ckpt.read_bytes() == b"not read"


@pytest.fixture
def hub(monkeypatch, tmp_path_factory):
    """The stand-in hub (tests/helpers/hub_standin.py) as this process's hub, online, with a token."""
    import huggingface_hub.constants

    from tests.helpers.hub_standin import StandInHub

    standin = StandInHub()
    monkeypatch.setenv("HF_ENDPOINT", standin.url)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # read once, at its import
    monkeypatch.setenv("HF_TOKEN", "hf_standin")
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf_home")))  # what the client caches stays in the test
    yield standin
    standin.close()


def test_export_pushes_the_folder_to_the_hub_without_its_local_provenance(exported, hub, tmp_path, capsys):
    """--push-to-hub: the repository created, every file of the export committed as written but lit_embed_export.json
    (local paths), the model card's metadata as the hub validates it, with the user's token."""
    checkpoint, _, _ = exported["bert-classifier"]
    out = tmp_path / "topics"
    assert main(["export", "--ckpt", str(checkpoint), "--out", str(out), "--push-to-hub", "me/topics"]) == 0
    said = capsys.readouterr().out
    assert "(BertForSequenceClassification): load it with AutoModelForSequenceClassification.from_pretrained(" in said
    assert "trust_remote_code" not in said and f"pushed to {hub.url}/me/topics" in said
    pushed = hub.repos["me/topics"]
    assert sorted(pushed) == sorted(p.name for p in out.iterdir() if p.name != MARKER)
    assert all(pushed[name] == (out / name).read_bytes() for name in pushed)
    assert set(hub.tokens) == {"Bearer hf_standin"} and hub.cards == [(out / "README.md").read_text()]
    # again: the repository exists, the new commit replaces its files
    assert main(["export", "--ckpt", str(checkpoint), "--out", str(out), "--overwrite", "--push-to-hub", "me/topics"]) == 0


def test_a_push_that_fails_says_why_and_keeps_the_export(exported, hub, tmp_path, monkeypatch, capsys):
    checkpoint, _, _ = exported["bert-classifier"]
    monkeypatch.delenv("HF_TOKEN")
    out = tmp_path / "topics"
    assert main(["export", "--ckpt", str(checkpoint), "--out", str(out), "--push-to-hub", "me/topics"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"lit-embed: error: could not push {out} to me/topics: ") and "401" in err
    assert f"hf upload me/topics {out} --exclude {MARKER}" in err and (out / "model.safetensors").is_file()
    assert hub.repos == {}


@pytest.mark.parametrize(("repo", "offline", "expected"), [
    ("topics", "0", "--push-to-hub 'topics' names no owner: give USER/NAME"),
    ("me/to pics", "0", "--push-to-hub 'me/to pics' is not a repository name"),
    ("me/topics", "1", "--push-to-hub me/topics: the hub is not used here (HF_HUB_OFFLINE=1 is set)"),
])
def test_a_push_that_cannot_work_is_refused_before_the_export(repo, offline, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    assert main(["export", "--ckpt", str(tmp_path / "none.ckpt"), "--out", str(tmp_path / "out"), "--push-to-hub", repo]) == 2
    assert expected in capsys.readouterr().err and list(tmp_path.iterdir()) == []


def test_a_dense_classifier_whose_backbones_head_is_not_lit_embeds_keeps_its_own_code(exported, tmp_path, monkeypatch, caplog):
    """As a DistilBERT's (its head has a ReLU): here RoBERTa's, taken out of the table of heads that compute lit-embed's."""
    from lit_embed.export import folder as export_folder

    checkpoint, _, _ = exported["roberta-classifier"]
    monkeypatch.setattr(export_folder, "NATIVE_HEADS", {"bert": "pooler"})
    export(str(checkpoint), str(tmp_path / "out"))
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["LitEmbedForSequenceClassification"]
    assert "transformers' roberta classifier head is not lit-embed's" in caplog.text
    with pytest.raises(ConfigError, match="cannot be exported as its backbone's own architecture: transformers' roberta"):
        export(str(checkpoint), str(tmp_path / "again"), materialise=True)


def test_in_a_log_the_libraries_draw_no_progress_bars(exported, tmp_path, monkeypatch):
    """stderr to a file: transformers' "Writing model shards" / "Loading weights" bars (\\r redraws) are off; a switch
    the user set is kept."""
    from lit_embed import notices

    checkpoint, _, _ = exported["bert-classifier"]
    env = {k: v for k, v in os.environ.items() if not k.endswith("_DISABLE_PROGRESS_BARS")}
    with (tmp_path / "log").open("w") as log:
        done = subprocess.run([sys.executable, "-m", "lit_embed.commands", "export", "--ckpt", str(checkpoint), "--out",
                               str(tmp_path / "out")], stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, env=env, timeout=600)
    text = (tmp_path / "log").read_text()
    assert done.returncode == 0 and "\r" not in text and "Writing model shards" not in text, text
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    monkeypatch.delenv("HF_DATASETS_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.setattr(notices.sys.stderr, "isatty", lambda: False)
    notices.quiet("export")
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0" and os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1"
