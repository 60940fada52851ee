"""Shuffle+Random pre-training (Yamaguchi et al., 2021), the HashFormers' objective, over any strategy."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lit_embed.data.collate import ORIGINAL, ShuffleRandomCollator
from lit_embed.embeddings.text import TextEncoder
from lit_embed.errors import ConfigError
from lit_embed.models.base import (
    CompileMode,
    EmbeddingModule,
    Init,
    StrategyFactory,
    evaluate_blocks,
    log_block_evaluation,
)
from lit_embed.models.encoder import Encoder
from lit_embed.models.metrics import BlockEvaluation
from lit_embed.models.optim import OptimConfig


class ShuffleRandom(EmbeddingModule):
    """Three-way token classification: was each token kept, shuffled, or replaced by a random one?

    Needs no output vocabulary (a ``Linear(hidden, 3)`` head), so it pre-trains unlimited-vocabulary
    hash strategies; with a dense or subspace strategy it is BERT-S+R. Besides loss and accuracy it
    logs ``original_rate``, the accuracy of always answering "original" (about 0.81 at p = 0.10), which
    the accuracy has to beat.

    ``encoder``, ``embedding``, ``optim``, ``init`` and ``torch_compile``: see :class:`EmbeddingModule`.

    Args:
        vocab_size: vocabulary size for vocabulary strategies; unset for hash strategies.
        baseline_vocab_size: the dense baseline's vocabulary for the compression figures (the
            HashFormers paper: RoBERTa's 50265).
        prob: probability of shuffling, and of replacing, a token.
    """

    def __init__(
        self,
        encoder: Encoder,
        embedding: StrategyFactory | None = None,
        vocab_size: int | None = None,
        baseline_vocab_size: int | None = None,
        prob: float = 0.10,
        optim: OptimConfig | None = None,
        init: Init = "default",
        torch_compile: bool | CompileMode = False,
    ) -> None:
        super().__init__(
            encoder=encoder, embedding=embedding, vocab_size=vocab_size, optim=optim, baseline_vocab_size=baseline_vocab_size,
            init=init, torch_compile=torch_compile,
        )
        if not 0.0 < prob < 1.0:
            raise ConfigError(f"prob={prob} must lie strictly between 0 and 1")
        self.prob = prob
        self.head = nn.Linear(encoder.hidden_size, 3)
        self.initialise(self.head)
        self.val_blocks = BlockEvaluation(("loss", "accuracy", "original_rate"))

    def collator(self, text_encoder: TextEncoder, seed: int | None = None) -> ShuffleRandomCollator:
        """Corruption for training, or with ``seed`` the deterministic per-block corruption of evaluation."""
        return ShuffleRandomCollator(text_encoder, self.embedding.code_sampler(), self.prob, seed=seed)

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Loss, logits at the labelled (non-special) positions, and their labels."""
        hidden = self.encode(batch).last_hidden_state
        labels = batch["labels"]
        labelled = labels != -100
        logits = self.head(hidden[labelled])
        targets = labels[labelled]
        # Without targets the loss still reaches every trainable parameter (zero gradients), as DDP requires.
        loss = nn.functional.cross_entropy(logits.float(), targets) if len(targets) else logits.sum() * 0.0
        return loss, logits, targets

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss, logits, targets = self(batch)
        self.log("train/loss", loss, prog_bar=True)
        for name, value in _rates(logits, targets).items():
            self.log(f"train/{name}", value, prog_bar=name == "accuracy")
        return self.with_strategy_loss(loss)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        _, logits, targets = self(batch)
        evaluate_blocks(self.val_blocks, batch, logits, targets, original_rate=(targets == ORIGINAL).float())

    def on_validation_epoch_end(self) -> None:
        log_block_evaluation(self, self.val_blocks)


def _rates(logits: Tensor, targets: Tensor) -> dict[str, Tensor]:
    """Accuracy, and the accuracy of always answering "original" (the rate to beat)."""
    if not len(targets):
        zero = torch.tensor(0.0, device=logits.device)
        return {"accuracy": zero, "original_rate": zero}
    return {
        "accuracy": (logits.argmax(-1) == targets).float().mean(),
        "original_rate": (targets == ORIGINAL).float().mean(),
    }
