"""The exported model: lit-embed's strategy feeding the HuggingFace encoder, as ``transformers`` models.

``lit-embed export`` writes this after the strategy's own source in one ``modeling_lit_embed.py`` (see
:mod:`lit_embed.export.vendor`), so the strategy classes are this module's globals there. The computation is
lit-embed's: codes -> strategy -> ``inputs_embeds`` of the encoder, whose word-embedding table is removed.
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

from .configuration_lit_embed import LitEmbedConfig

#: The classes ``config.json`` may name: ``lit-embed export`` sets them after this code (those of its strategy).
DECLARED_CLASSES: frozenset[str] = frozenset()


def build_object(config: dict):
    """The object a ``{"class_path", "init_args"}`` config describes: a class this export declares
    (:data:`DECLARED_CLASSES`) given plain data, nothing else (loading the model runs this code, and ``config.json``
    is a file anyone may have edited); a factory (``functools.partial``) where the config leaves required
    arguments to its owner (a hasher's outputs)."""
    path = config.get("class_path") if isinstance(config, dict) else None
    if path not in DECLARED_CLASSES:
        raise ValueError(f"config.json names {path!r}, which this export does not build (it declares "
                         f"{sorted(DECLARED_CLASSES)}): the file was edited; export the checkpoint again")
    cls = globals()[path.rpartition(".")[2]]
    args = {}
    for key, value in (config.get("init_args") or {}).items():
        if isinstance(value, dict) and "class_path" in value:
            args[key] = build_object(value)
        elif _plain_data(value):
            args[key] = value
        else:
            raise ValueError(f"config.json gives {path} {key}={value!r}, which is not plain data: export the checkpoint again")
    required = [p.name for p in inspect.signature(cls).parameters.values()
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return functools.partial(cls, **args) if set(required) - set(args) else cls(**args)


def _plain_data(value) -> bool:
    """Whether ``value`` is numbers, strings, booleans and None, in lists and string-keyed dicts (no class config)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, list):
        return all(_plain_data(item) for item in value)
    return isinstance(value, dict) and "class_path" not in value and all(
        isinstance(key, str) and _plain_data(item) for key, item in value.items())


class LitEmbedPreTrainedModel(PreTrainedModel):
    config_class = LitEmbedConfig
    base_model_prefix = "lit_embed"
    _no_split_modules: list[str] = []

    def _init_weights(self, module: nn.Module) -> None:
        """Every weight comes from the export; what it does not hold (a strategy's non-persistent buffers,
        computed from its config) is computed again: transformers builds the model without data."""
        strategy = getattr(self, "embedding", None)
        buffers = [name for name, _ in module.named_buffers(recurse=False)]
        if strategy is None or not buffers:
            return
        saved = set(module.state_dict(keep_vars=True))
        transient = [name for name in buffers if name not in saved]  # the non-persistent ones
        if not transient:
            return
        path = next((name for name, part in strategy.named_modules() if part is module), None)
        if path is None:
            return  # the backbone's are its own to compute
        with torch.device("cpu"):
            fresh = build_object(self.config.strategy).get_submodule(path)
        for name in transient:
            module.register_buffer(name, getattr(fresh, name).clone(), persistent=False)


class LitEmbedModel(LitEmbedPreTrainedModel):
    """The strategy (``embedding``) and the encoder (``backbone``); ``input_ids`` are the strategy's codes:
    tokenizer ids, or for hash strategies the codes of :meth:`encode_texts`."""

    def __init__(self, config: LitEmbedConfig) -> None:
        super().__init__(config)
        with torch.device("cpu"):  # not transformers' meta device: strategies compute state when built
            self.embedding = build_object(config.strategy)
        for path, shape in config.sized_buffers.items():  # take the shape the weights have
            owner, _, name = path.rpartition(".")
            module = self.embedding.get_submodule(owner) if owner else self.embedding
            current = getattr(module, name)
            setattr(module, name, torch.empty(shape, dtype=current.dtype))
        self.embedding.mark_prepared()  # subspace codes come with the weights
        backbone = dict(config.backbone)
        encoder_config = AutoConfig.for_model(backbone.pop("model_type"), **backbone)
        self.backbone = AutoModel.from_config(encoder_config, add_pooling_layer=config.pooler)
        del self.backbone.embeddings.word_embeddings  # the strategy replaces it
        self.backbone.embeddings.word_embeddings = None
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embedding

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, **kwargs):
        extra = {}
        if token_type_ids is not None and getattr(self.backbone.config, "type_vocab_size", 0) > 1:
            extra["token_type_ids"] = token_type_ids
        return self.backbone(inputs_embeds=self.embedding(input_ids), attention_mask=attention_mask, **extra, **kwargs)

    def encode_texts(self, texts: list[str]) -> dict[str, torch.Tensor]:
        """``input_ids`` (the codes, with the start and end codes, padded) and ``attention_mask`` of ``texts``
        for a hash strategy, whose codes come from hashing words (no tokenizer file)."""
        encoder = self.embedding.text_encoder(None)
        special = {name: torch.as_tensor(encoder.special_code(name)) for name in ("cls", "sep", "pad")}
        rows = [torch.cat([special["cls"][None], torch.as_tensor(codes).reshape(-1, *special["cls"].shape),
                           special["sep"][None]]) for codes in encoder.encode(list(texts))]
        longest = max(len(row) for row in rows)
        ids = special["pad"].expand(len(rows), longest, *special["pad"].shape).clone()
        mask = torch.zeros(len(rows), longest, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)], mask[i, : len(row)] = row, 1
        return {"input_ids": ids, "attention_mask": mask}


class LitEmbedForSequenceClassification(LitEmbedPreTrainedModel):
    """A fine-tuned lit-embed classifier: the pooler (or a dense+tanh layer) then a linear layer of the labels."""

    def __init__(self, config: LitEmbedConfig) -> None:
        super().__init__(config)
        self.lit_embed = LitEmbedModel(config)
        hidden = config.backbone["hidden_size"]
        head = config.classifier or {}
        dropout = head.get("dropout", 0.1)  # lit-embed's, for fine-tuning further
        self.pre_classifier = (nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, hidden), nn.Tanh())
                               if head.get("pre_classifier") else None)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, config.num_labels))
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None, **kwargs):
        out = self.lit_embed(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, **kwargs)
        features = out.pooler_output if self.pre_classifier is None else self.pre_classifier(out.last_hidden_state[:, 0])
        logits = self.classifier(features)
        loss = None
        if labels is not None:
            loss = (nn.functional.mse_loss(logits.squeeze(-1), labels.float()) if (self.config.classifier or {}).get("regression")
                    else nn.functional.cross_entropy(logits, labels))
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)
