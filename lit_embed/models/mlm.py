"""Masked language modelling (RoBERTa) over any embedding strategy."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lit_embed._compat import attached_trainer, writes_logs_this_step
from lit_embed.data.collate import MaskedLMCollator
from lit_embed.embeddings.text import TextEncoder
from lit_embed.errors import ConfigError
from lit_embed.interfaces import FillMaskData, require
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


class MaskedLM(EmbeddingModule):
    """RoBERTa's MLM: 15% of tokens predicted (80% mask, 10% random, 10% kept).

    The head is RoBERTa's (dense, GELU, LayerNorm, then the decoder). The decoder is tied through the
    strategy (``decoder_logits``: the dense weight, or the sub-embedding tables without building an
    ``N x d`` matrix) with its own ``N``-sized bias, or untied with ``tie_decoder: false``. Logits are
    computed only at the predicted positions, and in training not at all where the strategy has an exact
    factorised softmax (``decoder_nll``: subspace codes on a grid): the training accuracy, which needs them, is then
    computed on the steps the loggers write (``log_every_n_steps``).

    ``encoder``, ``embedding``, ``vocab_size``, ``optim``, ``init`` and ``torch_compile``: see :class:`EmbeddingModule`.

    Args:
        tie_decoder: tie the output layer to the input embedding (the papers do).
        mask_prob: share of tokens predicted.
        factorised_softmax: train with the strategy's exact factorised softmax where it has one (the same loss and
            gradients as the logits', without the ``M x V`` logits: for XLM-R_S's vocabulary the decoder's loss and
            gradient took 34 ms instead of 3.0 s at 614 positions on one CPU thread); ``false``: always the logits.
    """

    def __init__(
        self,
        encoder: Encoder,
        vocab_size: int | None = None,
        embedding: StrategyFactory | None = None,
        tie_decoder: bool = True,
        mask_prob: float = 0.15,
        factorised_softmax: bool = True,
        optim: OptimConfig | None = None,
        init: Init = "default",
        torch_compile: bool | CompileMode = False,
    ) -> None:
        super().__init__(encoder=encoder, embedding=embedding, vocab_size=vocab_size, optim=optim, init=init,
                         torch_compile=torch_compile)
        if vocab_size is None:  # a hash strategy: a vocabulary strategy has already refused to build without it
            raise ConfigError(
                f"MaskedLM predicts vocabulary ids, which {type(self.embedding).__name__} does not have: pre-train it "
                f"with lit_embed.models.ShuffleRandom"
            )
        hidden = encoder.hidden_size
        self.tie_decoder = tie_decoder
        self.mask_prob = mask_prob
        self.factorised_softmax = factorised_softmax
        self.head = nn.Sequential(
            nn.Linear(hidden, hidden), nn.GELU(), nn.LayerNorm(hidden, eps=encoder.config.layer_norm_eps)
        )
        self.decoder = None if tie_decoder else nn.Linear(hidden, vocab_size, bias=False)
        self.decoder_bias = nn.Parameter(torch.zeros(vocab_size))
        self.initialise(self.head, *([] if self.decoder is None else [self.decoder]))
        self.val_blocks = BlockEvaluation(("loss", "accuracy"))

    def collator(self, text_encoder: TextEncoder, seed: int | None = None) -> MaskedLMCollator:
        """Masking for training, or with ``seed`` the deterministic per-block masking of evaluation."""
        return MaskedLMCollator(text_encoder, self.embedding.code_sampler(), self.mask_prob, seed=seed)

    def forward(self, batch: dict[str, Tensor], need_logits: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
        """Loss, logits at the predicted positions, and their labels; the logits are ``None`` where the factorised
        softmax gave the loss without them (``factorised_softmax``, unless ``need_logits``)."""
        hidden = self.encode(batch).last_hidden_state
        labels = batch["labels"]
        if "predicted" in batch:  # the collator's flat indices: gathered without a GPU sync
            states = self.head(hidden.flatten(0, 1)[batch["predicted"]])
            targets = labels.flatten()[batch["predicted"]]
        else:
            predicted = labels != -100
            states, targets = self.head(hidden[predicted]), labels[predicted]
        if self.factorised_softmax and self.decoder is None and not need_logits and len(targets):
            nll = self.embedding.decoder_nll(states, self.decoder_bias, targets)
            if nll is not None:
                return nll.mean(), None, targets
        logits = self.decode(states)
        # Without targets the loss still reaches every trainable parameter (zero gradients), as DDP requires.
        loss = nn.functional.cross_entropy(logits.float(), targets) if len(targets) else logits.sum() * 0.0
        return loss, logits, targets

    def vocabulary_logits(self, hidden: Tensor) -> Tensor:
        """Scores of every vocabulary id for the encoder's ``hidden`` states ``(M, d)``."""
        return self.decode(self.head(hidden))

    def decode(self, states: Tensor) -> Tensor:
        """The decoder's logits for the head's ``states``, in their dtype (the compute dtype under autocast)."""
        logits = self.embedding.decoder_logits(states) if self.decoder is None else self.decoder(states)
        return logits + self.decoder_bias.to(logits.dtype)

    def fill_mask(self, batch: dict[str, Tensor], top_k: int) -> list[dict]:
        """The ``top_k`` most probable ids, with their probabilities, at each ``fill`` position: one record per text
        (its row ``index`` and ``fills``, a list per mask in text order)."""
        where = batch["fill"]
        probabilities = self.vocabulary_logits(self.encode(batch).last_hidden_state[where]).float().softmax(-1)
        top = probabilities.topk(min(top_k, probabilities.shape[-1]), dim=-1)
        records = [{"index": int(i), "fills": []} for i in batch["index"].tolist()]
        for row, ids, values in zip(where.nonzero()[:, 0].tolist(), top.indices.tolist(), top.values.tolist()):
            records[row]["fills"].append([{"id": i, "p": round(v, 6)} for i, v in zip(ids, values)])
        return records

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> list[dict]:
        """``lit-embed predict``: the data's ``top_k`` fills of every ``<mask>`` (``CorpusDataModule.predict_input``)."""
        require(self.data, FillMaskData, "the data of a MaskedLM's lit-embed predict")
        return self.fill_mask(batch, self.data.top_k)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss, logits, targets = self(batch, need_logits=writes_logs_this_step(attached_trainer(self)))
        self.log("train/loss", loss, prog_bar=True)
        if logits is not None:
            self.log("train/accuracy", _accuracy(logits, targets))
        return self.with_strategy_loss(loss)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        _, logits, targets = self(batch, need_logits=True)
        evaluate_blocks(self.val_blocks, batch, logits, targets)

    def on_validation_epoch_end(self) -> None:
        results = log_block_evaluation(self, self.val_blocks)
        if "loss" in results:
            self.log("val/perplexity", math.exp(min(float(results["loss"]), 50.0)))


def _accuracy(logits: Tensor, targets: Tensor) -> Tensor:
    """Share of predicted positions whose target scores highest (a tie counts as a hit).

    Comparing the target's score with the row's maximum reads the logits once, as ``argmax`` does,
    but with a vectorised kernel: for XLM-R_S at batch 32 x 128 (614 x 250002 logits) 94 ms on one
    CPU core instead of 346 ms, on every training step (``tools/bench``: overhead).
    """
    if not len(targets):
        return torch.tensor(0.0, device=logits.device)
    logits = logits.detach()
    return (logits.gather(1, targets[:, None]).squeeze(1) >= logits.amax(-1)).float().mean()
