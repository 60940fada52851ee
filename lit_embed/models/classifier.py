"""Fine-tuning: a classification or regression head over any strategy and backbone.

The model starts from one of three places:

* a lit-embed pre-training checkpoint (``checkpoint:``): backbone and strategy weights and the
  strategy's defining buffers (sub-embedding codes, hash seeds) are restored; its strategy,
  vocabulary and tokenizer must be the ones the config builds. The model itself reads no file: ``lit-embed fit``
  reads the checkpoint once where it assembles the run (:mod:`lit_embed.commands.lightning`), with
  :func:`starting_arguments` and :func:`load_pretraining`; in Python, :func:`fine_tuning_from` does the same;
* a HuggingFace pretrained encoder (``encoder.init_args.pretrained``): its weights, with its word
  embeddings handed to the strategy (the dense strategy copies them); its tokenizer is the data's;
* scratch (ProFormer): neither of the two.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor, nn

from lit_embed.checkpoints.format import (
    FACTS,
    build_from_config,
    check_model,
    read_checkpoint,
    recorded_tokenizer,
    resolve_class,
    state_differences,
    strategy_factory,
)
from lit_embed.data.collate import TaskCollator
from lit_embed.data.finetune import labelled
from lit_embed.data.tasks import Task, TaskDefinition, get_task
from lit_embed.embeddings.state import fixed_shapes
from lit_embed.embeddings.text import TextEncoder
from lit_embed.errors import CheckpointError, ConfigError
from lit_embed.interfaces import TaskData, provides
from lit_embed.models.base import CompileMode, EmbeddingModule, Init, StrategyFactory
from lit_embed.models.encoder import Encoder
from lit_embed.models.metrics import POOLED, TaskEvaluation, selection_score
from lit_embed.models.optim import OptimConfig
from lit_embed.runs.folders import start_checkpoint

#: k-sub-embedding Table 6: peak 2e-5 with 6% warm-up and linear decay; the rest as in pre-training.
FINETUNE_OPTIM = OptimConfig(lr=2e-5, warmup=0.06)
STAGES = ("val", "test")
#: What a fine-tuning's start checkpoint is called in messages and in the checkpoints a command took.
START = "pre-training checkpoint"
#: The model arguments a start checkpoint gives where the config leaves them unset: its backbone, strategy and
#: vocabulary, and the dense baseline the pre-training was counted against (a hash strategy's vocabulary).
STARTING_ARGUMENTS = ("encoder", "embedding", "vocab_size", "baseline_vocab_size", "baseline_encoder")


class SequenceClassifier(EmbeddingModule):
    """Sentence (pair) classification, or regression where the task says so (STS-B, JSTS).

    The head reads the first (``cls``) position: through the backbone's pooler where it has one
    (BERT, RoBERTa, XLM-R), else through a dense+tanh layer of the same shape (DistilBERT), then
    dropout and a linear layer to the task's labels (one output for regression, MSE loss).

    Metrics are logged as ``{stage}/{metric}`` for a single evaluation set and
    ``{stage}/{set}/{metric}`` where there are several (``val/matched/accuracy``,
    ``test/de/accuracy`` and ``test/average/accuracy``); ``val/score`` selects checkpoints: the metric the
    data's paper selects by (the task's first unless the task table says otherwise: HashFormers' MRPC accuracy, and
    MNLI accuracy on matched and mismatched pooled), averaged over the sets where the data averages them. The task and
    the run's seed are recorded in the hyper-parameters.

    ``encoder``, ``embedding``, ``vocab_size``, ``baseline_vocab_size``, ``baseline_encoder``, ``init`` and ``torch_compile``: see
    :class:`EmbeddingModule`.

    Args:
        task: a task of :data:`lit_embed.data.tasks.TASKS`, or a config's own
            (:class:`~lit_embed.data.tasks.TaskDefinition`); must be the data's. A config leaves it unset: the
            CLI gives the model the data's (``data.init_args.task``).
        checkpoint: the lit-embed pre-training checkpoint the run starts from, for the record: ``lit-embed fit`` loads
            its weights where it assembles the run (:func:`fine_tuning_from` in Python); the model reads no file.
        classifier_dropout: dropout before the output layer (default the backbone's hidden dropout).
        optim: default the k-sub-embedding paper's fine-tuning (Table 6).
        seed: the run's seed, for the record: filled in from ``seed_everything`` when fitting starts
            (so checkpoints and logs carry it); it seeds nothing itself.
        trained_tokenizer: the tokenizer the weights expect, for the record: filled in from the data
            when fitting starts, so validating or testing the fine-tuned checkpoint needs no other file
            (not ``tokenizer``: loggers merge the model's and the data's hyper-parameters by name).
    """

    uses_pooler = True

    def __init__(
        self,
        task: str | TaskDefinition | None = None,
        encoder: Encoder | None = None,
        embedding: StrategyFactory | None = None,
        vocab_size: int | None = None,
        checkpoint: str | None = None,
        classifier_dropout: float | None = None,
        optim: OptimConfig | None = None,
        baseline_vocab_size: int | None = None,
        baseline_encoder: Encoder | None = None,
        seed: int | None = None,
        trained_tokenizer: str | None = None,
        init: Init = "default",
        torch_compile: bool | CompileMode = False,
    ) -> None:
        if task is None:
            raise ConfigError("SequenceClassifier needs a task: set data.init_args.task (the model takes the data's), "
                              "or model.init_args.task")
        if encoder is None:
            raise ConfigError("SequenceClassifier needs model.init_args.encoder (lit-embed fit takes it from "
                              "model.init_args.checkpoint where the config leaves it unset)")
        super().__init__(
            encoder=encoder, embedding=embedding, vocab_size=vocab_size, optim=optim or FINETUNE_OPTIM,
            baseline_vocab_size=baseline_vocab_size, baseline_encoder=baseline_encoder, init=init,
            torch_compile=torch_compile,
        )
        self.task: Task = labelled(get_task(task))
        if self.task.definition is not None:  # plain data with the labels it resolved: the checkpoint predicts alone
            self.hparams["task"] = self.task.definition
        self.checkpoint = checkpoint  # for the record: its weights are loaded where the run is assembled
        self.trained_tokenizer = trained_tokenizer
        hidden = self.encoder.hidden_size
        config = self.encoder.config
        dropout = classifier_dropout
        if dropout is None:
            dropout = getattr(config, "hidden_dropout_prob", None) or getattr(config, "dropout", 0.1)
        self.pre_classifier = None if self.encoder.has_pooler else nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, hidden), nn.Tanh())
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, self.task.num_outputs))
        self.initialise(*[head for head in (self.pre_classifier, self.classifier) if head is not None])
        num_classes = None if self.task.regression else self.task.num_outputs
        self.evaluation = nn.ModuleDict({stage: TaskEvaluation(self.task.metrics, num_classes) for stage in STAGES})

    # -- starting points -------------------------------------------------------------------------
    @property
    def expected_tokenizer(self) -> str | None:
        """The tokenizer the weights were trained with: the pretrained encoder's, or that of the weights it was given (a
        pre-training checkpoint's, an earlier fit's: both recorded as ``trained_tokenizer``)."""
        if self.encoder.pretrained is not None:
            return self.encoder.pretrained
        return self.trained_tokenizer

    def collator(self, text_encoder: TextEncoder, seed: int | None = None) -> TaskCollator:
        """Padded examples with their labels (class ids, or float scores for regression); nothing is drawn."""
        return TaskCollator(text_encoder, self.task.regression)

    def setup(self, stage: str) -> None:
        if stage == "fit":
            seed = os.environ.get("PL_GLOBAL_SEED")
            self.hparams["seed"] = int(seed) if seed is not None else None
            data = self.data
            self.trained_tokenizer = (data.tokenizer if provides(data, TaskData) else None) or self.expected_tokenizer
            self.hparams["trained_tokenizer"] = self.trained_tokenizer
        super().setup(stage)

    # -- forward and steps -----------------------------------------------------------------------
    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        """Logits ``(B, labels)``, or scores ``(B,)`` for regression."""
        out = self.encode(batch)
        if self.pre_classifier is None:
            features = out.pooler_output
        else:
            features = self.pre_classifier(out.last_hidden_state[:, 0])
        logits = self.classifier(features)
        return logits.squeeze(-1) if self.task.regression else logits

    def losses(self, outputs: Tensor, labels: Tensor) -> Tensor:
        """One loss per example: cross-entropy, or squared error for regression."""
        if self.task.regression:
            return nn.functional.mse_loss(outputs.float(), labels.float(), reduction="none")
        return nn.functional.cross_entropy(outputs.float(), labels, reduction="none")

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self.losses(self(batch), batch["labels"]).mean()
        self.log("train/loss", loss, prog_bar=True)
        return self.with_strategy_loss(loss)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._evaluate("val", batch, dataloader_idx)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._evaluate("test", batch, dataloader_idx)

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> list[dict]:
        """One record per text (:class:`~lit_embed.callbacks.predictions.PredictionWriter`): its row ``index`` and
        the predicted label with every label's probability (``p_<label>``), or the score of a regression."""
        outputs = self(batch).float()
        index = batch["index"].tolist()
        if self.task.regression:
            return [{"index": i, "score": score} for i, score in zip(index, outputs.tolist())]
        probabilities = outputs.softmax(-1)
        labels = self.task.labels
        return [
            {"index": i, "predicted": labels[int(p.argmax())], **{f"p_{name}": round(float(v), 6) for name, v in zip(labels, p)}}
            for i, p in zip(index, probabilities)
        ]

    def _evaluate(self, stage: str, batch: dict[str, Tensor], set_id: int) -> None:
        if "index" not in batch:
            raise ConfigError("evaluation batches need each example's row 'index' (TaskCollator adds it)")
        outputs = self(batch)
        preds = outputs.float() if self.task.regression else outputs.float().softmax(-1)  # probabilities: auroc too
        self.evaluation[stage].update(set_id, batch["index"], preds, batch["labels"], self.losses(outputs, batch["labels"]))

    def on_validation_epoch_end(self) -> None:
        self._log_evaluation("val")

    def on_test_epoch_end(self) -> None:
        self._log_evaluation("test")

    def _log_evaluation(self, stage: str) -> None:
        results = self.evaluation[stage].compute()
        self.evaluation[stage].reset()
        if not results:
            return
        data = self.data if provides(self.data, TaskData) else None
        sets = {set_id: values for set_id, values in results.items() if set_id != POOLED}
        names = data.eval_set_names(stage) if data is not None else [""]
        if len(names) < len(sets):
            names = [str(i) for i in range(max(sets) + 1)]
        metrics = (*self.task.metrics, "loss")
        for set_id, values in sets.items():
            for metric in metrics:
                self.log("/".join(p for p in (stage, names[set_id], metric) if p), values[metric], add_dataloader_idx=False)
        averaged = data is not None and data.average_eval_sets
        if averaged:
            for metric in metrics:
                mean = torch.stack([values[metric] for values in sets.values()]).mean()
                self.log(f"{stage}/average/{metric}", mean, add_dataloader_idx=False)
        selection = self.task.selection(data.paper if data is not None else None)  # the data's paper selects by it
        self.log(f"{stage}/score", selection_score(results, selection, averaged), prog_bar=stage == "val",
                 add_dataloader_idx=False)


def starting_arguments(checkpoint: dict, name: str, given: dict) -> dict:
    """What the pre-training ``checkpoint`` (named ``name``) gives of the model arguments ``given`` leaves unset
    (``None``): those of :data:`STARTING_ARGUMENTS` as the configs it records, and the tokenizer its weights expect
    (``trained_tokenizer``). A checkpoint that records no model is refused where the backbone, strategy or vocabulary
    is unset."""
    unset = [key for key in STARTING_ARGUMENTS if given.get(key) is None]
    check = check_model(checkpoint, {}, keys=unset)
    if check.recorded is None and any(given.get(key) is None for key in ("encoder", "embedding", "vocab_size")):
        raise CheckpointError(f"{START} {name!r} does not record its model: give model.init_args.encoder, embedding and "
                              f"vocab_size as it was trained")
    filled = dict(check.filled)
    tokenizer = recorded_tokenizer(checkpoint)
    if given.get("trained_tokenizer") is None and tokenizer is not None:
        filled["trained_tokenizer"] = tokenizer
    return filled


def load_pretraining(model: SequenceClassifier, checkpoint: dict, name: str) -> None:
    """Load the backbone and strategy of the pre-training ``checkpoint`` (named ``name``) into ``model``, refusing one
    trained with another strategy, vocabulary or backbone: before the model's data is set up, so that the strategy's
    state the data encodes with (hash keys, LSH n-grams, assignment codes) is the pre-training's."""
    facts = checkpoint.get(FACTS) or {}
    ours = model.embedding.config()["class_path"]
    if facts.get("strategy") is not None and resolve_class(facts["strategy"]) is not type(model.embedding):
        raise ConfigError(
            f"checkpoint {name!r} was trained with strategy {facts['strategy']} but the config builds {ours}: "
            f"leave model.init_args.embedding unset to take the checkpoint's, or set it to the pre-training's"
        )
    if facts.get("vocab_size") != model.embedding.vocab_size and "vocab_size" in facts:
        raise ConfigError(
            f"checkpoint {name!r} has vocab_size={facts['vocab_size']} but the config sets "
            f"{model.embedding.vocab_size}: set model.init_args.vocab_size {facts['vocab_size']}"
        )
    mine = {"encoder": model.encoder.as_config(), "embedding": model.embedding.config()}
    check = check_model(checkpoint, {"init_args": mine}, keys=mine)  # the file's backbone and strategy: the config's?
    if check.differences:
        raise ConfigError(
            f"checkpoint {name!r} was pre-trained as another model than the config builds "
            f"({check.listed()}): leave model.init_args.encoder and embedding unset to take the "
            f"checkpoint's, or set them as the pre-training did"
        )
    parts = ("encoder.", "embedding.")
    state = {k: v for k, v in checkpoint["state_dict"].items() if k.startswith(parts)}
    details = state_differences({k: v for k, v in model.state_dict().items() if k.startswith(parts)}, state,
                                sized=fixed_shapes(model))
    if details:
        raise CheckpointError(
            f"checkpoint {name!r} does not fit the configured backbone and strategy ({details}): use the "
            f"pre-training config's model.init_args.encoder, embedding and vocab_size"
        )
    model.load_state_dict(state, strict=False)
    model.trained_tokenizer = model.trained_tokenizer or recorded_tokenizer(checkpoint)


def fine_tuning_from(name: str | os.PathLike, task: str | TaskDefinition, **arguments: Any) -> SequenceClassifier:
    """A :class:`SequenceClassifier` for ``task`` started from the pre-training checkpoint ``name`` (a file, a run
    folder or an experiment folder), built in Python as ``lit-embed fit`` builds it from ``model.init_args.checkpoint``:
    the model ``arguments`` leave unset is the checkpoint's, and its backbone and strategy weights are loaded."""
    path = start_checkpoint(name, START)  # a file, or a run's newest
    checkpoint = read_checkpoint(path, START)
    build = {"encoder": lambda c: build_from_config(nn.Module, c, "encoder"), "embedding": strategy_factory,
             "baseline_encoder": lambda c: build_from_config(nn.Module, c, "baseline_encoder")}
    filled = starting_arguments(checkpoint, str(name), arguments)
    arguments.update({key: build.get(key, lambda c: c)(value) for key, value in filled.items()})
    model = SequenceClassifier(task, checkpoint=str(path), **arguments)
    load_pretraining(model, checkpoint, str(name))
    return model
