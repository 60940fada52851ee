"""The backbone: a HuggingFace encoder fed ``inputs_embeds`` by the embedding strategy.

Position and token-type embeddings, LayerNorm and attention stay HuggingFace's; the word-embedding
table is removed, so no dead ``N x d`` parameters remain inside the backbone.
"""

from __future__ import annotations

import inspect
from typing import Literal

import torch
from torch import Tensor, nn

from lit_embed._compat import auto_model_class
from lit_embed.embeddings.state import public_class_path
from lit_embed.errors import ConfigError
from lit_embed.hub import known_architecture, loading_pretrained, resolve_pretrained

ARCHITECTURES = {"roberta": "RobertaConfig", "xlm-roberta": "XLMRobertaConfig", "bert": "BertConfig", "canine": "CanineConfig"}


class Encoder(nn.Module):
    """A transformer encoder built from a config (RoBERTa, XLM-R, BERT or CANINE) or a pretrained model.

    CANINE (``canine``; ``google/canine-c``) reads characters: its hash tables move to the strategy
    (:class:`lit_embed.embeddings.CanineHashEmbedding`), and it keeps its downsampling and character positions.

    Args:
        arch: ``roberta``, ``xlm-roberta``, ``bert`` or ``canine``.
        hidden_size: the transformer's width.
        num_layers: its layers.
        num_heads: attention heads per layer.
        intermediate_size: the feed-forward layers' width.
        max_position_embeddings: learned positions (RoBERTa/XLM-R use ``max_length + 2``).
        type_vocab_size: token-type embeddings (1 for RoBERTa, 2 for BERT).
        dropout: the hidden states' dropout probability.
        attention_dropout: the attention weights'.
        pooler: keep the ``[CLS]`` pooler (its parameters count toward the papers' totals).
        pretrained: a HuggingFace model name or folder (any encoder ``AutoModel`` loads: BERT,
            RoBERTa, XLM-R, DistilBERT, ...); its weights are loaded and its shape overrides the
            arguments above. Its word embeddings are handed to the strategy (see
            :meth:`take_pretrained_word_embeddings`), not kept in the backbone.
        trained_positions: only this many position rows (the first) are ever trained; the papers' counts
            leave the rest out (CANINE's README counts CANINE-C so: 121M, the first 2,048 of its 16,384
            character positions). ``None``: all are counted.
    """

    def __init__(
        self,
        arch: Literal["roberta", "xlm-roberta", "bert", "canine"] = "roberta",
        hidden_size: int = 512,
        num_layers: int = 8,
        num_heads: int = 8,
        intermediate_size: int = 2048,
        max_position_embeddings: int = 514,
        type_vocab_size: int = 1,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        pooler: bool = True,
        pretrained: str | None = None,
        trained_positions: int | None = None,
    ) -> None:
        super().__init__()
        import transformers

        self._init_args = {
            "arch": arch, "hidden_size": hidden_size, "num_layers": num_layers, "num_heads": num_heads,
            "intermediate_size": intermediate_size, "max_position_embeddings": max_position_embeddings,
            "type_vocab_size": type_vocab_size, "dropout": dropout, "attention_dropout": attention_dropout,
            "pooler": pooler, "pretrained": pretrained, "trained_positions": trained_positions,
        }
        #: The HuggingFace model this encoder starts from (its tokenizer is the model's), or None.
        self.pretrained = pretrained
        if pretrained is not None:
            # from_pretrained returns the model in eval mode (dropout off) and Lightning keeps each module's
            # mode: without train() a fine-tuning would run with no dropout (the papers fine-tune with 0.1).
            self.model = _load_pretrained(pretrained, pooler).train()
        else:
            if arch not in ARCHITECTURES:
                raise ConfigError(f"arch={arch!r} is not supported: use one of {sorted(ARCHITECTURES)}")
            if hidden_size % num_heads:
                raise ConfigError(
                    f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}: pick a divisor"
                )
            config = getattr(transformers, ARCHITECTURES[arch])(
                vocab_size=3,  # the strategy owns the vocabulary; this stub table is removed below
                hidden_size=hidden_size,
                num_hidden_layers=num_layers,
                num_attention_heads=num_heads,
                intermediate_size=intermediate_size,
                max_position_embeddings=max_position_embeddings,
                type_vocab_size=type_vocab_size,
                hidden_dropout_prob=dropout,
                attention_probs_dropout_prob=attention_dropout,
                pad_token_id=0 if arch in ("bert", "canine") else 1,
            )
            self.model = transformers.AutoModel.from_config(config, add_pooling_layer=pooler)
        weight = _remove_word_embeddings(self.model)
        #: The pretrained word-embedding matrix until the module hands it to its strategy.
        self.pretrained_word_embeddings = weight if pretrained is not None else None
        config = self.model.config
        self.hidden_size = config.hidden_size
        # RoBERTa-style position ids start after the padding index.
        self.max_length = config.max_position_embeddings - (
            config.pad_token_id + 1 if config.model_type in ("roberta", "xlm-roberta") else 0
        )
        self.trained_positions = trained_positions
        positions = self._position_table().num_embeddings
        if trained_positions is not None and not 1 <= trained_positions <= positions:
            raise ConfigError(f"trained_positions={trained_positions} must lie in [1, {positions}], the backbone's "
                              f"position rows")

    @property
    def config(self):
        return self.model.config

    @property
    def has_pooler(self) -> bool:
        return getattr(self.model, "pooler", None) is not None

    def freeze_pooler(self) -> None:
        """Stop training the pooler (objectives that do not read it); it stays in the model and its counts."""
        if self.has_pooler:
            self.model.pooler.requires_grad_(False)

    def _position_table(self) -> nn.Embedding:
        """The learned position embeddings (``position_embeddings``; CANINE's ``char_position_embeddings``)."""
        tables = [m for name, m in self.model.named_modules()
                  if name.endswith("position_embeddings") and isinstance(m, nn.Embedding)]
        if len(tables) != 1:
            raise ConfigError(f"the {self.config.model_type} backbone has {len(tables)} learned position tables, not "
                              f"one: trained_positions cannot say which it counts")
        return tables[0]

    def num_parameters(self) -> int:
        """Parameters as the papers count them: all, less the position rows never trained (``trained_positions``)."""
        count = count_parameters(self)
        if self.trained_positions is None:
            return count
        table = self._position_table()
        return count - (table.num_embeddings - self.trained_positions) * table.embedding_dim

    def training_flops_per_token(self, length: int) -> float:
        """Forward and backward FLOPs per token of a ``length``-token sequence through the transformer (PaLM's MFU
        formula): 6 per weight of its layers (embeddings, pooler and heads left out) and ``12 x layers x hidden x
        length`` for attention's scores and values."""
        c = self.config
        layers = count_parameters(getattr(self.model, "encoder", self.model))  # HuggingFace's stack of layers
        return 6.0 * layers + 12.0 * c.num_hidden_layers * c.hidden_size * length

    def counting_rule(self) -> str | None:
        """Why :meth:`num_parameters` leaves parameters out, where it does."""
        if self.trained_positions is None:
            return None
        table = self._position_table()
        untrained = table.num_embeddings - self.trained_positions
        return (f"only the first {self.trained_positions:,} of {table.num_embeddings:,} position rows are trained: "
                f"{untrained:,} x {table.embedding_dim} are not counted")

    def take_pretrained_word_embeddings(self):
        """The pretrained ``V x d`` word embeddings (once; ``None`` when built from a config)."""
        weight, self.pretrained_word_embeddings = self.pretrained_word_embeddings, None
        return weight

    def forward(
        self,
        inputs_embeds: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        output_hidden_states: bool = False,
    ):
        if inputs_embeds.shape[1] > self.max_length:
            raise ConfigError(
                f"sequence length {inputs_embeds.shape[1]} exceeds the backbone's {self.max_length} positions: "
                f"lower the data's max_length or raise max_position_embeddings"
            )
        extra = {}
        if token_type_ids is not None and getattr(self.config, "type_vocab_size", 0) > 1:
            extra["token_type_ids"] = token_type_ids  # segment ids only where the backbone has several types
        return self.model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            output_hidden_states=output_hidden_states,
            **extra,
        )

    def as_config(self) -> dict:
        """``{"class_path", "init_args"}`` that rebuilds this encoder (its weights come from a state dict);
        ``config`` is the HuggingFace model's. A pretrained encoder's shape is its model's: only what it reads is
        recorded (a config compared with it then names ``pretrained``, not sizes it never had)."""
        args = dict(self._init_args)
        if self.pretrained is not None:
            args = {key: args[key] for key in ("pretrained", "pooler", "trained_positions")}
        return {"class_path": public_class_path(type(self)), "init_args": args}

    def shape(self) -> dict:
        """The transformer's shape, as compared between a run and its baseline (results.json's ``backbone``)."""
        c = self.config
        return {"arch": c.model_type, "layers": c.num_hidden_layers, "hidden": c.hidden_size,
                "heads": c.num_attention_heads, "ffn": c.intermediate_size}

    def extra_repr(self) -> str:
        c = self.config
        return f"{c.model_type}: {c.num_hidden_layers} layers, hidden {c.hidden_size}, heads {c.num_attention_heads}"


def _load_pretrained(name: str, pooler: bool) -> nn.Module:
    """``AutoModel`` of ``name``, with or without its pooler where the architecture has one."""
    import transformers

    shape = known_architecture(name)
    if shape is not None:  # counting parameters: the architecture without its weights
        fields = dict(shape)
        config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
        return transformers.AutoModel.from_config(config)
    where = resolve_pretrained(name)
    with loading_pretrained(name, "pretrained encoder"):
        config = transformers.AutoConfig.from_pretrained(where, trust_remote_code=False)  # a model's own code never runs
        model_class = auto_model_class(config)
        accepts_pooler = "add_pooling_layer" in inspect.signature(model_class.__init__).parameters
        # float32 master weights whatever the hub stored (transformers loads fp16/bf16 files as they are, and
        # a half-precision encoder beside a float32 strategy fails or trains in half precision); mixed
        # precision is the trainer's `precision`, which casts inside autocast and keeps these in float32.
        return model_class.from_pretrained(where, config=config, dtype=torch.float32,
                                           **({"add_pooling_layer": pooler} if accepts_pooler else {}))


def _remove_word_embeddings(model: nn.Module) -> Tensor:
    """Take the input embedding table out of ``model`` (the strategy owns it); returns its weight.

    CANINE's are its hash tables (``HashBucketCodepointEmbedder_k``), returned side by side.
    """
    if model.config.model_type == "canine":
        embeddings = model.char_embeddings
        names = [f"HashBucketCodepointEmbedder_{k}" for k in range(model.config.num_hash_functions)]
        weight = torch.cat([getattr(embeddings, name).weight.detach() for name in names], dim=1)
        for name in names:
            delattr(embeddings, name)
        return weight
    weight = model.get_input_embeddings().weight.detach().clone()
    del model.embeddings.word_embeddings
    model.embeddings.word_embeddings = None
    return weight


def count_parameters(module: nn.Module) -> int:
    """Distinct parameters (tied tensors counted once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())

