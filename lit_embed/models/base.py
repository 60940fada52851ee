"""What every lit-embed LightningModule shares: a strategy feeding an encoder, and its optimiser."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, Literal

import pytorch_lightning as pl
from torch import Tensor, nn

from lit_embed._compat import attached_trainer, built_by_cli
from lit_embed.checkpoints.format import FACTS, describe, state_differences
from lit_embed.distributed import is_distributed, share_buffers
from lit_embed.embeddings.base import EmbeddingStrategy
from lit_embed.embeddings.dense import DenseEmbedding
from lit_embed.embeddings.initialisation import truncated_normal_init
from lit_embed.embeddings.state import fixed_shapes, public_class_path
from lit_embed.embeddings.text import TextEncoder
from lit_embed.errors import CheckpointError, ConfigError
from lit_embed.hub import counting_only
from lit_embed.interfaces import Collate, TextData, provides
from lit_embed.models.encoder import Encoder, count_parameters
from lit_embed.models.metrics import BlockEvaluation
from lit_embed.models.optim import OptimConfig, configure_adamw
from lit_embed.runs.logger import run_folder
from lit_embed.storage.plain_data import plain

log = logging.getLogger(__name__)

#: A strategy still missing ``(vocab_size, hidden_size)``, in that order (``vocab_size`` ``None`` where the
#: config leaves it unset); YAML gives it by ``class_path`` and ``init_args``, and the module supplies the
#: two sizes so they are stated once. The contract is :class:`~lit_embed.embeddings.EmbeddingStrategy`'s.
StrategyFactory = Callable[[int | None, int], EmbeddingStrategy]
#: How the weights a model builds (rather than loads) start; see :class:`EmbeddingModule`.
Init = Literal["default", "truncated_normal"]
#: ``torch.compile``'s modes; ``True`` is its ``default``. ``reduce-overhead`` adds CUDA graphs: a step's kernel
#: launches replayed at once, which a small model on a fast GPU is bound by.
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
COMPILE_MODES: tuple[str, ...] = CompileMode.__args__  # type: ignore[attr-defined]


class EmbeddingModule(pl.LightningModule):
    """An embedding strategy feeding a HuggingFace encoder.

    Args:
        vocab_size: vocabulary size given to the strategy (``None`` for unlimited-vocabulary strategies).
        encoder: the backbone.
        embedding: the strategy (default dense).
        optim: optimiser and schedule.
        baseline_vocab_size: vocabulary of the dense baseline that compression figures compare
            against, for unlimited-vocabulary strategies (default: ``vocab_size``).
        baseline_encoder: the dense baseline's backbone where it is not this model's (HashFormers
            compare the 2-layer ProFormer with BERT-MLM); only its parameters are counted, it is not kept.
        init: how the weights the model builds start. ``default``: each part as it builds itself (a backbone
            from a config HuggingFace's normal of std ``initializer_range`` with zeroed padding rows, the
            strategy its own, heads PyTorch's). ``truncated_normal``: the HashFormers authors' ``_init_weights``
            over the whole model, backbone, strategy and heads (:mod:`lit_embed.embeddings.initialisation`; the paper is
            silent). Weights loaded from a pretrained encoder or handed to the strategy keep their values, as a
            checkpoint loaded later replaces what was drawn.
        torch_compile: compile the backbone with ``torch.compile`` (in place, on its first step; its state dict keeps
            its keys): fused kernels on a GPU, for runs long enough to repay the compilation (tens of seconds or more).
            ``true`` is its default mode; ``reduce-overhead`` also replays each step's kernels as a CUDA graph (on
            one H200, RoBERTa_S 32 x 512 bf16 subspace: 22.5 ms a step eager, 19.3 compiled, 14.5 with CUDA graphs),
            for batches of fixed shape (pre-training's windows): each new shape records a graph of its own.
            The strategy, heads and loss stay eager, so it works with every strategy.
    """

    #: Whether the objective reads the backbone's pooler. Those that do not freeze it: DDP then
    #: ignores it (no "unused parameters" error, no slower ``find_unused_parameters``), while it stays
    #: in the model, its checkpoints and the papers' parameter counts.
    uses_pooler: bool = False
    #: The data this model reads (its tokenizer; a task model's evaluation sets and paper), handed over by
    #: :func:`~lit_embed.interfaces.wire`; ``None`` outside a run (analyze, export, compress).
    data: TextData | None = None

    def __init__(
        self,
        encoder: Encoder,
        embedding: StrategyFactory | None = None,
        vocab_size: int | None = None,
        optim: OptimConfig | None = None,
        baseline_vocab_size: int | None = None,
        baseline_encoder: Encoder | None = None,
        init: Init = "default",
        torch_compile: bool | CompileMode = False,
    ) -> None:
        super().__init__()
        self._save_config()
        if init not in ("default", "truncated_normal"):
            raise ConfigError(f"init={init!r} is not a scheme: use 'default' or 'truncated_normal'")
        if torch_compile not in (False, True, *COMPILE_MODES):
            raise ConfigError(f"torch_compile={torch_compile!r} is not a torch.compile mode: use true, false or one of "
                              f"{', '.join(COMPILE_MODES)}")
        self.init = init
        # prepare_data (the strategy's expensive state) runs once, on global rank 0; see setup.
        self.prepare_data_per_node = False
        if not self.uses_pooler:
            encoder.freeze_pooler()
        self.encoder = encoder
        if torch_compile:
            encoder.compile(mode="default" if torch_compile is True else torch_compile)
        factory = embedding or DenseEmbedding
        self.embedding = factory(vocab_size, encoder.hidden_size)
        if self.embedding.hidden_size != encoder.hidden_size:
            raise ConfigError(
                f"the strategy's hidden_size={self.embedding.hidden_size} differs from the encoder's "
                f"{encoder.hidden_size}: they must match"
            )
        pretrained = encoder.take_pretrained_word_embeddings()
        loaded = pretrained is not None and self.embedding.load_pretrained(pretrained)
        if pretrained is not None and not loaded:
            log.info(
                "%s keeps its own initialisation: the word embeddings of %s are not used",
                type(self.embedding).__name__, encoder.pretrained,
            )
        self.initialise(*([] if encoder.pretrained is not None else [encoder]), *([] if loaded else [self.embedding]))
        self.optim = optim or OptimConfig()
        self.baseline_vocab_size = baseline_vocab_size or vocab_size
        base = baseline_encoder or encoder
        self._baseline_backbone = {"params": base.num_parameters(), "hidden_size": base.hidden_size}
        self._baseline_config = None if baseline_encoder is None else baseline_encoder.as_config()

    def initialise(self, *modules: nn.Module) -> None:
        """Draw the starting weights of ``modules`` the model builds (its backbone, strategy, heads) by ``init``
        (not while ``lit-embed params`` only counts them: 86M truncated normals take seconds)."""
        if self.init == "truncated_normal" and not counting_only():
            for module in modules:
                truncated_normal_init(module)

    def _save_config(self) -> None:
        """Record the constructor arguments so ``load_from_checkpoint`` rebuilds the module.

        Built by the CLI, Lightning records the parsed config (class paths and init args, small and
        exact). Built in Python, the encoder and strategy objects are left out (their weights are in
        the state dict anyway): pass them again to ``load_from_checkpoint``.
        """
        by_cli = built_by_cli()
        modules = ["encoder", "embedding", "baseline_encoder"]
        self.save_hyperparameters(ignore=None if by_cli else modules, frame=inspect.currentframe().f_back)

    # -- what a data module needs (lit_embed.interfaces.TextModel) -----------------------------------
    @property
    def max_length(self) -> int:
        return self.encoder.max_length

    @property
    def pair_separators(self) -> int:
        return 2 if self.encoder.config.model_type in ("roberta", "xlm-roberta") else 1

    @property
    def expected_tokenizer(self) -> str | None:
        """A pretrained encoder's tokenizer; subclasses that restore trained weights add theirs."""
        return self.encoder.pretrained

    def read_data(self, data: TextData) -> None:
        """Read ``data`` from now on (:func:`~lit_embed.interfaces.wire`)."""
        self.data = data

    def text_encoder(self, tokenizer: str | None) -> TextEncoder:
        return self.embedding.text_encoder(tokenizer)

    def collator(self, text_encoder: TextEncoder, seed: int | None = None) -> Collate:
        """The objective's batches (each objective says how it corrupts or labels them)."""
        raise NotImplementedError(f"{type(self).__name__} must define collator()")

    def share_text_state(self) -> None:
        share_buffers(attached_trainer(self), self.embedding)

    # -- the seam in use -------------------------------------------------------------------------

    def encode(self, batch: dict[str, Tensor], output_hidden_states: bool = False):
        """Run strategy then encoder on a collated batch."""
        embeds = self.embedding(batch["codes"])
        return self.encoder(
            embeds,
            attention_mask=batch["attention_mask"],
            token_type_ids=batch.get("token_type_ids"),
            output_hidden_states=output_hidden_states,
        )

    def prepare_data(self) -> None:
        """Compute the strategy's expensive defining state (cluster codes) on global rank 0 only.

        Lightning runs this before any rank's ``setup`` and waits for it without a time limit, so a
        download and a clustering of minutes cannot time out the other ranks' collectives.
        """
        self.embedding.prepare()

    def setup(self, stage: str) -> None:
        """Make the strategy's state identical on every rank: rank 0's, broadcast.

        Rank 0 prepares it (a no-op after ``prepare_data`` or a checkpoint restore); every other rank
        receives rank 0's persistent buffers instead of computing its own, so clusterings that would
        differ on another machine's floating point, and corpus-fitted state, agree by construction.
        """
        trainer = attached_trainer(self)
        if not is_distributed(trainer) or trainer.is_global_zero:
            self.embedding.prepare()
        share_buffers(trainer, self.embedding)

    def with_strategy_loss(self, loss: Tensor) -> Tensor:
        """A training step's loss: the objective's, plus the strategy's own term where it has one (DPQ-VQ's codebook and
        commitment: :meth:`~lit_embed.embeddings.EmbeddingStrategy.auxiliary_loss`), logged apart."""
        term = self.embedding.auxiliary_loss()
        if term is None:
            return loss
        self.log("train/embedding_loss", term)
        return loss + term

    def on_train_start(self) -> None:
        """Every module trains (dropout on), whatever the model was built or loaded from: Lightning keeps the
        mode each module had, and a pretrained model arrives in eval mode. Validation restores it after."""
        self.train()

    def model_config(self) -> dict[str, Any]:
        """``{"class_path", "init_args"}`` that rebuilds this module, its encoder's and strategy's configs
        included (read from the objects, so a model built in Python describes itself too)."""
        accepted = inspect.signature(type(self)).parameters
        init = {k: v for k, v in self.hparams.items() if k in accepted}
        init.update(encoder=self.encoder.as_config(), embedding=self.embedding.config(),
                    vocab_size=self.embedding.vocab_size, baseline_encoder=self._baseline_config)
        return {"class_path": public_class_path(type(self)), "init_args": plain({k: v for k, v in init.items() if k in accepted})}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Record what rebuilds this model, the tokenizer its weights expect, and the run they belong to."""
        trainer = attached_trainer(self)
        tokenizer = (self.data.tokenizer if provides(self.data, TextData) else None) or self.expected_tokenizer
        checkpoint[FACTS] = describe(self, tokenizer, None if trainer is None else run_folder(trainer).absolute())

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse, naming the difference, a checkpoint whose weights do not fit this model (resume, test)."""
        parameters = {name for name, _ in self.named_parameters()} & fixed_shapes(self)
        details = state_differences(self.state_dict(), checkpoint["state_dict"], sized=parameters)
        if details and self.strict_loading:
            raise CheckpointError(
                f"the checkpoint does not fit the configured {type(self).__name__} ({details}): give the config it "
                f"was trained with (its run folder's config.yaml)"
            )

    # -- accounting ------------------------------------------------------------------------------
    def parameter_counts(self) -> dict[str, int]:
        """Embedding and total parameters as the papers count them (backbone + strategy, no task heads).

        The total counts every parameter of the strategy, also those its embedding figure leaves out (the
        HashFormers' special-token rows), and the stored codes that figure counts (sparse coding's ids and weights);
        of the backbone, all but the position rows it declares untrained.
        """
        strategy = self.embedding
        return {"embedding_params": strategy.num_embedding_parameters(),
                "total_params": strategy.num_total_parameters() + self.encoder.num_parameters()}

    def module_counts(self) -> dict[str, int]:
        """The parameters backbone and strategy hold, beside :meth:`parameter_counts`' figures."""
        embedding = count_parameters(self.embedding)
        return {"embedding_params": embedding, "total_params": embedding + count_parameters(self.encoder)}

    def counting_rules(self) -> list[str]:
        """Each rule by which :meth:`parameter_counts` differs from :meth:`module_counts`, backbone's first."""
        return [rule for rule in (self.encoder.counting_rule(), self.embedding.counting_rule()) if rule]

    def baseline_counts(self) -> dict[str, int]:
        """The same counts for the dense baseline: a ``baseline_vocab_size x hidden`` table on the same
        backbone, or on ``baseline_encoder`` where one is given."""
        if self.baseline_vocab_size is None:
            raise ConfigError("an unlimited-vocabulary strategy needs baseline_vocab_size to compare against a dense table")
        embedding = self.baseline_vocab_size * self._baseline_backbone["hidden_size"]
        return {"embedding_params": embedding, "total_params": embedding + self._baseline_backbone["params"]}

    # -- optimisation ----------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        # Lightning cannot clip the gradients of a fused optimiser under fp16's gradient scaler (the
        # optimiser unscales them itself): keep PyTorch's unfused AdamW in that one case.
        trainer = self.trainer
        clips_scaled = bool(trainer.gradient_clip_val) and str(trainer.precision) == "16-mixed"
        return configure_adamw(self, self.optim, trainer.estimated_stepping_batches, fused=not clips_scaled)


def evaluate_blocks(
    metric: BlockEvaluation, batch: dict[str, Tensor], logits: Tensor, targets: Tensor, **extra: Tensor
) -> None:
    """Add an evaluation batch's per-token loss and accuracy (and ``extra`` per-token values) to ``metric``.

    ``logits`` and ``targets`` are those of the labelled positions (``labels != -100``) in row order.
    """
    if "index" not in batch:
        raise ConfigError("evaluation batches need each block's row 'index' (CorpusDataModule adds it)")
    token_rows = (batch["labels"] != -100).nonzero()[:, 0]
    values = {
        "loss": nn.functional.cross_entropy(logits.float(), targets, reduction="none"),
        "accuracy": (logits.argmax(-1) == targets).float(),
        **extra,
    }
    metric.update(batch["index"], token_rows, values)


def log_block_evaluation(module: pl.LightningModule, metric: BlockEvaluation, stage: str = "val") -> dict[str, Tensor]:
    """Log ``{stage}/{name}`` for every figure of ``metric`` (identical on every rank) and reset it."""
    results = metric.compute()
    metric.reset()
    for name in metric.names:
        if name in results:
            # identical on every rank already: the mean over ranks (sync_dist) leaves it exactly as it is
            module.log(f"{stage}/{name}", results[name], prog_bar=name in ("loss", "accuracy"), sync_dist=True)
    return results


__all__ = ["EmbeddingModule", "Init", "StrategyFactory", "evaluate_blocks", "log_block_evaluation"]
