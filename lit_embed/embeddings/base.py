"""The one seam of lit-embed: an embedding strategy.

A strategy owns both halves of what makes it different from a dense table:

* how text becomes the integer codes it consumes (:meth:`EmbeddingStrategy.text_encoder`), and
* how codes become vectors of the backbone's hidden size (:meth:`EmbeddingStrategy.forward`).

It also answers what the rest of the system asks of it: its own parameter count (the number the
papers report), the bytes it needs at inference (:meth:`EmbeddingStrategy.inference_bytes`: the zoo's unit), a full ``V x d`` weight for a tied MLM decoder where one exists, random codes for
the Shuffle+Random objective and MLM, and its defining state as persistent buffers, so that a checkpoint
restores it exactly and every DDP rank agrees (those whose shape only the checkpoint knows are listed in
``sized_by_checkpoint``, :mod:`lit_embed.embeddings.state`). :meth:`EmbeddingStrategy.config` says how to
rebuild it, and :func:`lit_embed.testing.check_strategy` checks all of this on any strategy.

Every strategy takes a ``budget`` of bytes (:mod:`lit_embed.embeddings.sizing`): it names the constructor argument that
sizes it (``size_parameter``) and the values that argument may take (:meth:`EmbeddingStrategy.size_range`); the base
class counts its bytes from its arguments (:meth:`EmbeddingStrategy.count_bytes`) and does the rest.
"""

from __future__ import annotations

import functools
import inspect
import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor

from lit_embed.embeddings.sizing import Sizing, budgeted
from lit_embed.embeddings.state import CheckpointSized, init_args_of, public_class_path
from lit_embed.embeddings.text import TextEncoder, VocabTextEncoder
from lit_embed.errors import ConfigError


class EmbeddingStrategy(CheckpointSized, ABC):
    """Base class of every embedding strategy.

    Every strategy is built as ``Strategy(vocab_size, hidden_size, **init_args)``: the model supplies the
    two sizes, stated once in its config (:data:`lit_embed.models.base.StrategyFactory`), and YAML gives
    the rest by ``class_path`` and ``init_args``. A strategy keeps each of the rest as an attribute of the
    same name (or overrides :meth:`init_args`), so that :meth:`config` rebuilds it.

    A constructor that takes ``budget: int | float | None = None`` (last) is sized by it before its body runs: the
    value of ``size_parameter`` nearest the budget replaces the one given (:func:`~lit_embed.embeddings.sizing.budgeted`).

    Args:
        vocab_size: number of vocabulary ids the strategy accepts. Vocabulary strategies (the default)
            need it; strategies with ``unlimited_vocabulary`` (hash strategies) take ``None`` and refuse
            a size.
        hidden_size: width of the vectors handed to the backbone.
    """

    #: Trailing shape of one token's code: ``()`` for one integer per token (vocabulary ids,
    #: hash buckets), ``(128,)`` for a bit vector, and so on.
    code_shape: tuple[int, ...] = ()

    #: Whether the strategy supports an unlimited vocabulary (hashing words) instead of indexing
    #: ``vocab_size`` ids.
    unlimited_vocabulary: ClassVar[bool] = False

    #: The constructor argument a ``budget`` sizes (``None``: the strategy has one size, as the dense table).
    size_parameter: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and "budget" in inspect.signature(init).parameters:
            cls.__init__ = budgeted(init)

    def __init__(self, vocab_size: int | None, hidden_size: int) -> None:
        super().__init__()
        name = type(self).__name__
        if self.unlimited_vocabulary and vocab_size is not None:
            raise ConfigError(
                f"{name} hashes an unlimited vocabulary, so vocab_size must be unset (got {vocab_size}): pre-train "
                f"it with lit_embed.models.ShuffleRandom and give baseline_vocab_size to compare against a dense table"
            )
        if not self.unlimited_vocabulary and vocab_size is None:
            raise ConfigError(
                f"{name} needs the vocabulary size: set model.init_args.vocab_size (50265 for RoBERTa's tokenizer)"
            )
        if hidden_size < 1:
            raise ConfigError(f"hidden_size={hidden_size} must be a positive integer")
        if vocab_size is not None and vocab_size < 1:
            raise ConfigError(f"vocab_size={vocab_size} must be a positive integer")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size

    @abstractmethod
    def forward(self, codes: Tensor) -> Tensor:
        """Map codes of shape ``(*batch, *code_shape)`` to vectors of shape ``(*batch, hidden_size)``."""

    # -- text side -------------------------------------------------------------------------------
    def text_encoder(self, tokenizer: str | None) -> TextEncoder:
        """How text becomes this strategy's codes; vocabulary strategies use the tokenizer's ids."""
        return VocabTextEncoder(tokenizer, max_vocab_size=self.vocab_size)

    def prepare(self) -> None:
        """Compute expensive defining state (cluster codes) once; the modules call it in ``setup``.

        A no-op where the state is built with the module or already restored from a checkpoint.
        """

    @property
    def reads_tokenizer(self) -> bool:
        """Whether :meth:`text_encoder` needs the data's tokenizer (vocabulary strategies' ids); a checkpoint must
        then record it."""
        return not self.unlimited_vocabulary

    def mark_prepared(self) -> None:
        """The state :meth:`prepare` computes came with the weights, loaded without this module's state-dict hooks
        (an export read by transformers): nothing is left to compute."""

    @property
    def shaped_by_prepare(self) -> bool:
        """Whether parameter shapes wait for :meth:`prepare` (naive k-means tables are sized by their codes):
        ``lit-embed params`` then prepares the strategy before counting."""
        return False

    def load_pretrained(self, weight: Tensor) -> bool:
        """Start from a pretrained ``V x d`` word-embedding matrix (a HuggingFace encoder's).

        Returns whether the strategy used it; by default it keeps its own initialisation (compressed
        strategies are trained, or compressed post hoc, rather than copied).
        """
        return False

    # -- what the rest of the system asks --------------------------------------------------------
    def num_embedding_parameters(self) -> int:
        """Parameters the papers count as the embedding's (all of this module's, by default)."""
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def count_parameters(cls, vocab_size: int | None, hidden_size: int, **arguments: Any) -> int:
        """:meth:`num_embedding_parameters` of ``cls(vocab_size, hidden_size, **arguments)``, from the arguments alone
        (for sizing to a budget, and a sweep's plan). Built-in strategies give their paper's formula; by default the
        strategy is built on the meta device, which holds no values, and counted."""
        with torch.device("meta"):
            return cls(vocab_size, hidden_size, **arguments).num_embedding_parameters()

    @classmethod
    def count_bytes(cls, vocab_size: int | None, hidden_size: int, **arguments: Any) -> int:
        """:meth:`inference_bytes` of ``cls(vocab_size, hidden_size, **arguments)`` from the arguments alone (what a budget
        sizes): built on the meta device, which holds no values, and counted, so that every tensor it keeps counts at
        its dtype."""
        key = (cls, vocab_size, hidden_size, json.dumps(arguments, sort_keys=True, default=repr))
        if key not in _COUNTED_BYTES:
            with torch.device("meta"):
                _COUNTED_BYTES[key] = cls(vocab_size, hidden_size, **arguments).inference_bytes()
        return _COUNTED_BYTES[key]

    @classmethod
    def size_range(cls, vocab_size: int | None, hidden_size: int, **arguments: Any) -> tuple[int, int]:
        """The smallest and largest values of ``size_parameter`` with these other arguments (both included)."""
        return 1, 2**31 - 1

    @property
    def sizing(self) -> Sizing | None:
        """What ``budget`` chose (``None`` where the strategy was built without one)."""
        return self.__dict__.get("_sizing")

    def counting_rule(self) -> str | None:
        """How, and on whose authority, :meth:`num_embedding_parameters` differs from this module's parameters;
        ``None`` where it counts them all. ``lit-embed params`` prints it beside the module's own count."""
        return None

    def for_inference(self) -> EmbeddingStrategy:
        """The strategy as inference needs it, what ``lit-embed compress`` saves: itself, unless training keeps tensors
        that inference does not read (DPQ's queries and keys), which the returned strategy leaves out."""
        return self

    def inference_bytes(self) -> int:
        """Bytes the embedding needs at inference: every tensor of :meth:`for_inference`'s state at its stored dtype
        (codes as the strategy stores them, packed where it packs them). The unit on which methods are compared: a
        parameter count puts a 4-bit code and a float32 value on one footing."""
        return state_bytes(self.for_inference().state_dict())

    def training_figures(self) -> dict[str, int]:
        """What training holds, beside :meth:`inference_bytes`: trainable parameters, and the bytes of the whole state
        (training-only tensors included)."""
        return {"trainable_params": sum(p.numel() for p in self.parameters() if p.requires_grad),
                "training_bytes": state_bytes(self.state_dict())}

    def auxiliary_loss(self) -> Tensor | None:
        """A term of the strategy's own that training adds to the objective's loss (DPQ-VQ's codebook and commitment),
        from its last training forward, then cleared; ``None`` where it has none (most strategies)."""
        return None

    def num_total_parameters(self) -> int:
        """What the strategy adds to a model's total (PCR_All, PoEP): all of its parameters, or its embedding figure
        where that is larger: stored codes the papers count as parameters (sparse-coding ids and weights, additive
        quantization's codes) are buffers, not ``nn.Parameter`` objects."""
        return max(sum(p.numel() for p in self.parameters()), self.num_embedding_parameters())

    def full_weight(self) -> Tensor | None:
        """The ``vocab_size x hidden_size`` matrix of all token vectors, for a tied MLM decoder.

        Built from the strategy's parameters on each call, so gradients flow into them. ``None``
        when the strategy has no finite vocabulary to enumerate.
        """
        if self.vocab_size is None:
            return None
        ids = torch.arange(self.vocab_size, device=self.device)
        return self(ids)

    def decoder_logits(self, hidden: Tensor) -> Tensor:
        """Scores of every vocabulary id for ``hidden`` (``(M, d)``) with the decoder tied to this embedding."""
        weight = self.full_weight()
        if weight is None:
            raise ConfigError(
                f"{type(self).__name__} has no finite vocabulary to tie an MLM decoder to: "
                f"set tie_decoder: false or pre-train it with Shuffle+Random"
            )
        return hidden @ weight.T

    def decoder_nll(self, hidden: Tensor, bias: Tensor, targets: Tensor) -> Tensor | None:
        """``-log softmax(decoder_logits(hidden) + bias)`` at ``targets``, one value per row of ``hidden``, computed
        without the ``M x V`` logits; ``None`` where the strategy has no such factorisation (the caller then builds
        the logits). Subspace codes on a grid have one (:mod:`lit_embed.embeddings.grid_softmax`)."""
        return None

    def component_codes(self) -> Tensor | None:
        """``(vocab_size, k)`` indices of the shared components each vocabulary vector is built from.

        For analysis (the PCA scatter colours tokens by their last component); ``None`` where the
        vectors are not composed of shared components.
        """
        return None

    def code_sampler(self) -> Callable[[tuple[int, ...]], Tensor]:
        """A picklable ``shape -> codes`` function drawing uniformly random codes on the CPU.

        Collators call it in DataLoader workers (MLM's 10% random tokens, S+R's "random"), so it
        must not hold the module's parameters.
        """
        if self.vocab_size is None:
            raise NotImplementedError(f"{type(self).__name__} must define code_sampler")
        return functools.partial(torch.randint, self.vocab_size)

    # -- what rebuilds it ------------------------------------------------------------------------
    def init_args(self) -> dict[str, Any]:
        """The constructor arguments beyond the two sizes, as plain data a YAML config holds.

        Nested objects (a subspace ``assignment``, a hash ``hasher``) are ``{"class_path", "init_args"}``.
        ``type(s)(s.vocab_size, s.hidden_size, **init_args)``, with the nested configs instantiated as
        jsonargparse does, rebuilds a module whose state dict loads into it strictly. By default each
        argument is read back from the attribute of the same name; override where one is kept otherwise.
        """
        return init_args_of(self, skip=("vocab_size", "hidden_size"))

    def config(self, with_sizes: bool = False) -> dict[str, Any]:
        """``{"class_path", "init_args"}`` of this strategy, with its stable public class path.

        A model's config leaves the two sizes out (the model gives them); ``with_sizes`` puts them in, to
        build the strategy on its own (:func:`lit_embed.checkpoints.format.build_from_config`).
        """
        init_args = self.init_args()
        if with_sizes:
            init_args = {"vocab_size": self.vocab_size, "hidden_size": self.hidden_size, **init_args}
        return {"class_path": public_class_path(type(self)), "init_args": init_args}

    @property
    def device(self) -> torch.device:
        """Where the strategy's parameters and buffers are (the CPU for a strategy holding neither)."""
        for tensor in (*self.parameters(), *self.buffers()):
            return tensor.device
        return torch.device("cpu")


def state_bytes(state: dict[str, Tensor]) -> int:
    """Bytes the tensors take as stored (what a safetensors file of them holds, less its header)."""
    return sum(t.numel() * t.element_size() for t in state.values())


#: :meth:`EmbeddingStrategy.count_bytes` by class, sizes and arguments: a budget's search and a sweep's plan ask again.
_COUNTED_BYTES: dict[tuple[type, int | None, int, str], int] = {}
