"""Fine-tuning: a classification or regression head over any strategy and backbone.

The model starts from one of three places:

* a lit-embed pre-training checkpoint (``checkpoint:``): backbone and strategy weights and the
  strategy's defining buffers (sub-embedding codes, hash seeds) are restored; its strategy,
  vocabulary and tokenizer must be the ones the config builds;
* a HuggingFace pretrained encoder (``encoder.init_args.pretrained``): its weights, with its word
  embeddings handed to the strategy (the dense strategy copies them); its tokenizer is the data's;
* scratch (ProFormer): neither of the two.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from pytorch_lightning.trainer.states import TrainerFn
from torch import Tensor, nn

from lit_embed._compat import attached_trainer
from lit_embed.checkpoints import (
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
from lit_embed.data.tasks import Task, TaskDefinition, get_task
from lit_embed.embeddings.state import fixed_shapes
from lit_embed.embeddings.text import TextEncoder
from lit_embed.errors import CheckpointError, ConfigError
from lit_embed.folders import start_checkpoint
from lit_embed.interfaces import TaskData, provides
from lit_embed.models.base import EmbeddingModule, Init, StrategyFactory
from lit_embed.models.encoder import Encoder
from lit_embed.models.metrics import POOLED, TaskEvaluation, selection_score
from lit_embed.models.optim import OptimConfig

#: k-sub-embedding Table 6: peak 2e-5 with 6% warm-up and linear decay; the rest as in pre-training.
FINETUNE_OPTIM = OptimConfig(lr=2e-5, warmup=0.06)
STAGES = ("val", "test")


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

    ``encoder``, ``embedding``, ``vocab_size``, ``baseline_vocab_size``, ``baseline_encoder`` and ``init``: see
    :class:`EmbeddingModule`.

    Args:
        task: a task of :data:`lit_embed.data.tasks.TASKS`, or a config's own
            (:class:`~lit_embed.data.tasks.TaskDefinition`); must be the data's. A config leaves it unset: the
            CLI gives the model the data's (``data.init_args.task``).
        checkpoint: a lit-embed pre-training checkpoint to start from.
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
    ) -> None:
        if task is None:
            raise ConfigError("SequenceClassifier needs a task: set data.init_args.task (the model takes the data's), "
                              "or model.init_args.task")
        pretraining, taken = None, {}
        if checkpoint is not None and (encoder is None or embedding is None or vocab_size is None):
            path = start_checkpoint(checkpoint, "pre-training checkpoint")  # a file, or a run's newest
            pretraining = read_checkpoint(path, "pre-training checkpoint")
            model, taken = _model_of(pretraining, checkpoint, {
                "encoder": encoder, "embedding": embedding, "vocab_size": vocab_size,
                "baseline_vocab_size": baseline_vocab_size, "baseline_encoder": baseline_encoder})
            encoder, embedding, vocab_size = model["encoder"], model["embedding"], model["vocab_size"]
            baseline_vocab_size, baseline_encoder = model["baseline_vocab_size"], model["baseline_encoder"]
            taken["checkpoint"] = str(path)  # the run records which file it started from
        if encoder is None:
            raise ConfigError("SequenceClassifier needs model.init_args.encoder, or a checkpoint to take it from "
                              "(model.init_args.checkpoint)")
        super().__init__(
            encoder=encoder, embedding=embedding, vocab_size=vocab_size, optim=optim or FINETUNE_OPTIM,
            baseline_vocab_size=baseline_vocab_size, baseline_encoder=baseline_encoder, init=init,
        )
        if taken:  # recorded as configs, so the fine-tuned checkpoint rebuilds without the pre-training one
            self.hparams.update(taken)
        self.task: Task = get_task(task)
        if self.task.definition is not None:  # plain data with the labels it resolved: the checkpoint predicts alone
            self.hparams["task"] = self.task.definition
        self.checkpoint = checkpoint  # its weights are loaded when fitting starts
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
        self._pretraining: dict[str, Any] | None = pretraining
        self._restored = False

    # -- starting points -------------------------------------------------------------------------
    @property
    def expected_tokenizer(self) -> str | None:
        """The tokenizer the weights were trained with: the pretrained encoder's, an earlier fit's, or the
        pre-training checkpoint's."""
        if self.encoder.pretrained is not None:
            return self.encoder.pretrained
        if self.trained_tokenizer is not None:  # recorded by an earlier fit (restored from its hyper-parameters)
            return self.trained_tokenizer
        if self.checkpoint is None or self._restored or (attached_trainer(self) is not None and not self._starting()):
            return None  # evaluating: the fine-tuned weights' tokenizer is recorded (trained_tokenizer)
        return recorded_tokenizer(self._read_checkpoint())

    def _read_checkpoint(self) -> dict[str, Any]:
        if self._pretraining is None:
            path = start_checkpoint(self.checkpoint, "pre-training checkpoint")  # a file, or a run's newest
            self._pretraining = read_checkpoint(path, "pre-training checkpoint")
            self.hparams["checkpoint"] = str(path)  # the run records which file it started from
        return self._pretraining

    def load_pretraining_checkpoint(self) -> None:
        """Restore backbone and strategy from ``checkpoint``, refusing one built differently."""
        raw = self._read_checkpoint()
        facts = raw.get(FACTS) or {}
        name = self.checkpoint
        ours = self.embedding.config()["class_path"]
        if facts.get("strategy") is not None and resolve_class(facts["strategy"]) is not type(self.embedding):
            raise ConfigError(
                f"checkpoint {name!r} was trained with strategy {facts['strategy']} but the config builds {ours}: "
                f"leave model.init_args.embedding unset to take the checkpoint's, or set it to the pre-training's"
            )
        if facts.get("vocab_size") != self.embedding.vocab_size and "vocab_size" in facts:
            raise ConfigError(
                f"checkpoint {name!r} has vocab_size={facts['vocab_size']} but the config sets "
                f"{self.embedding.vocab_size}: set model.init_args.vocab_size {facts['vocab_size']}"
            )
        mine = {"encoder": self.encoder.as_config(), "embedding": self.embedding.config()}
        check = check_model(raw, {"init_args": mine}, keys=mine)  # the file's backbone and strategy: the config's?
        if check.differences:
            raise ConfigError(
                f"checkpoint {name!r} was pre-trained as another model than the config builds "
                f"({check.listed()}): leave model.init_args.encoder and embedding unset to take the "
                f"checkpoint's, or set them as the pre-training did"
            )
        state = {k: v for k, v in raw["state_dict"].items() if k.startswith(("encoder.", "embedding."))}
        mine = {k: v for k, v in self.state_dict().items() if k.startswith(("encoder.", "embedding."))}
        details = state_differences(mine, state, sized=fixed_shapes(self))
        if details:
            raise CheckpointError(
                f"checkpoint {name!r} does not fit the configured backbone and strategy ({details}): use the "
                f"pre-training config's model.init_args.encoder, embedding and vocab_size"
            )
        self.load_state_dict(state, strict=False)
        self.trained_tokenizer = self.trained_tokenizer or recorded_tokenizer(raw)  # still known once the file is released
        self._pretraining, self._restored = None, True

    def restore_pretraining(self) -> None:
        """Load ``checkpoint`` once when fitting: before the strategy's state is computed or used to
        encode text (its hash keys and LSH n-grams define the codes the data must have)."""
        if self._starting() and self.checkpoint is not None and not self._restored:
            self.load_pretraining_checkpoint()

    def _starting(self) -> bool:
        """Whether a fit is starting: not testing, validating or predicting, and not a model rebuilt from its own
        checkpoint outside a trainer (analyze, export, compress), which all use the fine-tuned weights."""
        return attached_trainer(self) is not None and self.trainer.state.fn == TrainerFn.FITTING

    def text_encoder(self, tokenizer: str | None) -> TextEncoder:
        self.restore_pretraining()
        return super().text_encoder(tokenizer)

    def collator(self, text_encoder: TextEncoder, seed: int | None = None) -> TaskCollator:
        """Padded examples with their labels (class ids, or float scores for regression); nothing is drawn."""
        return TaskCollator(text_encoder, self.task.regression)

    def prepare_data(self) -> None:
        self.restore_pretraining()
        super().prepare_data()

    def setup(self, stage: str) -> None:
        self.restore_pretraining()
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
        return loss

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


def _model_of(checkpoint: dict, name: str, given: dict) -> tuple[dict, dict]:
    """What the config leaves unset (``None`` in ``given``) of the backbone, strategy and vocabulary, and of the dense
    baseline the pre-training was counted against (a hash strategy's ``baseline_vocab_size``), from the model
    ``checkpoint`` records: ``(the values, the configs taken)``."""
    unset = [key for key, value in given.items() if value is None]
    check = check_model(checkpoint, {}, keys=unset)
    if check.recorded is None:
        raise CheckpointError(f"pre-training checkpoint {name!r} does not record its model: give model.init_args.encoder, "
                              f"embedding and vocab_size as it was trained")
    build = {"encoder": lambda c: build_from_config(nn.Module, c, "encoder"), "embedding": strategy_factory,
             "baseline_encoder": lambda c: build_from_config(nn.Module, c, "baseline_encoder")}
    values = {**given, **{key: build.get(key, lambda c: c)(value) for key, value in check.filled.items()}}
    return values, dict(check.filled)
