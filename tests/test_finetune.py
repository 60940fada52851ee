"""Fine-tuning: every task's data in the hub's layout, labels, metrics (exact under DDP), the
classifier from a pre-training checkpoint, from the packaged MiniLM and from DistilBERT, bad input."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_embed.commands import main
from lit_embed.commands.lightning import LitEmbedCLI
from lit_embed.data.finetune import TaskDataModule, XNLIDataModule, truncate_longest_first
from lit_embed.data.tasks import PAPERS, TASKS, XNLI_LANGUAGES, get_task
from lit_embed.embeddings import DenseEmbedding, SubspaceEmbedding
from lit_embed.errors import ConfigError
from lit_embed.interfaces import wire
from lit_embed.models import Encoder, MaskedLM, SequenceClassifier
from lit_embed.models.classifier import fine_tuning_from
from lit_embed.models.metrics import POOLED, TaskEvaluation, selection_score
from tests.helpers import CONFIGS, TINY_CANINE, tiny_encoder
from tests.helpers.tasks import FORMATS, write_split, write_task

# -- the task table and every task's data -----------------------------------------------------------


def test_the_table_has_every_task_of_the_issue():
    glue = {"cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"}
    assert glue | {"jcola", "jsts", "jnli", "marc_ja", "xnli"} <= set(TASKS)
    assert [t for t in TASKS.values() if t.regression] == [TASKS["stsb"], TASKS["jsts"]]
    assert TASKS["cola"].main_metric == "matthews" and TASKS["jsts"].main_metric == "spearman"
    assert set(TASKS["mrpc"].metrics) == {"f1", "accuracy"} and TASKS["qqp"].main_metric == "f1"
    assert TASKS["jnli"].labels == TASKS["mnli"].labels == TASKS["xnli"].labels
    assert get_task("SST-2") is TASKS["sst2"] and get_task("MARC-ja") is TASKS["marc_ja"]


@pytest.mark.parametrize("name", [n for n in TASKS if n not in ("xnli", "topics")])
def test_each_task_reads_local_files_in_the_hubs_layout(name, tmp_path):
    task = TASKS[name]
    fmt = FORMATS[sorted(TASKS).index(name) % len(FORMATS)]  # every format across the tasks
    write_task(tmp_path, task, fmt)
    dm = TaskDataModule(name, tokenizer="all-MiniLM-L6-v2", data_dir=str(tmp_path), batch_size=4, max_length=16)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert batch["codes"].shape[0] == 4 and batch["codes"].shape[1] <= 16
    assert (batch["codes"][:, 0] == 101).all()  # [CLS]
    assert batch["labels"].dtype == (torch.float32 if task.regression else torch.long)
    if len(task.text_columns) == 2:
        assert (batch["token_type_ids"] == 1).any()  # the second segment
    assert dm.eval_set_names("val") == list(task.validation)
    for loaders in (dm.val_dataloader(), dm.test_dataloader()):
        assert all(len(loader.dataset) == 12 for loader in loaders)
        assert sorted(next(iter(loaders[0]))["index"].tolist()) == [0, 1, 2, 3]
    assert len(list(dm.train_texts())) == 12 * len(task.text_columns)


def test_split_train_protocol_holds_out_ten_percent_with_seed_42(tmp_path):
    write_task(tmp_path, TASKS["rte"], "parquet")
    write_split(tmp_path / "rte", TASKS["rte"], "train", "parquet", count=50)
    dm = TaskDataModule("rte", tokenizer="all-MiniLM-L6-v2", data_dir=str(tmp_path), protocol="split_train")
    dm.setup()
    assert (len(dm.train_set), len(dm.eval_sets["val"][""])) == (45, 5)
    assert dm.eval_set_names("val") == [""] and dm.eval_set_names("test") == [""]
    assert len(dm.eval_sets["test"][""]) == 12  # GLUE's validation split is the test set
    again = TaskDataModule("rte", tokenizer="all-MiniLM-L6-v2", data_dir=str(tmp_path), protocol="split_train")
    assert list(again.train_texts()) == list(dm.train_texts())  # the same 90% every time


def test_jcola_tests_on_out_of_domain_under_split_train(tmp_path):
    write_task(tmp_path, TASKS["jcola"], "jsonl")
    dm = TaskDataModule("jcola", tokenizer="all-MiniLM-L6-v2", data_dir=str(tmp_path), protocol="split_train")
    assert dm.test_sources() == {"": ("JCoLA", "validation_out_of_domain")}
    assert TaskDataModule("jcola", tokenizer="x").eval_set_names("test") == ["in_domain", "out_of_domain"]


def test_xnli_cross_lingual_and_translate_train_all(tmp_path):
    task = TASKS["xnli"]
    for number, lang in enumerate(XNLI_LANGUAGES):
        for split in ("train", "validation", "test"):
            write_split(tmp_path / lang, task, split, "parquet", count=6, seed=number)
    cross = XNLIDataModule("cross_lingual", tokenizer="all-MiniLM-L6-v2", data_dir=str(tmp_path))
    cross.setup()
    assert len(cross.train_set) == 6 and cross.eval_set_names("val") == ["en"]
    assert cross.eval_set_names("test") == list(XNLI_LANGUAGES) and len(cross.test_dataloader()) == 15
    everything = XNLIDataModule("translate_train_all", tokenizer="all-MiniLM-L6-v2", data_dir=str(tmp_path))
    everything.setup("fit")
    assert len(everything.train_set) == 6 * 15 and len(everything.val_dataloader()) == 15
    with pytest.raises(ValueError, match=r"XNLI has no language\(s\) \['xx'\]"):
        XNLIDataModule(test_languages=["en", "xx"])


def test_jnli_labels_are_normalised_to_mnli_order(tmp_path):
    """JNLI's hub order is entailment, contradiction, neutral; ours (MNLI/XNLI) entailment, neutral, contradiction."""
    import datasets

    task = TASKS["jnli"]
    hub_order = ["entailment", "contradiction", "neutral"]
    names = [hub_order[i % 3] for i in range(12)]
    expected = [TASKS["mnli"].labels.index(n) for n in names]
    as_ids = datasets.Features({"sentence1": datasets.Value("string"), "sentence2": datasets.Value("string"),
                                "label": datasets.ClassLabel(names=hub_order)})
    layouts = {
        "jsonl": lambda d, split: write_split(d, task, split, "jsonl"),  # label names, as JGLUE's own files
        "csv": lambda d, split: write_split(d, task, split, "csv"),  # integer ids in the hub's order
        "classlabel": lambda d, split: datasets.Dataset.from_dict(
            {"sentence1": ["a"] * 12, "sentence2": ["b"] * 12, "label": [hub_order.index(n) for n in names]},
            features=as_ids).to_parquet(str(d / f"{split}.parquet")),
    }
    for kind, write in layouts.items():
        folder = tmp_path / kind
        folder.mkdir()
        for split in ("train", "validation"):
            write(folder, split)
        dm = TaskDataModule("jnli", tokenizer="all-MiniLM-L6-v2", data_dir=str(folder))
        dm.setup("validate")
        assert list(dm.eval_sets["val"][""]["labels"]) == expected, kind


def test_mecab_pretokenisation_splits_japanese_words(tmp_path):
    pytest.importorskip("fugashi")
    pytest.importorskip("unidic_lite")
    task = TASKS["jsts"]
    folder = tmp_path / "JSTS"
    folder.mkdir()
    line = json.dumps({"sentence1": "日本語の文を単語に分けます。", "sentence2": "猫が寝ている。", "label": 1.5}, ensure_ascii=False)
    for split in ("train", "validation"):
        (folder / f"{split}.jsonl").write_text((line + "\n") * 4)
    dm = TaskDataModule(task.name, tokenizer="all-MiniLM-L6-v2", data_dir=str(tmp_path), pretokenize="mecab")
    texts = list(dm.train_texts())
    assert texts[0] == "日本 語 の 文 を 単語 に 分け ます 。"


def test_pairs_truncate_longest_first():
    assert truncate_longest_first([100, 10], 50) == [40, 10]
    assert truncate_longest_first([30, 30], 50) == [25, 25]
    assert truncate_longest_first([5, 7], 50) == [5, 7]
    assert truncate_longest_first([80], 20) == [20]


# -- metrics ----------------------------------------------------------------------------------------------


def evaluate(metrics, num_classes, preds, target, index=None, set_id=0, evaluation=None):
    evaluation = evaluation or TaskEvaluation(metrics, num_classes)
    index = torch.arange(len(preds)) if index is None else index
    evaluation.update(set_id, index, preds, target, torch.zeros(len(preds)))
    return evaluation


def test_classification_metrics_equal_scikit_learn():
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    rng = np.random.default_rng(0)
    target = rng.integers(0, 2, 200)
    preds = np.where(rng.random(200) < 0.7, target, 1 - target)
    result = evaluate(("accuracy", "f1", "matthews"), 2, torch.tensor(preds), torch.tensor(target)).compute()[0]
    assert float(result["accuracy"]) == pytest.approx(accuracy_score(target, preds), abs=1e-6)
    assert float(result["f1"]) == pytest.approx(f1_score(target, preds), abs=1e-6)
    assert float(result["matthews"]) == pytest.approx(matthews_corrcoef(target, preds), abs=1e-5)
    three = rng.integers(0, 3, 150)
    guess = np.where(rng.random(150) < 0.5, three, rng.integers(0, 3, 150))
    result = evaluate(("accuracy", "matthews"), 3, torch.tensor(guess), torch.tensor(three)).compute()[0]
    assert float(result["matthews"]) == pytest.approx(matthews_corrcoef(three, guess), abs=1e-5)


def test_regression_metrics_equal_scipy():
    from scipy.stats import pearsonr, spearmanr

    rng = np.random.default_rng(1)
    target = rng.uniform(0, 5, 300)
    preds = target + rng.normal(0, 1.0, 300)
    result = evaluate(("spearman", "pearson"), None, torch.tensor(preds, dtype=torch.float32),
                      torch.tensor(target, dtype=torch.float32)).compute()[0]
    assert float(result["pearson"]) == pytest.approx(pearsonr(preds, target)[0], abs=1e-5)
    assert float(result["spearman"]) == pytest.approx(spearmanr(preds, target)[0], abs=1e-5)


def test_duplicates_padded_by_a_distributed_sampler_are_not_counted():
    """Two ranks of a DistributedSampler over 7 examples: rank 1 gets example 0 again as padding."""
    from sklearn.metrics import accuracy_score
    from torch.utils.data import DistributedSampler

    target = torch.tensor([1, 0, 1, 1, 0, 0, 1])
    preds = torch.tensor([1, 1, 0, 0, 0, 1, 1])  # example 0 right: counting its duplicate inflates accuracy
    ranks = []
    for rank in range(2):
        index = torch.tensor(list(DistributedSampler(range(7), num_replicas=2, rank=rank, shuffle=False)))
        ranks.append(evaluate(("accuracy",), 2, preds[index], target[index], index=index))
    assert sum(len(torch.cat(r.index)) for r in ranks) == 8  # the sampler padded one duplicate in
    ranks[0].merge_state(ranks[1])  # what the DDP gather hands to compute()
    result = ranks[0].compute()[0]
    assert int(result["count"]) == 7
    assert float(result["accuracy"]) == pytest.approx(accuracy_score(target, preds))  # 3/7, not 4/8
    naive = (preds[[0, 2, 4, 6, 1, 3, 5, 0]] == target[[0, 2, 4, 6, 1, 3, 5, 0]]).float().mean()
    assert float(result["accuracy"]) != pytest.approx(float(naive))


def test_evaluation_sets_are_kept_apart_and_pooled():
    evaluation = evaluate(("accuracy",), 2, torch.tensor([1, 1]), torch.tensor([1, 1]), set_id=0)
    evaluate(("accuracy",), 2, torch.tensor([0, 0, 1]), torch.tensor([1, 1, 1]), set_id=1, evaluation=evaluation)
    result = evaluation.compute()
    assert float(result[0]["accuracy"]) == 1.0 and float(result[1]["accuracy"]) == pytest.approx(1 / 3)
    assert float(result[POOLED]["accuracy"]) == pytest.approx(3 / 5) and int(result[POOLED]["count"]) == 5
    assert POOLED not in evaluate(("accuracy",), 2, torch.tensor([1]), torch.tensor([1])).compute()  # one set: no pool


def two_sets(task, first: tuple[list, list], second: tuple[list, list]) -> dict:
    """:meth:`TaskEvaluation.compute` of ``task`` on two evaluation sets, each ``(predicted ids, labels)``."""
    evaluation = TaskEvaluation(task.metrics, task.num_outputs)
    for set_id, (preds, target) in enumerate((first, second)):
        evaluation.update(set_id, torch.arange(len(preds)), torch.tensor(preds), torch.tensor(target), torch.zeros(len(preds)))
    return evaluation.compute()


@pytest.mark.parametrize("paper", [*PAPERS, None])
@pytest.mark.parametrize("name", [name for name, task in TASKS.items() if not task.regression and task.benchmark == "glue"])
def test_val_score_follows_the_metric_each_paper_selects_by(name, paper):
    """Every GLUE classification task under every protocol, on two sets (as MNLI's matched and mismatched): the
    first 3/5 right (F1 0.5), the second 2/10 (F1 1/3); pooled accuracy 5/15."""
    task = TASKS[name]
    results = two_sets(task, ([1, 1, 0, 0, 0], [1, 0, 0, 0, 1]), ([1] * 10, [1, 1] + [0] * 8))
    selection = task.selection(paper)
    score = float(selection_score(results, selection))
    expected = {("mnli", "hashformers"): 5 / 15, ("mrpc", "hashformers"): 3 / 5}.get((name, paper))
    if expected is None:  # every other paper and task: the task's first metric on its first set
        assert selection.metric == task.main_metric and not selection.pooled
        expected = float(results[0][task.main_metric])
    assert score == pytest.approx(expected)
    assert float(selection_score(results, selection, averaged=True)) == pytest.approx(
        expected if selection.pooled else float((results[0][selection.metric] + results[1][selection.metric]) / 2))


def test_a_paper_metric_outside_the_tasks_metrics_is_refused():
    from lit_embed.data.tasks import Selection, Task, register_task

    for bad in ({"shown": {"hashformers": "f1"}}, {"selected": {"hashformers": Selection("matthews")}}):
        with pytest.raises(ConfigError, match=r"task 'mine': hashformers's metric '(f1|matthews)' is not one of its "
                                              r"metrics \['accuracy'\]: add it"):
            register_task(Task("mine", "user", "", None, ("text",), ("a", "b"), **bad))
    assert "mine" not in TASKS


# -- the classifier ----------------------------------------------------------------------------------------


def batch_of(codes: torch.Tensor, labels: torch.Tensor) -> dict:
    return {"codes": codes, "attention_mask": torch.ones_like(codes), "labels": labels,
            "token_type_ids": torch.zeros_like(codes), "index": torch.arange(len(codes))}


@pytest.mark.parametrize("name", ["stsb", "jsts"])
def test_regression_head_outputs_one_score_and_learns(name):
    torch.manual_seed(0)
    model = SequenceClassifier(name, tiny_encoder(), vocab_size=200)
    codes = torch.randint(5, 200, (8, 10))
    target = torch.linspace(0, 5, 8)
    batch = batch_of(codes, target)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    first = None
    for _ in range(30):
        out = model(batch)
        assert out.shape == (8,)
        loss = model.losses(out, target).mean()
        first = first if first is not None else float(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert float(loss) < 0.5 * first


def pretrain_checkpoint(tmp_path: Path, embedding=None, vocab_size: int = 30522) -> Path:
    """A real lit-embed pre-training checkpoint: two MLM steps on the shipped corpus."""
    import pytorch_lightning as pl

    from lit_embed.data.corpus import CorpusDataModule

    model = MaskedLM(tiny_encoder(), vocab_size=vocab_size, embedding=embedding)
    data = CorpusDataModule("all-MiniLM-L6-v2", files=["sample-corpus"], max_length=32, batch_size=4, val_size=2, max_texts=50)
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    wire(model, data)
    trainer.fit(model, data)
    path = tmp_path / "pretrain.ckpt"
    trainer.save_checkpoint(path)
    return path


def fit_topics(model, tmp_path: Path, **data_args):
    import pytorch_lightning as pl

    dm = TaskDataModule("topics", max_length=64, batch_size=8, **data_args)
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, val_check_interval=2, limit_val_batches=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path)
    wire(model, dm)
    trainer.fit(model, dm)
    return trainer, dm


def test_starts_from_a_pretraining_checkpoint_with_its_strategy_state(tmp_path):
    subspace = functools.partial(SubspaceEmbedding, num_tables=3)
    ckpt = pretrain_checkpoint(tmp_path, embedding=subspace)
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert state["lit_embed"]["tokenizer"] == "all-MiniLM-L6-v2"
    model = fine_tuning_from(ckpt, "topics", encoder=tiny_encoder(), vocab_size=30522, embedding=subspace)
    weight = "encoder.model.encoder.layer.0.attention.self.query.weight"
    assert torch.equal(model.state_dict()[weight], state["state_dict"][weight])  # loaded before any data is set up
    assert model.expected_tokenizer == "all-MiniLM-L6-v2"  # the data needs no tokenizer of its own
    assert model.checkpoint == str(ckpt)
    by_hand = SequenceClassifier("topics", tiny_encoder(), vocab_size=30522, checkpoint=str(tmp_path / "gone.ckpt"))
    assert by_hand.expected_tokenizer is None  # the model reads no file: its checkpoint argument is for the record
    trainer, dm = fit_topics(model, tmp_path)
    assert dm.tokenizer == "all-MiniLM-L6-v2"
    assert torch.equal(model.embedding.codes, state["state_dict"]["embedding.codes"])
    assert trainer.callback_metrics["val/score"] >= 0 and model.hparams["task"] == "topics"
    assert model.hparams["seed"] is None or isinstance(model.hparams["seed"], int)


def test_a_checkpoint_of_another_strategy_or_vocabulary_is_refused(tmp_path):
    subspace = functools.partial(SubspaceEmbedding, num_tables=3)
    ckpt = pretrain_checkpoint(tmp_path, embedding=subspace)
    with pytest.raises(ValueError, match="trained with strategy lit_embed.embeddings.SubspaceEmbedding but the config builds "
                                         "lit_embed.embeddings.DenseEmbedding"):
        fine_tuning_from(ckpt, "topics", encoder=tiny_encoder(), vocab_size=30522, embedding=DenseEmbedding)
    unset = fine_tuning_from(ckpt, "topics", encoder=tiny_encoder())  # the checkpoint's strategy and vocabulary
    assert isinstance(unset.embedding, SubspaceEmbedding) and unset.embedding.vocab_size == 30522
    with pytest.raises(ValueError, match="has vocab_size=30522 but the config sets 40000"):
        fine_tuning_from(ckpt, "topics", encoder=tiny_encoder(), vocab_size=40000, embedding=subspace)
    with pytest.raises(ValueError, match=r"pre-trained as another model .*model\.encoder\.num_heads: checkpoint 2, config 4"):
        four_heads = Encoder(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64, max_position_embeddings=66)
        fine_tuning_from(ckpt, "topics", encoder=four_heads, vocab_size=30522, embedding=subspace)
    model = fine_tuning_from(ckpt, "topics", encoder=tiny_encoder(), vocab_size=30522, embedding=subspace)
    save_other_tokenizer(tmp_path / "other_tokenizer")
    with pytest.raises(ValueError, match="differs from the model's tokenizer 'all-MiniLM-L6-v2'"):
        fit_topics(model, tmp_path, tokenizer=str(tmp_path / "other_tokenizer"))


def save_other_tokenizer(path: Path) -> None:
    from transformers import AutoTokenizer

    from lit_embed.hub import resolve_pretrained

    tokenizer = AutoTokenizer.from_pretrained(resolve_pretrained("all-MiniLM-L6-v2"))
    tokenizer.add_tokens(["zzzunseen"])
    tokenizer.save_pretrained(path)


def test_starts_from_the_packaged_minilm_with_its_word_embeddings(minilm_path, minilm_matrix, tmp_path):
    encoder = Encoder(pretrained="all-MiniLM-L6-v2")
    model = SequenceClassifier("topics", encoder, vocab_size=30522)
    assert torch.equal(model.embedding.weight.detach(), minilm_matrix)
    assert model.encoder.pretrained_word_embeddings is None  # handed over, not kept twice
    assert model.pre_classifier is None  # BERT's pooler feeds the head
    trainer, dm = fit_topics(model, tmp_path)
    assert dm.tokenizer == "all-MiniLM-L6-v2"  # the model's tokenizer by default
    with pytest.raises(ValueError, match="set vocab_size to 30522"):
        SequenceClassifier("topics", Encoder(pretrained="all-MiniLM-L6-v2"), vocab_size=1000)


@pytest.mark.parametrize("stored", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_an_encoder_stored_in_half_precision_trains_in_float32(stored, tmp_path):
    """Hub models are often stored in fp16 or bf16, and transformers loads them as stored: the encoder must
    hold float32 weights like the strategy beside it (mixed precision is the trainer's to apply)."""
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    BertModel(config).to(stored).save_pretrained(tmp_path / "half")
    model = SequenceClassifier("rte", Encoder(pretrained=str(tmp_path / "half")), vocab_size=300)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    batch = batch_of(torch.randint(0, 300, (2, 9)), torch.tensor([0, 1]))
    model.training_step(batch, 0).backward()
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in model.parameters())


def test_distilbert_loads_through_pretrained(tmp_path):
    """DistilBERT (no pooler, no token types) from a local folder, as distilbert-base-uncased would be."""
    from transformers import DistilBertConfig, DistilBertModel

    config = DistilBertConfig(vocab_size=300, dim=32, n_layers=1, n_heads=2, hidden_dim=64, max_position_embeddings=64)
    torch.manual_seed(0)
    hf = DistilBertModel(config).eval()
    hf.save_pretrained(tmp_path / "distil")
    model = SequenceClassifier("rte", Encoder(pretrained=str(tmp_path / "distil")), vocab_size=300)
    assert torch.equal(model.embedding.weight.detach(), hf.get_input_embeddings().weight.detach())
    assert model.pre_classifier is not None and model.encoder.max_length == 64
    codes = torch.randint(0, 300, (2, 9))
    batch = batch_of(codes, torch.tensor([0, 1]))
    batch["token_type_ids"][:, 5:] = 1  # dropped: DistilBERT has no segment embeddings
    model.eval()
    with torch.no_grad():
        ours = model.encode(batch).last_hidden_state
        theirs = hf(input_ids=codes, attention_mask=batch["attention_mask"]).last_hidden_state
    assert torch.allclose(ours, theirs, atol=1e-5)
    assert model(batch).shape == (2, 2)


# -- configs and the command line --------------------------------------------------------------------


ON_CPU = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "auto",
          "--trainer.precision", "32-true", "--trainer.logger", "false"]


@pytest.mark.parametrize("protocol", sorted((CONFIGS / "protocol").glob("*.yaml")), ids=lambda p: p.stem)
def test_protocols_compose_with_every_experiment(protocol, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for experiment in ("glue/stsb.yaml", "xnli/translate_train_all.yaml"):
        args = ["--config", str(CONFIGS / "experiments/finetune" / experiment), "--config", str(protocol)]
        cli = LitEmbedCLI(args=[*args, *ON_CPU, "--model.init_args.embedding", str(CONFIGS / "embedding/subspace_3.yaml")], run=False)
        assert cli.trainer.max_epochs in (3, 5) and type(cli.model.embedding).__name__ == "SubspaceEmbedding"
        if experiment == "glue/stsb.yaml":  # HashFormers validates STS-B every 108 steps (Table 5), across epochs
            every = (108, None) if protocol.stem == "hashformers" else (1.0, 1)
            assert (cli.trainer.val_check_interval, cli.trainer.check_val_every_n_epoch) == every
    if protocol.stem == "hashformers":
        assert cli.model.optim.schedule == "cosine_restarts" and cli.model.optim.betas == (0.9, 0.999)
    else:
        assert cli.datamodule.protocol == "split_train" and cli.datamodule.split_seed == 42


def learning_rates(optim, total: int) -> list[float]:
    """The learning rate of each of ``total`` optimiser steps under ``optim``'s schedule."""
    from lit_embed.models.optim import configure_adamw

    configured = configure_adamw(torch.nn.Linear(2, 2), optim, total, fused=False)
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    rates = []
    for _ in range(total):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


HASHFORMERS_FINETUNING = {  # every config that fine-tunes by HashFormers' Table 5, as a run composes it
    "protocol": ["--config", str(CONFIGS / "experiments/finetune/glue/rte.yaml"), "--config", str(CONFIGS / "protocol/hashformers.yaml")],
    "canine_c": ["--config", str(CONFIGS / "experiments/hashformers/canine_c.yaml"), "--model.init_args.encoder", TINY_CANINE],
    "proformer": ["--config", str(CONFIGS / "experiments/hashformers/proformer.yaml")],
}


@pytest.mark.parametrize("name", HASHFORMERS_FINETUNING)
def test_hashformers_fine_tuning_restarts_its_cosine_five_times_after_six_percent_warm_up(name, tmp_path, monkeypatch):
    """The authors' GLUE script (tr_glue.py:142-145): 6% warm-up to the peak, then 5 cosine cycles from the peak."""
    monkeypatch.chdir(tmp_path)
    cli = LitEmbedCLI(args=[*HASHFORMERS_FINETUNING[name], *ON_CPU], run=False)
    optim, total = cli.model.optim, 1000
    rates = learning_rates(optim, total)
    warmup = int(0.06 * total)
    assert all(a < b for a, b in zip(rates[:warmup], rates[1:warmup + 1]))  # rising until the peak
    starts = [warmup] + [step for step in range(warmup + 1, total) if rates[step] > rates[step - 1]]
    assert len(starts) == 5 and [rates[step] for step in starts] == pytest.approx([optim.lr] * 5)
    assert [b - a for a, b in zip(starts, starts[1:])] == [(total - warmup) // 5] * 4  # equal cycles
    assert min(rates[starts[1] - 3:starts[1]]) < 0.01 * optim.lr  # each cycle decays to about 0 before its restart


def test_a_cosine_without_cycles_is_refused_before_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli_fit(tmp_path, "--model.init_args.optim.schedule", "cosine_restarts", "--model.init_args.optim.num_cycles", "0") == 2
    assert "num_cycles=0 must be 1 or more" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.ckpt")) and not list(tmp_path.rglob("results.json"))


def test_a_given_validation_interval_overrides_the_papers_schedule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["--config", str(CONFIGS / "experiments/finetune/glue/rte.yaml"), "--config", str(CONFIGS / "protocol/hashformers.yaml")]
    cli = LitEmbedCLI(args=[*args, *ON_CPU, "--trainer.val_check_interval", "0.5"], run=False)
    assert (cli.trainer.val_check_interval, cli.trainer.check_val_every_n_epoch) == (0.5, 1)


def test_print_config_shows_the_papers_schedule_the_run_will_use(tmp_path, monkeypatch, capsys):
    import yaml

    monkeypatch.chdir(tmp_path)
    args = ["--config", str(CONFIGS / "experiments/finetune/glue/rte.yaml"), "--config", str(CONFIGS / "protocol/hashformers.yaml")]
    with pytest.raises(SystemExit) as exit:
        main(["fit", *args, "--print_config"])
    assert exit.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (printed["trainer"]["val_check_interval"], printed["trainer"]["check_val_every_n_epoch"]) == (48, None)


def printed_optim(capsys, *configs: Path) -> dict:
    """The optimiser of the composed ``configs`` as ``--print_config`` shows it (nothing is built or downloaded)."""
    import yaml

    with pytest.raises(SystemExit) as exit:
        main(["fit", *(a for c in configs for a in ("--config", str(c))), "--print_config"])
    assert exit.value.code == 0
    return yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]["optim"]


def test_sparse_coding_fine_tunes_glue_and_jglue_with_one_optimiser(tmp_path, monkeypatch, capsys):
    """The paper gives only learning rates (2e-5 GLUE, 5e-5 JGLUE): its GLUE files, a GLUE file under its protocol and
    its JGLUE files all take the same AdamW and schedule otherwise, not the k-sub-embedding files' settings."""
    monkeypatch.chdir(tmp_path)
    protocol = CONFIGS / "protocol/sparse_coding.yaml"
    glue = {f"glue/{p.stem} + protocol": printed_optim(capsys, p, protocol)
            for p in sorted((CONFIGS / "experiments/finetune/glue").glob("*.yaml"))}
    glue.update({f"sparse_coding/{p.stem}": printed_optim(capsys, p)
                 for p in sorted((CONFIGS / "experiments/sparse_coding").glob("*.yaml")) if p.stem != "minilm_topics"})
    jglue = {f"jglue/{p.stem}": printed_optim(capsys, p) for p in sorted((CONFIGS / "experiments/finetune/jglue").glob("*.yaml"))}
    assert len(glue) == 9 + 6 and len(jglue) == 4
    assert {name: optim.pop("lr") for name, optim in glue.items()} == dict.fromkeys(glue, 2e-5)
    assert {name: optim.pop("lr") for name, optim in jglue.items()} == dict.fromkeys(jglue, 5e-5)
    paper = {"weight_decay": 0.0, "betas": [0.9, 0.999], "eps": 1e-8, "warmup": 0, "schedule": "linear", "num_cycles": 1}
    assert {**glue, **jglue} == dict.fromkeys([*glue, *jglue], paper)
    k_sub = printed_optim(capsys, CONFIGS / "experiments/finetune/glue/rte.yaml")  # the file alone: Table 6's
    assert (k_sub["weight_decay"], k_sub["betas"], k_sub["warmup"]) == (0.01, [0.9, 0.98], 0.06)


def test_glue_configs_cover_the_nine_tasks():
    names = {p.stem for p in (CONFIGS / "experiments/finetune/glue").glob("*.yaml")}
    assert names == {"cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"}
    assert {p.stem for p in (CONFIGS / "experiments/finetune/jglue").glob("*.yaml")} == {"jcola", "jsts", "jnli", "marc_ja"}


def cli_fit(tmp_path: Path, *extra: str) -> int:
    args = ["fit", "--config", str(CONFIGS / "demo_finetune.yaml"), "--model.init_args.checkpoint", "null",
            "--data.init_args.tokenizer", "all-MiniLM-L6-v2", "--trainer.fast_dev_run", "true", *extra]
    return main(args)


def test_a_named_data_tokenizer_fits_with_a_logger(tmp_path, monkeypatch):
    """Loggers merge the model's and the data's hyper-parameters by name and refuse two values of one key."""
    monkeypatch.chdir(tmp_path)
    assert cli_fit(tmp_path, "--trainer.fast_dev_run", "false", "--trainer.max_steps", "1", "--trainer.limit_val_batches", "1",
                   "--trainer.limit_test_batches", "1", "--trainer.enable_progress_bar", "false") == 0
    assert list((tmp_path / "runs").rglob("events.out.tfevents*"))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--data.init_args.task", "mrcp", "--model.init_args.task", "mrcp"], "unknown task 'mrcp': did you mean 'mrpc'?"),
        (["--model.init_args.task", "sst2"], "the model is built for task 'sst2' but the data is 'topics'"),
        (["--model.init_args.checkpoint", "missing/last.ckpt"], "pre-training checkpoint 'missing/last.ckpt' does not exist"),
    ],
)
def test_bad_configuration_exits_non_zero_naming_the_fix(extra, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli_fit(tmp_path, *extra) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.parametrize(
    ("model_task", "data_task", "found"),
    [(None, "topics", "topics"), ("topics", "topics", "topics")],
)
def test_a_config_says_its_task_once_where_the_data_reads_it(model_task, data_task, found, tmp_path):
    """The model takes the data's task where the config leaves its own unset (the shipped configs say it once, in
    data); given in both it must agree (refused at setup otherwise: see above)."""
    from lit_embed.commands.lightning import ModelOnlyCLI

    config = {"model": {"class_path": "lit_embed.models.SequenceClassifier",
                        "init_args": {"encoder": str(CONFIGS / "backbone/tiny.yaml"), "vocab_size": 30522,
                                      **({"task": model_task} if model_task else {})}},
              "data": {"class_path": "lit_embed.data.TaskDataModule", "init_args": {"task": data_task}}}
    (tmp_path / "config.yaml").write_text(json.dumps(config))
    cli = ModelOnlyCLI(args=["--config", str(tmp_path / "config.yaml")], run=False)
    assert cli.model.task.name == found and cli.config.model.init_args.task == found


def test_a_classifier_without_a_task_is_refused_naming_where_to_give_it(tmp_path, capsys):
    config = {"model": {"class_path": "lit_embed.models.SequenceClassifier",
                        "init_args": {"encoder": str(CONFIGS / "backbone/tiny.yaml"), "vocab_size": 30522}},
              "data": {"class_path": "lit_embed.data.CorpusDataModule", "init_args": {"files": ["sample-corpus"]}}}
    (tmp_path / "config.yaml").write_text(json.dumps(config))  # data of no task
    assert main(["params", "--config", str(tmp_path / "config.yaml")]) == 2
    assert "SequenceClassifier needs a task: set data.init_args.task" in capsys.readouterr().err


@pytest.mark.parametrize("model", [object(), torch.nn.Linear(2, 2)])
def test_a_data_module_is_wired_only_to_a_model_it_can_feed(model):
    """wire() refuses, naming what it lacks, a model the data cannot feed, before anything is set up."""
    data = TaskDataModule("topics")
    with pytest.raises(ConfigError, match=rf"{type(model).__name__} cannot be fed by TaskDataModule: it lacks .*max_length"):
        wire(model, data)
    assert data.fed is None
    classifier = SequenceClassifier("topics", tiny_encoder(), vocab_size=30522)
    wire(classifier, data)
    assert data.model() is classifier and classifier.data is data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("drop_column", r"no column\(s\) \['label'\] .* task 'topics' expects \['text', 'label'\]"),
        ("bad_label", r"row 3 has label 'volcano', outside the label set \['city'"),
        ("empty", "the train split of task 'topics' has no rows"),
        ("line_break", r"row 3 has no label \(column 'label' is empty\): give it one, or, if the file has it, a row was "
                       r"split in two: a line break inside an unquoted text, or a stray \\r"),
        ("carriage_return", r"row 3 has no label \(column 'label' is empty\)"),
    ],
)
def test_bad_data_exits_non_zero_naming_the_problem(change, message, tmp_path, monkeypatch, capsys):
    import re

    from lit_embed.data.sources import SAMPLE_DIR

    monkeypatch.chdir(tmp_path)
    data = tmp_path / "topics"
    data.mkdir()
    for split in ("train", "validation", "test"):
        lines = (SAMPLE_DIR / "topics" / f"{split}.tsv").read_text().splitlines()[:20]
        if split == "train" and change == "drop_column":
            lines = [line.split("\t")[0] for line in lines]
        if split == "train" and change == "bad_label":
            lines[4] = lines[4].split("\t")[0] + "\tvolcano"
        if split == "train" and change == "empty":
            lines = lines[:1]
        if split == "train" and change == "line_break":  # a text with a line break, unquoted: its row ends there
            text, label = lines[4].split("\t")
            lines[4] = f"{text[:10]}\n{text[10:]}\t{label}"
        if split == "train" and change == "carriage_return":  # a stray \r where a tab was
            lines[4] = lines[4].replace("\t", "\r")
        (data / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    assert cli_fit(tmp_path, "--data.init_args.data_dir", str(data)) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not list(tmp_path.rglob("*.ckpt"))


def test_demo_finetunes_the_demo_checkpoint_end_to_end(tmp_path, monkeypatch, capsys):
    """configs/demo.yaml writes runs/demo/version_0/checkpoints/last.ckpt; configs/demo_finetune.yaml starts from
    it (``checkpoint: runs/demo``), trains, and tests the best checkpoint after fit (both shortened here); each fit
    ends by naming its run folder and checkpoints."""
    monkeypatch.chdir(tmp_path)
    quiet = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    assert main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--trainer.max_steps", "20",
                 "--trainer.limit_val_batches", "1", *quiet]) == 0
    assert (tmp_path / "runs/demo/version_0/checkpoints/last.ckpt").is_file()
    assert main(["fit", "--config", str(CONFIGS / "demo_finetune.yaml"), "--trainer.max_epochs", "1",
                 "--model.init_args.optim.lr", "3.0e-3", *quiet]) == 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(next((tmp_path / "runs/demo_finetune").rglob("events.out.tfevents*")).parent))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"val/accuracy", "val/score", "test/accuracy", "test/loss"} <= set(tags)
    after_fit = events.Scalars("test/accuracy")[-1].value
    assert after_fit > 0.3  # chance is 1/6
    best = next((tmp_path / "runs/demo_finetune/version_0/checkpoints").glob("epoch=*.ckpt"))
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lit-embed: fit: ")]
    assert len(said) == 2 and said[0].startswith("lit-embed: fit: run folder ") and "runs/demo/version_0;" in said[0]
    assert re.fullmatch(rf"lit-embed: fit: run folder \S*runs/demo_finetune/version_0; best checkpoint \S*{best.name} "
                        rf"\(val/score [0-9.]+\)", said[1]), said[1]  # its config keeps no last.ckpt
    assert torch.load(best, weights_only=True)["hyper_parameters"]["checkpoint"] == "runs/demo/version_0/checkpoints/last.ckpt"
    (tmp_path / "runs/demo/version_0/checkpoints/last.ckpt").unlink()  # testing the fine-tuned model needs only its own
    cli = LitEmbedCLI(args=["test", "--config", str(CONFIGS / "demo_finetune.yaml"), "--ckpt_path", str(best),
                            "--trainer.logger", "false", *quiet])
    assert float(cli.trainer.callback_metrics["test/accuracy"]) == pytest.approx(after_fit)
    assert cli.datamodule.tokenizer == "all-MiniLM-L6-v2"  # from the fine-tuned checkpoint


@pytest.mark.slow
def test_full_demo_finetune_is_well_above_chance(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--config", str(CONFIGS / "demo.yaml")]) == 0
    assert main(["fit", "--config", str(CONFIGS / "demo_finetune.yaml")]) == 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(next((tmp_path / "runs/demo_finetune").rglob("events.out.tfevents*")).parent))
    events.Reload()
    assert events.Scalars("test/accuracy")[-1].value > 0.6


def test_docs_task_table_is_the_task_table():
    from tests.helpers.cli import section as docs_section

    section = docs_section("own-data", "Fine-tuning: checkpoints, tasks and protocols")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    by_metric = {row[0]: row[4].split(",")[0].split(" ")[0] for row in rows}
    assert len(rows) == len(TASKS)
    for task in TASKS.values():
        shown = {"sst2": "SST-2", "stsb": "STS-B", "marc_ja": "MARC-ja", "topics": "topics"}.get(task.name)
        name = shown or next(k for k in by_metric if k.lower() == task.name)
        assert by_metric[name] == task.main_metric, name
