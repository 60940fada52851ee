"""The config of an exported lit-embed model (copied into the export as ``configuration_lit_embed.py``).

It needs only ``transformers``: ``backbone`` is the HuggingFace encoder's config (a dict with its
``model_type``), ``strategy`` the embedding strategy's ``{"class_path", "init_args"}`` with both sizes, and
``classifier`` the head of a fine-tuned classifier (``None`` for a pre-trained model).
"""

from __future__ import annotations

from transformers import PretrainedConfig


class LitEmbedConfig(PretrainedConfig):
    model_type = "lit_embed"

    def __init__(self, backbone: dict | None = None, strategy: dict | None = None, pooler: bool = True,
                 classifier: dict | None = None, sized_buffers: dict | None = None, **kwargs) -> None:
        self.backbone = backbone or {}
        self.strategy = strategy or {}
        self.pooler = pooler
        #: ``{"pre_classifier": bool, "regression": bool}`` for a fine-tuned classifier.
        self.classifier = classifier
        #: Shapes of the strategy's buffers that only its weights know (a grown vocabulary, LSH n-grams).
        self.sized_buffers = sized_buffers or {}
        super().__init__(**kwargs)
